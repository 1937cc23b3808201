package translate

import (
	"encoding/json"
	"fmt"
	"strings"
)

// DefaultMaxTokens is the max_tokens an Anthropic backend gets when an
// OpenAI client sets none (Anthropic requires the field).
const DefaultMaxTokens = 4096

type object = map[string]json.RawMessage

func decodeObject(raw []byte, field string) (object, error) {
	var m object
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return nil, fieldErr(field, "not a JSON object")
	}
	return m, nil
}

func str(raw json.RawMessage) (string, bool) {
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || string(raw) == "null"
}

// AnthropicToOpenAIRequest turns a Messages request into a Chat
// Completions request and says whether it asks for a stream.
func AnthropicToOpenAIRequest(body []byte) (out []byte, stream bool, err error) {
	in, err := decodeObject(body, "body")
	if err != nil {
		return nil, false, err
	}
	o := map[string]any{}
	var msgs []any
	for k, v := range in {
		switch k {
		case "model", "max_tokens", "temperature", "top_p":
			o[k] = v
		case "stop_sequences":
			if !isNull(v) {
				o["stop"] = v
			}
		case "stream":
			_ = json.Unmarshal(v, &stream)
		case "metadata":
			var md struct {
				UserID string `json:"user_id"`
			}
			if json.Unmarshal(v, &md) == nil && md.UserID != "" {
				o["user"] = md.UserID
			}
		case "system", "messages", "tools", "tool_choice":
			// Handled below, in an order that puts the system prompt first.
		case "top_k", "thinking", "service_tier", "context_management":
			// Sampling and server-side hints with no Chat Completions
			// counterpart; the answer is still a valid answer without them.
		default:
			return nil, false, fieldErr(k, "no OpenAI Chat Completions counterpart")
		}
	}
	if v, ok := in["system"]; ok && !isNull(v) {
		text, err := anthropicText(v, "system")
		if err != nil {
			return nil, false, err
		}
		msgs = append(msgs, map[string]any{"role": "system", "content": text})
	}
	var am []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(in["messages"], &am); err != nil {
		return nil, false, fieldErr("messages", "must be an array of {role, content}")
	}
	for i, m := range am {
		conv, err := anthropicMessageToOpenAI(m.Role, m.Content, fmt.Sprintf("messages[%d]", i))
		if err != nil {
			return nil, false, err
		}
		msgs = append(msgs, conv...)
	}
	o["messages"] = msgs
	if v, ok := in["tools"]; ok && !isNull(v) {
		var tools []struct {
			Type        string          `json:"type"`
			Name        string          `json:"name"`
			Description string          `json:"description"`
			InputSchema json.RawMessage `json:"input_schema"`
		}
		if err := json.Unmarshal(v, &tools); err != nil {
			return nil, false, fieldErr("tools", "must be an array of tool definitions")
		}
		var ot []any
		for i, t := range tools {
			if t.Type != "" && t.Type != "custom" {
				return nil, false, fieldErr(fmt.Sprintf("tools[%d].type", i), "server tool %q runs only on Anthropic's servers", t.Type)
			}
			fn := map[string]any{"name": t.Name}
			if t.Description != "" {
				fn["description"] = t.Description
			}
			if !isNull(t.InputSchema) {
				fn["parameters"] = t.InputSchema
			}
			ot = append(ot, map[string]any{"type": "function", "function": fn})
		}
		o["tools"] = ot
	}
	if v, ok := in["tool_choice"]; ok && !isNull(v) {
		var tc struct {
			Type                   string `json:"type"`
			Name                   string `json:"name"`
			DisableParallelToolUse bool   `json:"disable_parallel_tool_use"`
		}
		if err := json.Unmarshal(v, &tc); err != nil {
			return nil, false, fieldErr("tool_choice", "must be an object with a type")
		}
		switch tc.Type {
		case "auto":
			o["tool_choice"] = "auto"
		case "any":
			o["tool_choice"] = "required"
		case "none":
			o["tool_choice"] = "none"
		case "tool":
			o["tool_choice"] = map[string]any{"type": "function", "function": map[string]any{"name": tc.Name}}
		default:
			return nil, false, fieldErr("tool_choice.type", "unknown type %q", tc.Type)
		}
		if tc.DisableParallelToolUse {
			o["parallel_tool_calls"] = false
		}
	}
	if stream {
		o["stream"] = true
		o["stream_options"] = map[string]any{"include_usage": true}
	}
	out, err = json.Marshal(o)
	return out, stream, err
}

