// Package fakemodel is a model backend for tests: it answers the OpenAI
// (chat completions, completions, responses, embeddings, models) and
// Anthropic (messages) HTTP APIs with deterministic text, streams them as
// SSE with a configurable pace, calls a tool when the request offers one,
// reports usage, fails on demand, and records every request it receives so
// a test can assert on what reached the backend.
package fakemodel

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"
)

// Failure selects a way for the backend to misbehave.
type Failure int

const (
	// OK answers normally.
	OK Failure = iota
	// Unauthorized answers 401 with an error body in the protocol's shape.
	Unauthorized
	// ServerError answers 500.
	ServerError
	// CloseMidStream sends half of the stream, then drops the connection.
	CloseMidStream
	// GarbageBody answers 200 with a body that is not the protocol's JSON.
	GarbageBody
	// GarbageHTTP writes bytes that are not an HTTP response and closes.
	GarbageHTTP
)

// Behavior is how the backend answers; the zero value answers at once with
// a few tokens.
type Behavior struct {
	Fail Failure
	// Tokens is how many text deltas a streamed answer has (default 3).
	Tokens int
	// EventDelay is slept between streamed events.
	EventDelay time.Duration
	// FirstByteDelay is slept before the response header is written.
	FirstByteDelay time.Duration
	// BeforeLast, when set, is received from before the last streamed
	// event is sent, so a test can prove the client saw earlier events
	// while the stream was still open.
	BeforeLast <-chan struct{}
	// InputTokens is the prompt size reported in usage (default 7).
	InputTokens int
}

// Request is one request as the backend received it.
type Request struct {
	Method string
	Path   string
	Query  string
	Header http.Header
	Body   []byte
}

// JSON decodes the body into a map (nil if it is not a JSON object).
func (r Request) JSON() map[string]any {
	var m map[string]any
	if json.Unmarshal(r.Body, &m) != nil {
		return nil
	}
	return m
}

// Server is a running fake backend.
type Server struct {
	*httptest.Server

	mu       sync.Mutex
	behavior Behavior
	requests []Request
}

// New starts a fake backend on loopback; Close it when done.
func New() *Server {
	s := &Server{}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// NewTLS starts a fake backend that speaks HTTPS with httptest's own CA
// (Certificate() returns it).
func NewTLS() *Server {
	s := &Server{}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	// A client that rejects the certificate is a case tests provoke.
	s.Config.ErrorLog = log.New(io.Discard, "", 0)
	s.StartTLS()
	return s
}

// Set replaces the behaviour for the requests that follow.
func (s *Server) Set(b Behavior) {
	s.mu.Lock()
	s.behavior = b
	s.mu.Unlock()
}

// Requests returns a copy of every request received so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Last returns the most recent request (zero Request if none).
func (s *Server) Last() Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.requests) == 0 {
		return Request{}
	}
	return s.requests[len(s.requests)-1]
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.requests = append(s.requests, Request{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Header: r.Header.Clone(), Body: body})
	b := s.behavior
	s.mu.Unlock()
	if b.Tokens == 0 {
		b.Tokens = 3
	}
	if b.InputTokens == 0 {
		b.InputTokens = 7
	}
	if b.FirstByteDelay > 0 {
		select {
		case <-time.After(b.FirstByteDelay):
		case <-r.Context().Done():
			return
		}
	}
	var req map[string]any
	_ = json.Unmarshal(body, &req)
	anthropic := r.URL.Path == "/v1/messages"

	switch b.Fail {
	case Unauthorized:
		writeError(w, anthropic, http.StatusUnauthorized, "authentication_error", "invalid api key")
		return
	case ServerError:
		writeError(w, anthropic, http.StatusInternalServerError, "api_error", "backend exploded")
		return
	case GarbageHTTP:
		if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_, _ = c.Write([]byte("this is not HTTP at all\r\n\r\n"))
			_ = c.Close()
		}
		return
	case GarbageBody:
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte("<html>not json"))
		return
	}

	switch {
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/models"):
		writeJSON(w, map[string]any{"object": "list", "data": []any{map[string]any{"id": "fake-model", "object": "model"}}})
	case r.URL.Path == "/v1/embeddings":
		writeJSON(w, map[string]any{"object": "list", "model": req["model"],
			"data":  []any{map[string]any{"object": "embedding", "index": 0, "embedding": []float64{0.1, 0.2}}},
			"usage": map[string]any{"prompt_tokens": b.InputTokens, "total_tokens": b.InputTokens}})
	case r.URL.Path == "/v1/chat/completions" || r.URL.Path == "/v1/messages" ||
		r.URL.Path == "/v1/completions" || r.URL.Path == "/v1/responses":
		s.answer(w, r, req, b)
	default:
		writeError(w, anthropic, http.StatusNotFound, "not_found_error", "no such path "+r.URL.Path)
	}
}

