package translate

import (
	"bytes"
	"encoding/json"
	"strings"
	"time"
)

// Stream converts a backend's event stream into the client's protocol one
// event at a time, so each translated event can be flushed as soon as its
// source arrives.
type Stream interface {
	// Event converts one backend event into zero or more client events;
	// the bytes are valid until the next call.
	Event(ev Event) ([]byte, error)
	// End finishes the client stream; cut says the backend stopped before
	// its stream was complete, which the client must see as an error.
	End(cut bool) []byte
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		// Only maps of strings, numbers and raw JSON reach here.
		panic("translate: marshal: " + err.Error())
	}
	return b
}

// openAIToAnthropic turns Chat Completions chunks into Messages events.
type openAIToAnthropic struct {
	started   bool
	done      bool
	failed    bool
	block     int    // index of the open content block, -1 if none
	blockKind string // "text" or "tool"
	next      int    // index the next block gets
	toolIdx   int    // OpenAI index of the open tool call
	stop      string
	usage     anthropicUsage
	buf       bytes.Buffer
}

// NewOpenAIToAnthropicStream returns a Stream for an Anthropic client
// served by an OpenAI backend.
func NewOpenAIToAnthropicStream() Stream {
	return &openAIToAnthropic{block: -1, toolIdx: -1}
}

func (s *openAIToAnthropic) emit(name string, v any) {
	s.buf.Write(formatEvent(name, mustJSON(v)))
}

func (s *openAIToAnthropic) start(id, model string) {
	if s.started {
		return
	}
	s.started = true
	s.emit("message_start", map[string]any{"type": "message_start", "message": map[string]any{
		"id": "msg_" + strings.TrimPrefix(id, "chatcmpl-"), "type": "message", "role": "assistant", "model": model,
		"content": []any{}, "stop_reason": nil, "stop_sequence": nil,
		"usage": map[string]any{"input_tokens": 0, "output_tokens": 0}}})
}

func (s *openAIToAnthropic) closeBlock() {
	if s.block >= 0 {
		s.emit("content_block_stop", map[string]any{"type": "content_block_stop", "index": s.block})
		s.block = -1
	}
}

