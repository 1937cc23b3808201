package inference

import (
	"bytes"
	"encoding/json"
	"strings"
)

// topLevel walks the members of a JSON object body and calls fn with each
// key and the byte span of its value; false means the body is not a JSON
// object. json.Valid runs first, so the walk below only has to find where
// each member ends, not check the grammar.
func topLevel(body []byte, fn func(key string, start, end int)) bool {
	if !json.Valid(body) {
		return false
	}
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return false
	}
	i = skipSpace(body, i+1)
	for i < len(body) && body[i] == '"' {
		kEnd := skipString(body, i)
		key := string(body[i+1 : kEnd-1])
		if bytes.IndexByte(body[i:kEnd], '\\') >= 0 {
			// An escaped key ("mod\u0065l") names the same member to
			// every JSON parser, so it must be found too.
			_ = json.Unmarshal(body[i:kEnd], &key)
		}
		i = skipSpace(body, kEnd) + 1 // past ':'
		vStart := skipSpace(body, i)
		vEnd := skipValue(body, vStart)
		fn(key, vStart, vEnd)
		i = skipSpace(body, vEnd)
		if i < len(body) && body[i] == ',' {
			i = skipSpace(body, i+1)
		}
	}
	return true
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index just past the string starting at b[i].
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return i
}

// skipValue returns the index just past the (valid) value starting at b[i].
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				i = skipString(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
		}
		return i
	default:
		for i < len(b) && !strings.ContainsRune(",}] \t\r\n", rune(b[i])) {
			i++
		}
		return i
	}
}

// modelSpans returns the body's top-level "model" string (the last one,
// as Go's decoder reads it) and the spans of every "model" value.
func modelSpans(body []byte) (model string, spans [][2]int) {
	topLevel(body, func(key string, start, end int) {
		if key == "model" {
			spans = append(spans, [2]int{start, end})
			model = ""
			_ = json.Unmarshal(body[start:end], &model)
		}
	})
	return model, spans
}

// rewriteModel replaces the value of every top-level "model" member and
// leaves every other byte as the client sent it; a body that is not a JSON
// object, or has no model, is returned unchanged.
func rewriteModel(body []byte, spans [][2]int, model string) []byte {
	if len(spans) == 0 {
		return body
	}
	val, _ := json.Marshal(model)
	out := make([]byte, 0, len(body)+len(val))
	prev := 0
	for _, s := range spans {
		out = append(out, body[prev:s[0]]...)
		out = append(out, val...)
		prev = s[1]
	}
	return append(out, body[prev:]...)
}

// usage is what the backend reported spending.
type usage struct{ in, out int64 }

type tokenCounts struct {
	PromptTokens             *int64 `json:"prompt_tokens"`
	CompletionTokens         *int64 `json:"completion_tokens"`
	InputTokens              *int64 `json:"input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
	CacheCreationInputTokens *int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     *int64 `json:"cache_read_input_tokens"`
}

// observe reads usage from an answer or a streamed event in either API's
// shape: OpenAI's usage (chat, completions, embeddings, the final stream
// chunk), Responses' usage and response.completed, Anthropic's message
// usage, message_start and message_delta. Later counts replace earlier
// ones: Anthropic's are cumulative.
func (u *usage) observe(data []byte) {
	var v struct {
		Usage    *tokenCounts `json:"usage"`
		Message  *withUsage   `json:"message"`
		Response *withUsage   `json:"response"`
	}
	if json.Unmarshal(data, &v) != nil {
		return
	}
	for _, t := range []*tokenCounts{v.Usage, msgUsage(v.Message), msgUsage(v.Response)} {
		if t == nil {
			continue
		}
		var in int64
		seenIn := false
		for _, p := range []*int64{t.PromptTokens, t.InputTokens, t.CacheCreationInputTokens, t.CacheReadInputTokens} {
			if p != nil {
				in += *p
				seenIn = true
			}
		}
		if seenIn && in > 0 {
			u.in = in
		}
		if t.CompletionTokens != nil {
			u.out = *t.CompletionTokens
		} else if t.OutputTokens != nil {
			u.out = *t.OutputTokens
		}
	}
}

type withUsage struct {
	Usage *tokenCounts `json:"usage"`
}

func msgUsage(m *withUsage) *tokenCounts {
	if m == nil {
		return nil
	}
	return m.Usage
}