// Words returns the text deltas a non-failing answer of n tokens carries.
func Words(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("tok%d ", i)
	}
	return out
}

// toolCall is what the backend calls when the request offers tools and
// the conversation does not already hold a tool result: the first tool,
// with fixed arguments.
func toolCall(req map[string]any) (name string, ok bool) {
	tools, _ := req["tools"].([]any)
	if len(tools) == 0 {
		return "", false
	}
	msgs, _ := req["messages"].([]any)
	for _, m := range msgs {
		mm, _ := m.(map[string]any)
		if mm["role"] == "tool" {
			return "", false
		}
		if blocks, ok := mm["content"].([]any); ok {
			for _, bl := range blocks {
				if bm, _ := bl.(map[string]any); bm["type"] == "tool_result" {
					return "", false
				}
			}
		}
	}
	t, _ := tools[0].(map[string]any)
	if fn, ok := t["function"].(map[string]any); ok {
		name, _ = fn["name"].(string)
	} else {
		name, _ = t["name"].(string)
	}
	return name, name != ""
}

// ToolArgs is the JSON arguments of every tool call the backend makes.
const ToolArgs = `{"city":"Paris"}`

func (s *Server) answer(w http.ResponseWriter, r *http.Request, req map[string]any, b Behavior) {
	model, _ := req["model"].(string)
	stream, _ := req["stream"].(bool)
	tool, isTool := toolCall(req)
	words := Words(b.Tokens)
	if isTool {
		words = nil
	}
	var events []string
	switch r.URL.Path {
	case "/v1/messages":
		events = anthropicEvents(model, words, tool, b)
		if !stream {
			writeJSON(w, anthropicMessage(model, words, tool, b))
			return
		}
	case "/v1/chat/completions":
		events = openAIEvents(model, words, tool, b, req)
		if !stream {
			writeJSON(w, openAIMessage(model, words, tool, b))
			return
		}
	case "/v1/completions":
		if !stream {
			writeJSON(w, map[string]any{"id": "cmpl-fake", "object": "text_completion", "model": model,
				"choices": []any{map[string]any{"index": 0, "text": strings.Join(words, ""), "finish_reason": "stop"}},
				"usage":   map[string]any{"prompt_tokens": b.InputTokens, "completion_tokens": len(words), "total_tokens": b.InputTokens + len(words)}})
			return
		}
		for _, wd := range words {
			events = append(events, sse("", map[string]any{"id": "cmpl-fake", "object": "text_completion", "model": model,
				"choices": []any{map[string]any{"index": 0, "text": wd, "finish_reason": nil}}}))
		}
		events = append(events, "data: [DONE]\n\n")
	case "/v1/responses":
		resp := map[string]any{"id": "resp_fake", "object": "response", "model": model, "status": "completed",
			"output": []any{map[string]any{"type": "message", "role": "assistant",
				"content": []any{map[string]any{"type": "output_text", "text": strings.Join(words, "")}}}},
			"usage": map[string]any{"input_tokens": b.InputTokens, "output_tokens": len(words), "total_tokens": b.InputTokens + len(words)}}
		if !stream {
			writeJSON(w, resp)
			return
		}
		for _, wd := range words {
			events = append(events, sse("response.output_text.delta", map[string]any{"type": "response.output_text.delta", "delta": wd}))
		}
		events = append(events, sse("response.completed", map[string]any{"type": "response.completed", "response": resp}))
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	for i, ev := range events {
		if b.Fail == CloseMidStream && i == len(events)/2 {
			panic(http.ErrAbortHandler)
		}
		if i == len(events)-1 && b.BeforeLast != nil {
			select {
			case <-b.BeforeLast:
			case <-r.Context().Done():
				return
			}
		}
		if i > 0 && b.EventDelay > 0 {
			time.Sleep(b.EventDelay)
		}
		if _, err := io.WriteString(w, ev); err != nil {
			return
		}
		_ = rc.Flush()
	}
}

func sse(event string, data any) string {
	j, _ := json.Marshal(data)
	if event == "" {
		return "data: " + string(j) + "\n\n"
	}
	return "event: " + event + "\ndata: " + string(j) + "\n\n"
}

func anthropicMessage(model string, words []string, tool string, b Behavior) map[string]any {
	content := []any{}
	stop := "end_turn"
	if tool != "" {
		var input any
		_ = json.Unmarshal([]byte(ToolArgs), &input)
		content = append(content, map[string]any{"type": "tool_use", "id": "toolu_fake1", "name": tool, "input": input})
		stop = "tool_use"
	} else {
		content = append(content, map[string]any{"type": "text", "text": strings.Join(words, "")})
	}
	return map[string]any{"id": "msg_fake", "type": "message", "role": "assistant", "model": model,
		"content": content, "stop_reason": stop, "stop_sequence": nil,
		"usage": map[string]any{"input_tokens": b.InputTokens, "output_tokens": outTokens(words, tool)}}
}

func outTokens(words []string, tool string) int {
	if tool != "" {
		return 5
	}
	return len(words)
}

func anthropicEvents(model string, words []string, tool string, b Behavior) []string {
	ev := []string{sse("message_start", map[string]any{"type": "message_start", "message": map[string]any{
		"id": "msg_fake", "type": "message", "role": "assistant", "model": model, "content": []any{},
		"stop_reason": nil, "stop_sequence": nil, "usage": map[string]any{"input_tokens": b.InputTokens, "output_tokens": 1}}})}
	stop := "end_turn"
	if tool != "" {
		stop = "tool_use"
		ev = append(ev,
			sse("content_block_start", map[string]any{"type": "content_block_start", "index": 0,
				"content_block": map[string]any{"type": "tool_use", "id": "toolu_fake1", "name": tool, "input": map[string]any{}}}),
			sse("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0,
				"delta": map[string]any{"type": "input_json_delta", "partial_json": ToolArgs[:8]}}),
			sse("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0,
				"delta": map[string]any{"type": "input_json_delta", "partial_json": ToolArgs[8:]}}))
	} else {
		ev = append(ev, sse("content_block_start", map[string]any{"type": "content_block_start", "index": 0,
			"content_block": map[string]any{"type": "text", "text": ""}}))
		for _, wd := range words {
			ev = append(ev, sse("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0,
				"delta": map[string]any{"type": "text_delta", "text": wd}}))
		}
	}
	ev = append(ev,
		sse("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0}),
		sse("message_delta", map[string]any{"type": "message_delta",
			"delta": map[string]any{"stop_reason": stop, "stop_sequence": nil},
			"usage": map[string]any{"output_tokens": outTokens(words, tool)}}),
		sse("message_stop", map[string]any{"type": "message_stop"}))
	return ev
}