// anthropicText reads a string or an array of text blocks.
func anthropicText(raw json.RawMessage, field string) (string, error) {
	if s, ok := str(raw); ok {
		return s, nil
	}
	var blocks []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return "", fieldErr(field, "must be a string or an array of text blocks")
	}
	parts := make([]string, 0, len(blocks))
	for i, b := range blocks {
		if b.Type != "text" {
			return "", fieldErr(fmt.Sprintf("%s[%d].type", field, i), "only text blocks can be translated here, not %q", b.Type)
		}
		parts = append(parts, b.Text)
	}
	return strings.Join(parts, "\n\n"), nil
}

type anthropicBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
	Source    *struct {
		Type      string `json:"type"`
		MediaType string `json:"media_type"`
		Data      string `json:"data"`
		URL       string `json:"url"`
	} `json:"source"`
}

func anthropicMessageToOpenAI(role string, content json.RawMessage, field string) ([]any, error) {
	if role != "user" && role != "assistant" {
		return nil, fieldErr(field+".role", "must be user or assistant, not %q", role)
	}
	if s, ok := str(content); ok {
		return []any{map[string]any{"role": role, "content": s}}, nil
	}
	var blocks []anthropicBlock
	if err := json.Unmarshal(content, &blocks); err != nil {
		return nil, fieldErr(field+".content", "must be a string or an array of content blocks")
	}
	var out, parts, toolCalls []any
	var texts []string
	images := false
	for j, b := range blocks {
		bf := fmt.Sprintf("%s.content[%d]", field, j)
		switch b.Type {
		case "text":
			texts = append(texts, b.Text)
			parts = append(parts, map[string]any{"type": "text", "text": b.Text})
		case "image":
			if role != "user" || b.Source == nil {
				return nil, fieldErr(bf, "an image is translated only in a user message with a source")
			}
			url := b.Source.URL
			if b.Source.Type == "base64" {
				url = "data:" + b.Source.MediaType + ";base64," + b.Source.Data
			} else if b.Source.Type != "url" {
				return nil, fieldErr(bf+".source.type", "unknown image source %q", b.Source.Type)
			}
			images = true
			parts = append(parts, map[string]any{"type": "image_url", "image_url": map[string]any{"url": url}})
		case "tool_use":
			if role != "assistant" {
				return nil, fieldErr(bf, "tool_use belongs in an assistant message")
			}
			args := "{}"
			if !isNull(b.Input) {
				args = string(b.Input)
			}
			toolCalls = append(toolCalls, map[string]any{"id": b.ID, "type": "function",
				"function": map[string]any{"name": b.Name, "arguments": args}})
		case "tool_result":
			if role != "user" {
				return nil, fieldErr(bf, "tool_result belongs in a user message")
			}
			text := ""
			if !isNull(b.Content) {
				t, err := anthropicText(b.Content, bf+".content")
				if err != nil {
					return nil, err
				}
				text = t
			}
			// A tool message must follow the assistant's tool call directly,
			// so tool results go before any text of the same user turn.
			out = append(out, map[string]any{"role": "tool", "tool_call_id": b.ToolUseID, "content": text})
		case "thinking", "redacted_thinking":
			// The model's earlier reasoning; an OpenAI backend has no field
			// to take it back and answers correctly without it.
		default:
			return nil, fieldErr(bf+".type", "content block %q has no Chat Completions counterpart", b.Type)
		}
	}
	if role == "assistant" {
		if len(texts) == 0 && len(toolCalls) == 0 {
			return out, nil
		}
		m := map[string]any{"role": "assistant", "content": nil}
		if len(texts) > 0 {
			m["content"] = strings.Join(texts, "")
		}
		if len(toolCalls) > 0 {
			m["tool_calls"] = toolCalls
		}
		return append(out, m), nil
	}
	switch {
	case images:
		out = append(out, map[string]any{"role": "user", "content": parts})
	case len(texts) > 0:
		out = append(out, map[string]any{"role": "user", "content": strings.Join(texts, "\n\n")})
	}
	return out, nil
}