func (s *openAIToAnthropic) Event(ev Event) ([]byte, error) {
	s.buf.Reset()
	data := bytes.TrimSpace(ev.Data)
	if len(data) == 0 {
		return nil, nil
	}
	if string(data) == "[DONE]" {
		s.done = true
		return nil, nil
	}
	var c struct {
		ID      string `json:"id"`
		Model   string `json:"model"`
		Choices []struct {
			Delta struct {
				Content   *string          `json:"content"`
				ToolCalls []openAIToolCall `json:"tool_calls"`
			} `json:"delta"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
		Usage *openAIUsage `json:"usage"`
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, backendErr("chat completion chunk: %v", err)
	}
	if c.Error != nil {
		s.emit("error", map[string]any{"type": "error", "error": map[string]any{"type": "api_error", "message": c.Error.Message}})
		s.failed = true
		return s.buf.Bytes(), nil
	}
	s.start(c.ID, c.Model)
	if c.Usage != nil {
		s.usage.InputTokens, s.usage.OutputTokens = c.Usage.PromptTokens, c.Usage.CompletionTokens
	}
	for _, ch := range c.Choices {
		if t := ch.Delta.Content; t != nil && *t != "" {
			if s.blockKind != "text" || s.block < 0 {
				s.closeBlock()
				s.block, s.blockKind = s.next, "text"
				s.next++
				s.emit("content_block_start", map[string]any{"type": "content_block_start", "index": s.block,
					"content_block": map[string]any{"type": "text", "text": ""}})
			}
			s.emit("content_block_delta", map[string]any{"type": "content_block_delta", "index": s.block,
				"delta": map[string]any{"type": "text_delta", "text": *t}})
		}
		for _, tc := range ch.Delta.ToolCalls {
			if s.blockKind != "tool" || s.block < 0 || tc.Index != s.toolIdx {
				s.closeBlock()
				s.block, s.blockKind, s.toolIdx = s.next, "tool", tc.Index
				s.next++
				s.emit("content_block_start", map[string]any{"type": "content_block_start", "index": s.block,
					"content_block": map[string]any{"type": "tool_use", "id": tc.ID, "name": tc.Function.Name, "input": map[string]any{}}})
			}
			if tc.Function.Arguments != "" {
				s.emit("content_block_delta", map[string]any{"type": "content_block_delta", "index": s.block,
					"delta": map[string]any{"type": "input_json_delta", "partial_json": tc.Function.Arguments}})
			}
		}
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			s.stop = stopOpenAIToAnthropic(*ch.FinishReason)
		}
	}
	return s.buf.Bytes(), nil
}

func (s *openAIToAnthropic) End(cut bool) []byte {
	s.buf.Reset()
	if s.failed {
		return nil
	}
	if cut || (!s.done && s.stop == "") {
		s.emit("error", map[string]any{"type": "error", "error": map[string]any{"type": "api_error",
			"message": "the model backend ended the stream early"}})
		return s.buf.Bytes()
	}
	s.start("", "")
	s.closeBlock()
	if s.stop == "" {
		s.stop = "end_turn"
	}
	s.emit("message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": s.stop, "stop_sequence": nil},
		"usage": map[string]any{"input_tokens": s.usage.InputTokens, "output_tokens": s.usage.OutputTokens}})
	s.emit("message_stop", map[string]any{"type": "message_stop"})
	return s.buf.Bytes()
}

// anthropicToOpenAI turns Messages events into Chat Completions chunks.
type anthropicToOpenAI struct {
	includeUsage bool
	id, model    string
	created      int64
	toolIdx      map[int]int // Anthropic block index -> OpenAI tool call index
	stopped      bool
	failed       bool
	usage        anthropicUsage
	buf          bytes.Buffer
}

// NewAnthropicToOpenAIStream returns a Stream for an OpenAI client served
// by an Anthropic backend; includeUsage is the client's
// stream_options.include_usage.
func NewAnthropicToOpenAIStream(includeUsage bool) Stream {
	return &anthropicToOpenAI{includeUsage: includeUsage, toolIdx: map[int]int{}, created: time.Now().Unix()}
}

func (s *anthropicToOpenAI) chunk(delta map[string]any, finish any) {
	s.buf.Write(formatEvent("", mustJSON(map[string]any{"id": s.id, "object": "chat.completion.chunk",
		"created": s.created, "model": s.model,
		"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}}})))
}

func (s *anthropicToOpenAI) Event(ev Event) ([]byte, error) {
	s.buf.Reset()
	if len(bytes.TrimSpace(ev.Data)) == 0 {
		return nil, nil
	}
	var e struct {
		Type    string `json:"type"`
		Index   int    `json:"index"`
		Message struct {
			ID    string         `json:"id"`
			Model string         `json:"model"`
			Usage anthropicUsage `json:"usage"`
		} `json:"message"`
		ContentBlock anthropicBlock `json:"content_block"`
		Delta        struct {
			Type        string `json:"type"`
			Text        string `json:"text"`
			PartialJSON string `json:"partial_json"`
			StopReason  string `json:"stop_reason"`
		} `json:"delta"`
		Usage *anthropicUsage `json:"usage"`
		Error *struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(ev.Data, &e); err != nil {
		return nil, backendErr("message event: %v", err)
	}
	switch e.Type {
	case "message_start":
		s.id = "chatcmpl-" + strings.TrimPrefix(e.Message.ID, "msg_")
		s.model = e.Message.Model
		u := e.Message.Usage
		s.usage.InputTokens = u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens
		s.usage.OutputTokens = u.OutputTokens
		s.chunk(map[string]any{"role": "assistant", "content": ""}, nil)
	case "content_block_start":
		if e.ContentBlock.Type == "tool_use" {
			i := len(s.toolIdx)
			s.toolIdx[e.Index] = i
			s.chunk(map[string]any{"tool_calls": []any{map[string]any{"index": i, "id": e.ContentBlock.ID, "type": "function",
				"function": map[string]any{"name": e.ContentBlock.Name, "arguments": ""}}}}, nil)
		} else if e.ContentBlock.Type == "text" && e.ContentBlock.Text != "" {
			s.chunk(map[string]any{"content": e.ContentBlock.Text}, nil)
		}
	case "content_block_delta":
		switch e.Delta.Type {
		case "text_delta":
			s.chunk(map[string]any{"content": e.Delta.Text}, nil)
		case "input_json_delta":
			if i, ok := s.toolIdx[e.Index]; ok && e.Delta.PartialJSON != "" {
				s.chunk(map[string]any{"tool_calls": []any{map[string]any{"index": i,
					"function": map[string]any{"arguments": e.Delta.PartialJSON}}}}, nil)
			}
		}
	case "message_delta":
		if e.Usage != nil {
			s.usage.OutputTokens = e.Usage.OutputTokens
			if in := e.Usage.InputTokens + e.Usage.CacheCreationInputTokens + e.Usage.CacheReadInputTokens; in > 0 {
				s.usage.InputTokens = in
			}
		}
		if e.Delta.StopReason != "" {
			s.stopped = true
			s.chunk(map[string]any{}, stopAnthropicToOpenAI(e.Delta.StopReason))
		}
	case "error":
		msg := "the model backend reported an error"
		if e.Error != nil {
			msg = e.Error.Message
		}
		s.buf.Write(formatEvent("", mustJSON(map[string]any{"error": map[string]any{"type": "api_error", "message": msg}})))
		s.failed = true
	}
	return s.buf.Bytes(), nil
}

func (s *anthropicToOpenAI) End(cut bool) []byte {
	s.buf.Reset()
	if s.failed {
		return nil
	}
	if cut || !s.stopped {
		s.buf.Write(formatEvent("", mustJSON(map[string]any{"error": map[string]any{"type": "api_error",
			"message": "the model backend ended the stream early"}})))
		return s.buf.Bytes()
	}
	if s.includeUsage {
		s.buf.Write(formatEvent("", mustJSON(map[string]any{"id": s.id, "object": "chat.completion.chunk",
			"created": s.created, "model": s.model, "choices": []any{},
			"usage": map[string]any{"prompt_tokens": s.usage.InputTokens, "completion_tokens": s.usage.OutputTokens,
				"total_tokens": s.usage.InputTokens + s.usage.OutputTokens}})))
	}
	s.buf.WriteString("data: [DONE]\n\n")
	return s.buf.Bytes()
}
