package translate

import (
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestSSEReader(t *testing.T) {
	in := "\n\nevent: a\ndata: {\"x\":1}\r\n\r\n: comment\ndata: one\ndata: two\n\ndata: " + strings.Repeat("y", 70000) + "\n\ndata: cut"
	rd := NewSSEReader(strings.NewReader(in))
	want := []struct{ name, data string }{{"a", `{"x":1}`}, {"", "one\ntwo"}, {"", strings.Repeat("y", 70000)}}
	for i, w := range want {
		ev, err := rd.Next()
		if err != nil || ev.Name != w.name || string(ev.Data) != w.data {
			t.Fatalf("event %d: %q %q %v", i, ev.Name, ev.Data, err)
		}
	}
	ev, err := rd.Next()
	if !errors.Is(err, io.ErrUnexpectedEOF) || string(ev.Data) != "cut" {
		t.Errorf("cut event: %q %v", ev.Data, err)
	}
	if _, err := rd.Next(); !errors.Is(err, io.EOF) {
		t.Errorf("after the end: %v", err)
	}
}

func TestFieldErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		a2o   bool
		body  string
		field string
	}{
		{true, `{"model":"m","messages":[],"mcp_servers":[{}]}`, "mcp_servers"},
		{true, `{"model":"m","messages":[],"tools":[{"type":"web_search_20250305","name":"web_search"}]}`, "tools[0].type"},
		{true, `{"model":"m","messages":[{"role":"user","content":[{"type":"tool_use","id":"x","name":"n","input":{}}]}]}`, "messages[0].content[0]"},
		{true, `{"model":"m","messages":[{"role":"system","content":"x"}]}`, "messages[0].role"},
		{true, `{"model":"m","messages":[],"tool_choice":{"type":"sometimes"}}`, "tool_choice.type"},
		{true, `[1]`, "body"},
		{false, `{"model":"m","messages":[],"functions":[]}`, "functions"},
		{false, `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"not json"}}]}]}`, "messages[0].tool_calls[0].function.arguments"},
		{false, `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png,abc"}}]}]}`, "messages[0].content[0].image_url.url"},
		{false, `{"model":"m","messages":[],"tools":[{"type":"custom","custom":{}}]}`, "tools[0].type"},
	} {
		var err error
		if tc.a2o {
			_, _, err = AnthropicToOpenAIRequest([]byte(tc.body))
		} else {
			_, _, _, err = OpenAIToAnthropicRequest([]byte(tc.body))
		}
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%s: error %v, want one naming %q", tc.body, err, tc.field)
		}
	}
}

func TestImagesAndSystemBothWays(t *testing.T) {
	out, _, err := AnthropicToOpenAIRequest([]byte(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[
		{"type":"text","text":"what is this?"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"QUJD"}}]}]}`))
	if err != nil || !strings.Contains(string(out), `"url":"data:image/png;base64,QUJD"`) {
		t.Fatalf("%s %v", out, err)
	}
	back, _, _, err := OpenAIToAnthropicRequest(out)
	if err != nil || !strings.Contains(string(back), `"media_type":"image/png"`) || !strings.Contains(string(back), `"data":"QUJD"`) {
		t.Fatalf("%s %v", back, err)
	}
	out, _, _, err = OpenAIToAnthropicRequest([]byte(`{"model":"m","parallel_tool_calls":false,"messages":[{"role":"developer","content":"a"},{"role":"system","content":[{"type":"text","text":"b"}]},{"role":"user","content":"q"}]}`))
	var m map[string]any
	if err != nil || json.Unmarshal(out, &m) != nil || m["system"] != "a\n\nb" ||
		m["tool_choice"].(map[string]any)["disable_parallel_tool_use"] != true {
		t.Fatalf("%s %v", out, err)
	}
}

func TestStreamEndsEarly(t *testing.T) {
	s := NewOpenAIToAnthropicStream()
	_, _ = s.Event(Event{Data: []byte(`{"id":"x","model":"m","choices":[{"delta":{"content":"hi"}}]}`)})
	if out := string(s.End(false)); !strings.Contains(out, "event: error") {
		t.Errorf("a stream without finish_reason or [DONE] ended cleanly: %s", out)
	}
	a := NewAnthropicToOpenAIStream(false)
	_, _ = a.Event(Event{Data: []byte(`{"type":"message_start","message":{"id":"msg_1","model":"m","usage":{"input_tokens":1}}}`)})
	if out := string(a.End(true)); !strings.Contains(out, `"error"`) || strings.Contains(out, "[DONE]") {
		t.Errorf("a cut stream ended cleanly: %s", out)
	}
}

// FuzzRequests: request translation reads the sandbox's bytes; it must
// never panic and must produce JSON whenever it does not refuse.
func FuzzRequests(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","max_tokens":5,"system":"s","messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"x"}]}],"tools":[{"name":"a","input_schema":{}}],"tool_choice":{"type":"tool","name":"a"}}`,
		`{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"r"}],"stop":["x"],"tool_choice":{"type":"function","function":{"name":"f"}}}`,
		`{}`, `null`, `{"messages":null}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if out, _, err := AnthropicToOpenAIRequest(body); err == nil && !json.Valid(out) {
			t.Fatalf("invalid JSON from %q", body)
		}
		if out, _, _, err := OpenAIToAnthropicRequest(body); err == nil && !json.Valid(out) {
			t.Fatalf("invalid JSON from %q", body)
		}
		_, _ = OpenAIToAnthropicResponse(body)
		_, _ = AnthropicToOpenAIResponse(body)
		_, _ = NewOpenAIToAnthropicStream().Event(Event{Data: body})
		_, _ = NewAnthropicToOpenAIStream(true).Event(Event{Data: body})
	})
}