// OpenAIToAnthropicRequest turns a Chat Completions request into a
// Messages request; it says whether a stream was asked for and whether
// the client wants the usage chunk at its end.
func OpenAIToAnthropicRequest(body []byte) (out []byte, stream, includeUsage bool, err error) {
	in, err := decodeObject(body, "body")
	if err != nil {
		return nil, false, false, err
	}
	o := map[string]any{}
	parallel := true
	for k, v := range in {
		switch k {
		case "model", "temperature", "top_p":
			o[k] = v
		case "max_tokens", "max_completion_tokens":
			if !isNull(v) {
				o["max_tokens"] = v
			}
		case "stop":
			if isNull(v) {
				continue
			}
			if s, ok := str(v); ok {
				o["stop_sequences"] = []string{s}
			} else {
				o["stop_sequences"] = v
			}
		case "stream":
			_ = json.Unmarshal(v, &stream)
		case "stream_options":
			var so struct {
				IncludeUsage bool `json:"include_usage"`
			}
			_ = json.Unmarshal(v, &so)
			includeUsage = so.IncludeUsage
		case "user":
			if s, ok := str(v); ok && s != "" {
				o["metadata"] = map[string]any{"user_id": s}
			}
		case "parallel_tool_calls":
			_ = json.Unmarshal(v, &parallel)
		case "messages", "tools", "tool_choice":
		case "n":
			var n int
			if json.Unmarshal(v, &n) == nil && n > 1 {
				return nil, false, false, fieldErr("n", "Anthropic returns one choice per request")
			}
		case "logprobs":
			var b bool
			if json.Unmarshal(v, &b) == nil && b {
				return nil, false, false, fieldErr("logprobs", "Anthropic does not return log probabilities")
			}
		case "response_format":
			var rf struct {
				Type string `json:"type"`
			}
			if json.Unmarshal(v, &rf) == nil && rf.Type != "" && rf.Type != "text" {
				return nil, false, false, fieldErr("response_format", "type %q has no Messages counterpart", rf.Type)
			}
		case "seed", "store", "metadata", "service_tier", "reasoning_effort", "frequency_penalty", "presence_penalty":
			// Hints without a Messages counterpart; the answer is still valid.
		default:
			return nil, false, false, fieldErr(k, "no Anthropic Messages counterpart")
		}
	}
	if _, ok := o["max_tokens"]; !ok {
		o["max_tokens"] = DefaultMaxTokens
	}
	var om []struct {
		Role       string          `json:"role"`
		Content    json.RawMessage `json:"content"`
		ToolCallID string          `json:"tool_call_id"`
		ToolCalls  []struct {
			ID       string `json:"id"`
			Type     string `json:"type"`
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	}
	if err := json.Unmarshal(in["messages"], &om); err != nil {
		return nil, false, false, fieldErr("messages", "must be an array of messages")
	}
	var system []string
	type msg struct {
		Role    string `json:"role"`
		Content []any  `json:"content"`
	}
	var msgs []*msg
	add := func(role string, blocks ...any) {
		if len(blocks) == 0 {
			return
		}
		// Anthropic wants user and assistant turns to alternate; OpenAI
		// has separate tool messages, which become blocks of one turn.
		if n := len(msgs); n > 0 && msgs[n-1].Role == role {
			msgs[n-1].Content = append(msgs[n-1].Content, blocks...)
			return
		}
		msgs = append(msgs, &msg{Role: role, Content: blocks})
	}
	for i, m := range om {
		f := fmt.Sprintf("messages[%d]", i)
		switch m.Role {
		case "system", "developer":
			t, err := openAIText(m.Content, f+".content")
			if err != nil {
				return nil, false, false, err
			}
			system = append(system, t)
		case "user":
			blocks, err := openAIUserBlocks(m.Content, f+".content")
			if err != nil {
				return nil, false, false, err
			}
			add("user", blocks...)
		case "assistant":
			var blocks []any
			if !isNull(m.Content) {
				t, err := openAIText(m.Content, f+".content")
				if err != nil {
					return nil, false, false, err
				}
				if t != "" {
					blocks = append(blocks, map[string]any{"type": "text", "text": t})
				}
			}
			for j, tc := range m.ToolCalls {
				input := json.RawMessage(tc.Function.Arguments)
				if strings.TrimSpace(tc.Function.Arguments) == "" {
					input = json.RawMessage("{}")
				}
				var probe map[string]any
				if json.Unmarshal(input, &probe) != nil {
					return nil, false, false, fieldErr(fmt.Sprintf("%s.tool_calls[%d].function.arguments", f, j), "not a JSON object")
				}
				blocks = append(blocks, map[string]any{"type": "tool_use", "id": tc.ID, "name": tc.Function.Name, "input": input})
			}
			add("assistant", blocks...)
		case "tool":
			t, err := openAIText(m.Content, f+".content")
			if err != nil {
				return nil, false, false, err
			}
			add("user", map[string]any{"type": "tool_result", "tool_use_id": m.ToolCallID, "content": t})
		default:
			return nil, false, false, fieldErr(f+".role", "role %q has no Messages counterpart", m.Role)
		}
	}
	if len(system) > 0 {
		o["system"] = strings.Join(system, "\n\n")
	}
	o["messages"] = msgs
	if v, ok := in["tools"]; ok && !isNull(v) {
		var tools []struct {
			Type     string `json:"type"`
			Function struct {
				Name        string          `json:"name"`
				Description string          `json:"description"`
				Parameters  json.RawMessage `json:"parameters"`
			} `json:"function"`
		}
		if err := json.Unmarshal(v, &tools); err != nil {
			return nil, false, false, fieldErr("tools", "must be an array of tool definitions")
		}
		var at []any
		for i, t := range tools {
			if t.Type != "function" {
				return nil, false, false, fieldErr(fmt.Sprintf("tools[%d].type", i), "only function tools can be translated, not %q", t.Type)
			}
			schema := t.Function.Parameters
			if isNull(schema) {
				schema = json.RawMessage(`{"type":"object","properties":{}}`)
			}
			tool := map[string]any{"name": t.Function.Name, "input_schema": schema}
			if t.Function.Description != "" {
				tool["description"] = t.Function.Description
			}
			at = append(at, tool)
		}
		o["tools"] = at
	}
	var tc map[string]any
	if v, ok := in["tool_choice"]; ok && !isNull(v) {
		if s, ok := str(v); ok {
			switch s {
			case "auto":
				tc = map[string]any{"type": "auto"}
			case "required":
				tc = map[string]any{"type": "any"}
			case "none":
				tc = map[string]any{"type": "none"}
			default:
				return nil, false, false, fieldErr("tool_choice", "unknown value %q", s)
			}
		} else {
			var fc struct {
				Function struct {
					Name string `json:"name"`
				} `json:"function"`
			}
			if err := json.Unmarshal(v, &fc); err != nil || fc.Function.Name == "" {
				return nil, false, false, fieldErr("tool_choice", "must be auto, required, none or {type: function, function: {name}}")
			}
			tc = map[string]any{"type": "tool", "name": fc.Function.Name}
		}
	}
	if !parallel {
		if tc == nil {
			tc = map[string]any{"type": "auto"}
		}
		if tc["type"] != "none" {
			tc["disable_parallel_tool_use"] = true
		}
	}
	if tc != nil {
		o["tool_choice"] = tc
	}
	if stream {
		o["stream"] = true
	}
	out, err = json.Marshal(o)
	return out, stream, includeUsage, err
}

type openAIPart struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	Refusal  string `json:"refusal"`
	ImageURL *struct {
		URL string `json:"url"`
	} `json:"image_url"`
}