func openAIMessage(model string, words []string, tool string, b Behavior) map[string]any {
	msg := map[string]any{"role": "assistant", "content": strings.Join(words, "")}
	finish := "stop"
	if tool != "" {
		msg["content"] = nil
		msg["tool_calls"] = []any{map[string]any{"id": "call_fake1", "type": "function",
			"function": map[string]any{"name": tool, "arguments": ToolArgs}}}
		finish = "tool_calls"
	}
	out := outTokens(words, tool)
	return map[string]any{"id": "chatcmpl-fake", "object": "chat.completion", "created": 1, "model": model,
		"choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": finish}},
		"usage":   map[string]any{"prompt_tokens": b.InputTokens, "completion_tokens": out, "total_tokens": b.InputTokens + out}}
}

func openAIEvents(model string, words []string, tool string, b Behavior, req map[string]any) []string {
	chunk := func(delta map[string]any, finish any) string {
		return sse("", map[string]any{"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": model,
			"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}}})
	}
	ev := []string{chunk(map[string]any{"role": "assistant", "content": ""}, nil)}
	finish := "stop"
	if tool != "" {
		finish = "tool_calls"
		ev = append(ev,
			chunk(map[string]any{"tool_calls": []any{map[string]any{"index": 0, "id": "call_fake1", "type": "function",
				"function": map[string]any{"name": tool, "arguments": ""}}}}, nil),
			chunk(map[string]any{"tool_calls": []any{map[string]any{"index": 0, "function": map[string]any{"arguments": ToolArgs[:8]}}}}, nil),
			chunk(map[string]any{"tool_calls": []any{map[string]any{"index": 0, "function": map[string]any{"arguments": ToolArgs[8:]}}}}, nil))
	} else {
		for _, wd := range words {
			ev = append(ev, chunk(map[string]any{"content": wd}, nil))
		}
	}
	ev = append(ev, chunk(map[string]any{}, finish))
	if so, _ := req["stream_options"].(map[string]any); so["include_usage"] == true {
		out := outTokens(words, tool)
		ev = append(ev, sse("", map[string]any{"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": model,
			"choices": []any{}, "usage": map[string]any{"prompt_tokens": b.InputTokens, "completion_tokens": out, "total_tokens": b.InputTokens + out}}))
	}
	return append(ev, "data: [DONE]\n\n")
}

func writeJSON(w http.ResponseWriter, v any) {
	var buf bytes.Buffer
	_ = json.NewEncoder(&buf).Encode(v)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(buf.Bytes())
}

func writeError(w http.ResponseWriter, anthropic bool, status int, typ, msg string) {
	var body any
	if anthropic {
		body = map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": msg}}
	} else {
		body = map[string]any{"error": map[string]any{"type": typ, "message": msg, "code": nil}}
	}
	j, _ := json.Marshal(body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(j)
}
