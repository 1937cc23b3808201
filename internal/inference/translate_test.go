package inference

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/internal/inference/translate"
	"github.com/corral-sandbox/corral/internal/testutil/fakemodel"
)

const anthropicToolRequest = `{"model":"claude-x","max_tokens":100,"system":[{"type":"text","text":"be brief"}],
 "tools":[{"name":"weather","description":"get weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}],
 "tool_choice":{"type":"auto"},
 "messages":[{"role":"user","content":"weather in Paris?"}]%s}`

const openAIToolRequest = `{"model":"gpt-x","max_tokens":100,
 "tools":[{"type":"function","function":{"name":"weather","description":"get weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],
 "tool_choice":"required",
 "messages":[{"role":"system","content":"be brief"},{"role":"user","content":"weather in Paris?"}]%s}`

func translatingOpenAIRoute(url string) Route {
	r := Route{Name: "local", BaseURL: url + "/v1", Protocols: []string{OpenAIChatCompletions}, Model: "qwen-local",
		APIKey: KeySource{FromEnv: "MODEL_KEY"}, Translate: true}
	return r
}

func translatingAnthropicRoute(url string) Route {
	r := anthropicRoute("claude", url)
	r.Model = "claude-real"
	r.Translate = true
	return r
}

func decode(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("not JSON: %q", s)
	}
	return m
}

// events parses an SSE body into (name, data) pairs.
func events(t *testing.T, body string) []translate.Event {
	t.Helper()
	rd := translate.NewSSEReader(strings.NewReader(body))
	var out []translate.Event
	for {
		ev, err := rd.Next()
		if err != nil {
			return out
		}
		// The reader reuses its buffers from event to event.
		ev.Raw, ev.Data = bytes.Clone(ev.Raw), bytes.Clone(ev.Data)
		out = append(out, ev)
	}
}