// openAIText reads a string or an array of text (or refusal) parts.
func openAIText(raw json.RawMessage, field string) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	if s, ok := str(raw); ok {
		return s, nil
	}
	var parts []openAIPart
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", fieldErr(field, "must be a string or an array of content parts")
	}
	var texts []string
	for i, p := range parts {
		switch p.Type {
		case "text":
			texts = append(texts, p.Text)
		case "refusal":
			texts = append(texts, p.Refusal)
		default:
			return "", fieldErr(fmt.Sprintf("%s[%d].type", field, i), "only text parts can be translated here, not %q", p.Type)
		}
	}
	return strings.Join(texts, "\n\n"), nil
}

func openAIUserBlocks(raw json.RawMessage, field string) ([]any, error) {
	if s, ok := str(raw); ok {
		return []any{map[string]any{"type": "text", "text": s}}, nil
	}
	var parts []openAIPart
	if err := json.Unmarshal(raw, &parts); err != nil {
		return nil, fieldErr(field, "must be a string or an array of content parts")
	}
	var blocks []any
	for i, p := range parts {
		pf := fmt.Sprintf("%s[%d]", field, i)
		switch p.Type {
		case "text":
			blocks = append(blocks, map[string]any{"type": "text", "text": p.Text})
		case "image_url":
			if p.ImageURL == nil {
				return nil, fieldErr(pf+".image_url", "missing")
			}
			u := p.ImageURL.URL
			if rest, ok := strings.CutPrefix(u, "data:"); ok {
				meta, data, ok := strings.Cut(rest, ",")
				media, isB64 := strings.CutSuffix(meta, ";base64")
				if !ok || !isB64 {
					return nil, fieldErr(pf+".image_url.url", "a data URL must be base64")
				}
				blocks = append(blocks, map[string]any{"type": "image",
					"source": map[string]any{"type": "base64", "media_type": media, "data": data}})
			} else {
				blocks = append(blocks, map[string]any{"type": "image", "source": map[string]any{"type": "url", "url": u}})
			}
		default:
			return nil, fieldErr(pf+".type", "content part %q has no Messages counterpart", p.Type)
		}
	}
	return blocks, nil
}
