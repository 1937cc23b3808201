package translate

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// backendErr says the backend's answer is not the protocol it claims to
// speak; the router answers 502 for any error from a response translation.
func backendErr(format string, args ...any) error {
	return fmt.Errorf("backend answer is not valid for its protocol: %s", fmt.Sprintf(format, args...))
}

func stopOpenAIToAnthropic(reason string) string {
	switch reason {
	case "length":
		return "max_tokens"
	case "tool_calls", "function_call":
		return "tool_use"
	case "content_filter":
		return "refusal"
	default:
		return "end_turn"
	}
}

func stopAnthropicToOpenAI(reason string) string {
	switch reason {
	case "max_tokens":
		return "length"
	case "tool_use":
		return "tool_calls"
	case "refusal":
		return "content_filter"
	default:
		return "stop"
	}
}

type openAIUsage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
}

type anthropicUsage struct {
	InputTokens              int64 `json:"input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
}

type openAIToolCall struct {
	Index    int    `json:"index"`
	ID       string `json:"id"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// OpenAIToAnthropicResponse turns a Chat Completions answer into a
// Messages answer.
func OpenAIToAnthropicResponse(body []byte) ([]byte, error) {
	var in struct {
		ID      string `json:"id"`
		Model   string `json:"model"`
		Choices []struct {
			Message struct {
				Content   *string          `json:"content"`
				ToolCalls []openAIToolCall `json:"tool_calls"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage *openAIUsage `json:"usage"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, backendErr("chat completion: %v", err)
	}
	if len(in.Choices) == 0 {
		return nil, backendErr("chat completion has no choices")
	}
	c := in.Choices[0]
	content := []any{}
	if c.Message.Content != nil && *c.Message.Content != "" {
		content = append(content, map[string]any{"type": "text", "text": *c.Message.Content})
	}
	for _, tc := range c.Message.ToolCalls {
		input, err := toolInput(tc.Function.Arguments)
		if err != nil {
			return nil, err
		}
		content = append(content, map[string]any{"type": "tool_use", "id": tc.ID, "name": tc.Function.Name, "input": input})
	}
	u := anthropicUsage{}
	if in.Usage != nil {
		u.InputTokens, u.OutputTokens = in.Usage.PromptTokens, in.Usage.CompletionTokens
	}
	return json.Marshal(map[string]any{
		"id": "msg_" + strings.TrimPrefix(in.ID, "chatcmpl-"), "type": "message", "role": "assistant",
		"model": in.Model, "content": content, "stop_reason": stopOpenAIToAnthropic(c.FinishReason),
		"stop_sequence": nil, "usage": map[string]any{"input_tokens": u.InputTokens, "output_tokens": u.OutputTokens},
	})
}

func toolInput(args string) (json.RawMessage, error) {
	if strings.TrimSpace(args) == "" {
		return json.RawMessage("{}"), nil
	}
	var probe map[string]any
	if json.Unmarshal([]byte(args), &probe) != nil {
		return nil, backendErr("tool call arguments are not a JSON object")
	}
	return json.RawMessage(args), nil
}

// AnthropicToOpenAIResponse turns a Messages answer into a Chat
// Completions answer.
func AnthropicToOpenAIResponse(body []byte) ([]byte, error) {
	var in struct {
		ID         string           `json:"id"`
		Model      string           `json:"model"`
		Content    []anthropicBlock `json:"content"`
		StopReason string           `json:"stop_reason"`
		Usage      anthropicUsage   `json:"usage"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, backendErr("message: %v", err)
	}
	var texts []string
	var calls []any
	for _, b := range in.Content {
		switch b.Type {
		case "text":
			texts = append(texts, b.Text)
		case "tool_use":
			args := "{}"
			if !isNull(b.Input) {
				args = string(b.Input)
			}
			calls = append(calls, map[string]any{"id": b.ID, "type": "function",
				"function": map[string]any{"name": b.Name, "arguments": args}})
		}
	}
	msg := map[string]any{"role": "assistant", "content": nil}
	if len(texts) > 0 {
		msg["content"] = strings.Join(texts, "")
	}
	if len(calls) > 0 {
		msg["tool_calls"] = calls
	}
	in.Usage.InputTokens += in.Usage.CacheCreationInputTokens + in.Usage.CacheReadInputTokens
	return json.Marshal(map[string]any{
		"id": "chatcmpl-" + strings.TrimPrefix(in.ID, "msg_"), "object": "chat.completion",
		"created": time.Now().Unix(), "model": in.Model,
		"choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": stopAnthropicToOpenAI(in.StopReason)}},
		"usage": map[string]any{"prompt_tokens": in.Usage.InputTokens, "completion_tokens": in.Usage.OutputTokens,
			"total_tokens": in.Usage.InputTokens + in.Usage.OutputTokens},
	})
}

// ErrorBody is an error in the shape both SDKs read: OpenAI's
// {"error":{...}} with Anthropic's top-level "type":"error".
func ErrorBody(typ, message string) []byte {
	b, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": message}})
	return b
}

// BackendErrorMessage extracts the message of an error body in either
// protocol's shape, or "" if there is none.
func BackendErrorMessage(body []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil {
		return ""
	}
	return e.Error.Message
}