func TestAnthropicClientOnOpenAIRoute(t *testing.T) {
	be := fakemodel.New()
	defer be.Close()
	h := newHarness(t, translatingOpenAIRoute(be.URL))
	hdr := map[string]string{"X-Api-Key": Placeholder, "Anthropic-Version": "2023-06-01", "Anthropic-Beta": "x"}

	t.Run("plain", func(t *testing.T) {
		resp := h.do("POST", "/v1/messages?beta=true", `{"model":"claude-x","max_tokens":50,"system":"sys","messages":[{"role":"user","content":"hi"}]}`, hdr)
		if resp.status != 200 {
			t.Fatalf("%d %s", resp.status, resp.body)
		}
		got := be.Last()
		sent := got.JSON()
		if got.Path != "/v1/chat/completions" || got.Query != "" || sent["model"] != "qwen-local" || got.Header.Get("Anthropic-Version") != "" ||
			got.Header.Get("Authorization") != "Bearer "+testKey || got.Header.Get("X-Api-Key") != "" {
			t.Errorf("backend got %s %q %v", got.Path, got.Body, got.Header)
		}
		msgs := sent["messages"].([]any)
		if len(msgs) != 2 || msgs[0].(map[string]any)["role"] != "system" || msgs[0].(map[string]any)["content"] != "sys" {
			t.Errorf("messages %v", msgs)
		}
		m := decode(t, resp.body)
		content := m["content"].([]any)
		if m["type"] != "message" || m["stop_reason"] != "end_turn" || content[0].(map[string]any)["text"] != "tok0 tok1 tok2 " {
			t.Errorf("answer %s", resp.body)
		}
		if u := m["usage"].(map[string]any); u["input_tokens"] != 7.0 || u["output_tokens"] != 3.0 {
			t.Errorf("usage %v", u)
		}
		if rec := h.lastRecord(); rec.Protocol != AnthropicMessages || rec.ClientModel != "claude-x" || rec.RoutedModel != "qwen-local" || rec.OutputTokens != 3 {
			t.Errorf("record %+v", rec)
		}
	})
	t.Run("tools", func(t *testing.T) {
		resp := h.do("POST", "/v1/messages", strings.Replace(anthropicToolRequest, "%s", "", 1), hdr)
		if resp.status != 200 {
			t.Fatalf("%d %s", resp.status, resp.body)
		}
		sent := be.Last().JSON()
		tool := sent["tools"].([]any)[0].(map[string]any)
		if tool["type"] != "function" || tool["function"].(map[string]any)["name"] != "weather" || sent["tool_choice"] != "auto" {
			t.Errorf("tools sent %v %v", sent["tools"], sent["tool_choice"])
		}
		m := decode(t, resp.body)
		block := m["content"].([]any)[0].(map[string]any)
		if m["stop_reason"] != "tool_use" || block["type"] != "tool_use" || block["name"] != "weather" || block["id"] != "call_fake1" ||
			block["input"].(map[string]any)["city"] != "Paris" {
			t.Errorf("answer %s", resp.body)
		}
		// The tool result goes back as an OpenAI tool message.
		follow := `,"messages":[{"role":"user","content":"weather?"},
		 {"role":"assistant","content":[{"type":"text","text":"let me see"},{"type":"tool_use","id":"call_fake1","name":"weather","input":{"city":"Paris"}}]},
		 {"role":"user","content":[{"type":"tool_result","tool_use_id":"call_fake1","content":[{"type":"text","text":"sunny"}]},{"type":"text","text":"thanks"}]}]`
		body := strings.Replace(strings.Replace(anthropicToolRequest, `,
 "messages":[{"role":"user","content":"weather in Paris?"}]%s`, follow, 1), "%s", "", 1)
		resp = h.do("POST", "/v1/messages", body, hdr)
		if resp.status != 200 || decode(t, resp.body)["stop_reason"] != "end_turn" {
			t.Fatalf("%d %s", resp.status, resp.body)
		}
		msgs := be.Last().JSON()["messages"].([]any)
		if len(msgs) != 5 {
			t.Fatalf("messages %v", msgs)
		}
		asst, tool2, user := msgs[2].(map[string]any), msgs[3].(map[string]any), msgs[4].(map[string]any)
		call := asst["tool_calls"].([]any)[0].(map[string]any)
		if asst["content"] != "let me see" || call["id"] != "call_fake1" || call["function"].(map[string]any)["arguments"] != `{"city":"Paris"}` ||
			tool2["role"] != "tool" || tool2["tool_call_id"] != "call_fake1" || tool2["content"] != "sunny" || user["content"] != "thanks" {
			t.Errorf("history %v", msgs)
		}
	})
	t.Run("stream", func(t *testing.T) {
		resp := h.do("POST", "/v1/messages", `{"model":"claude-x","max_tokens":50,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, hdr)
		if resp.status != 200 || resp.header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("%d %s", resp.status, resp.body)
		}
		if so := be.Last().JSON()["stream_options"]; so == nil {
			t.Error("stream_options.include_usage not asked for")
		}
		evs := events(t, resp.body)
		var names []string
		var text strings.Builder
		for _, e := range evs {
			names = append(names, e.Name)
			var d struct {
				Delta struct {
					Text       string `json:"text"`
					StopReason string `json:"stop_reason"`
				} `json:"delta"`
				Usage map[string]float64 `json:"usage"`
			}
			_ = json.Unmarshal(e.Data, &d)
			text.WriteString(d.Delta.Text)
			if e.Name == "message_delta" && (d.Delta.StopReason != "end_turn" || d.Usage["output_tokens"] != 3 || d.Usage["input_tokens"] != 7) {
				t.Errorf("message_delta %s", e.Data)
			}
		}
		want := "message_start content_block_start content_block_delta content_block_delta content_block_delta content_block_stop message_delta message_stop"
		if strings.Join(names, " ") != want || text.String() != "tok0 tok1 tok2 " {
			t.Errorf("events %v text %q", names, text.String())
		}
		waitRecord(t, h)
		if rec := h.lastRecord(); rec.InputTokens != 7 || rec.OutputTokens != 3 {
			t.Errorf("record %+v", rec)
		}
	})
	t.Run("stream tools", func(t *testing.T) {
		resp := h.do("POST", "/v1/messages", strings.Replace(anthropicToolRequest, "%s", `,"stream":true`, 1), hdr)
		var args strings.Builder
		var start, stop string
		for _, e := range events(t, resp.body) {
			var d struct {
				ContentBlock struct {
					Type, ID, Name string
				} `json:"content_block"`
				Delta struct {
					PartialJSON string `json:"partial_json"`
					StopReason  string `json:"stop_reason"`
				} `json:"delta"`
			}
			_ = json.Unmarshal(e.Data, &d)
			if e.Name == "content_block_start" {
				start = d.ContentBlock.Type + "/" + d.ContentBlock.ID + "/" + d.ContentBlock.Name
			}
			args.WriteString(d.Delta.PartialJSON)
			if d.Delta.StopReason != "" {
				stop = d.Delta.StopReason
			}
		}
		if start != "tool_use/call_fake1/weather" || args.String() != fakemodel.ToolArgs || stop != "tool_use" {
			t.Errorf("start %q args %q stop %q in %s", start, args.String(), stop, resp.body)
		}
	})
}

func TestOpenAIClientOnAnthropicRoute(t *testing.T) {
	be := fakemodel.New()
	defer be.Close()
	h := newHarness(t, translatingAnthropicRoute(be.URL))
	hdr := map[string]string{"Authorization": "Bearer " + Placeholder}

	t.Run("plain", func(t *testing.T) {
		resp := h.do("POST", "/v1/chat/completions", `{"model":"gpt-x","messages":[{"role":"system","content":"sys"},{"role":"user","content":"hi"}],"stop":"END"}`, hdr)
		if resp.status != 200 {
			t.Fatalf("%d %s", resp.status, resp.body)
		}
		got := be.Last()
		sent := got.JSON()
		if got.Path != "/v1/messages" || sent["model"] != "claude-real" || sent["system"] != "sys" || sent["max_tokens"] != float64(translate.DefaultMaxTokens) ||
			got.Header.Get("X-Api-Key") != testKey || got.Header.Get("Authorization") != "" || got.Header.Get("Anthropic-Version") == "" {
			t.Errorf("backend got %s %s %v", got.Path, got.Body, got.Header)
		}
		if ss := sent["stop_sequences"].([]any); ss[0] != "END" {
			t.Errorf("stop %v", ss)
		}
		m := decode(t, resp.body)
		ch := m["choices"].([]any)[0].(map[string]any)
		if m["object"] != "chat.completion" || ch["finish_reason"] != "stop" || ch["message"].(map[string]any)["content"] != "tok0 tok1 tok2 " {
			t.Errorf("answer %s", resp.body)
		}
		if u := m["usage"].(map[string]any); u["prompt_tokens"] != 7.0 || u["completion_tokens"] != 3.0 {
			t.Errorf("usage %v", u)
		}
	})
	t.Run("tools", func(t *testing.T) {
		resp := h.do("POST", "/v1/chat/completions", strings.Replace(openAIToolRequest, "%s", "", 1), hdr)
		sent := be.Last().JSON()
		tool := sent["tools"].([]any)[0].(map[string]any)
		if tool["name"] != "weather" || tool["input_schema"] == nil || sent["tool_choice"].(map[string]any)["type"] != "any" {
			t.Errorf("sent tools %v %v", sent["tools"], sent["tool_choice"])
		}
		ch := decode(t, resp.body)["choices"].([]any)[0].(map[string]any)
		call := ch["message"].(map[string]any)["tool_calls"].([]any)[0].(map[string]any)
		fn := call["function"].(map[string]any)
		if ch["finish_reason"] != "tool_calls" || call["id"] != "toolu_fake1" || fn["name"] != "weather" || fn["arguments"] != fakemodel.ToolArgs {
			t.Errorf("answer %s", resp.body)
		}
		follow := `,"messages":[{"role":"user","content":"weather?"},
		 {"role":"assistant","content":null,"tool_calls":[{"id":"toolu_fake1","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Paris\"}"}}]},
		 {"role":"tool","tool_call_id":"toolu_fake1","content":"sunny"},{"role":"user","content":"thanks"}]`
		body := strings.Replace(strings.Replace(openAIToolRequest, `,
 "messages":[{"role":"system","content":"be brief"},{"role":"user","content":"weather in Paris?"}]%s`, follow, 1), "%s", "", 1)
		resp = h.do("POST", "/v1/chat/completions", body, hdr)
		if resp.status != 200 {
			t.Fatalf("%d %s", resp.status, resp.body)
		}
		msgs := be.Last().JSON()["messages"].([]any)
		if len(msgs) != 3 {
			t.Fatalf("messages must alternate, tool result and text in one user turn: %v", msgs)
		}
		asst := msgs[1].(map[string]any)["content"].([]any)[0].(map[string]any)
		user := msgs[2].(map[string]any)["content"].([]any)
		if asst["type"] != "tool_use" || asst["input"].(map[string]any)["city"] != "Paris" ||
			user[0].(map[string]any)["type"] != "tool_result" || user[0].(map[string]any)["tool_use_id"] != "toolu_fake1" ||
			user[1].(map[string]any)["text"] != "thanks" {
			t.Errorf("history %v", msgs)
		}
	})
	t.Run("stream", func(t *testing.T) {
		resp := h.do("POST", "/v1/chat/completions", `{"model":"gpt-x","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`, hdr)
		var text strings.Builder
		var finish string
		var usage map[string]any
		evs := events(t, resp.body)
		for _, e := range evs {
			if string(e.Data) == "[DONE]" {
				continue
			}
			m := decode(t, string(e.Data))
			if u, ok := m["usage"].(map[string]any); ok {
				usage = u
			}
			for _, c := range m["choices"].([]any) {
				c := c.(map[string]any)
				if s, ok := c["delta"].(map[string]any)["content"].(string); ok {
					text.WriteString(s)
				}
				if f, ok := c["finish_reason"].(string); ok {
					finish = f
				}
			}
		}
		if text.String() != "tok0 tok1 tok2 " || finish != "stop" || usage["prompt_tokens"] != 7.0 || usage["completion_tokens"] != 3.0 ||
			string(evs[len(evs)-1].Data) != "[DONE]" {
			t.Errorf("text %q finish %q usage %v\n%s", text.String(), finish, usage, resp.body)
		}
	})
	t.Run("stream tools", func(t *testing.T) {
		resp := h.do("POST", "/v1/chat/completions", strings.Replace(openAIToolRequest, "%s", `,"stream":true`, 1), hdr)
		var args strings.Builder
		var id, name, finish string
		for _, e := range events(t, resp.body) {
			if string(e.Data) == "[DONE]" {
				continue
			}
			var c struct {
				Choices []struct {
					Delta struct {
						ToolCalls []struct {
							ID       string `json:"id"`
							Function struct{ Name, Arguments string }
						} `json:"tool_calls"`
					} `json:"delta"`
					FinishReason string `json:"finish_reason"`
				} `json:"choices"`
			}
			_ = json.Unmarshal(e.Data, &c)
			for _, ch := range c.Choices {
				for _, tc := range ch.Delta.ToolCalls {
					if tc.ID != "" {
						id, name = tc.ID, tc.Function.Name
					}
					args.WriteString(tc.Function.Arguments)
				}
				if ch.FinishReason != "" {
					finish = ch.FinishReason
				}
			}
		}
		if id != "toolu_fake1" || name != "weather" || args.String() != fakemodel.ToolArgs || finish != "tool_calls" {
			t.Errorf("id %q name %q args %q finish %q\n%s", id, name, args.String(), finish, resp.body)
		}
	})
	t.Run("untranslatable", func(t *testing.T) {
		for field, body := range map[string]string{
			"n":                           `{"model":"g","n":2,"messages":[]}`,
			"response_format":             `{"model":"g","response_format":{"type":"json_schema"},"messages":[]}`,
			"logit_bias":                  `{"model":"g","logit_bias":{"1":2},"messages":[]}`,
			"messages[0].content[0].type": `{"model":"g","messages":[{"role":"user","content":[{"type":"input_audio"}]}]}`,
		} {
			resp := h.do("POST", "/v1/chat/completions", body, hdr)
			if resp.status != 400 || !strings.Contains(resp.body, field) {
				t.Errorf("%s: %d %s", field, resp.status, resp.body)
			}
		}
	})
}

func TestDirectRoutePreferredOverTranslation(t *testing.T) {
	b1, b2 := fakemodel.New(), fakemodel.New()
	defer b1.Close()
	defer b2.Close()
	h := newHarness(t, translatingOpenAIRoute(b1.URL), anthropicRoute("claude", b2.URL))
	if resp := h.do("POST", "/v1/messages", `{"model":"c","max_tokens":5,"messages":[{"role":"user","content":"x"}]}`, nil); resp.status != 200 {
		t.Fatal(resp.body)
	}
	if len(b1.Requests()) != 0 || len(b2.Requests()) != 1 {
		t.Errorf("a route speaking the protocol must win over one that translates")
	}
}
