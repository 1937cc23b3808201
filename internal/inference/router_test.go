package inference

import (
	"bufio"
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/testutil/fakemodel"
)

const testKey = "sk-test-SECRET-7f3a9c0d1e2b"

// harness is a Router behind an httptest server, with the records it
// emitted and every byte any client got, for the key-leak check.
type harness struct {
	t      *testing.T
	router *Router
	srv    *httptest.Server

	mu      sync.Mutex
	records []Record
	seen    strings.Builder
}

func env(name string) string {
	if name == "MODEL_KEY" {
		return testKey
	}
	return ""
}

func newHarness(t *testing.T, routes ...Route) *harness {
	t.Helper()
	h := &harness{t: t}
	r, err := NewRouter(Config{Routes: routes}, Options{
		Getenv:    env,
		OnRequest: func(_ context.Context, rec Record) { h.mu.Lock(); h.records = append(h.records, rec); h.mu.Unlock() },
	})
	if err != nil {
		t.Fatalf("NewRouter: %v", err)
	}
	h.router = r
	h.srv = httptest.NewServer(r)
	t.Cleanup(func() {
		h.srv.Close()
		h.assertNoKey()
	})
	return h
}

func openAIRoute(name, url string) Route {
	return Route{Name: name, BaseURL: url + "/v1", Protocols: []string{OpenAIChatCompletions, OpenAICompletions, OpenAIResponses, OpenAIEmbeddings, ModelDiscovery},
		APIKey: KeySource{FromEnv: "MODEL_KEY"}}
}

func anthropicRoute(name, url string) Route {
	return Route{Name: name, BaseURL: url, Protocols: []string{AnthropicMessages}, APIKey: KeySource{FromEnv: "MODEL_KEY"}}
}

type response struct {
	status int
	header http.Header
	body   string
}

func (h *harness) do(method, path, body string, hdr map[string]string) response {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, h.srv.URL+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	client := *h.srv.Client()
	// What the router answered, not where a redirect leads.
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := client.Do(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	h.note(fmt.Sprint(resp.Header), string(b))
	if err != nil {
		return response{status: -1, header: resp.Header, body: string(b) + "\nREAD ERROR: " + err.Error()}
	}
	return response{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

func (h *harness) note(s ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, x := range s {
		h.seen.WriteString(x)
	}
}

func (h *harness) lastRecord() Record {
	h.t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.records) == 0 {
		h.t.Fatal("no record emitted")
	}
	return h.records[len(h.records)-1]
}

// assertNoKey fails if the key appears in anything a client received or
// any record the router emitted.
func (h *harness) assertNoKey() {
	h.mu.Lock()
	defer h.mu.Unlock()
	all := h.seen.String() + fmt.Sprintf("%+v", h.records)
	if strings.Contains(all, testKey) {
		h.t.Errorf("the route's key leaked into client output or records")
	}
}

func errorType(t *testing.T, body string) string {
	t.Helper()
	var e struct {
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Type == "" {
		t.Fatalf("not a JSON error body: %q", body)
	}
	return e.Error.Type
}

func TestForwardReplacesCredentialAndModel(t *testing.T) {
	be := fakemodel.New()
	defer be.Close()
	rt := openAIRoute("main", be.URL)
	rt.Model = "served-model"
	rt.Headers = map[string]string{"OpenAI-Organization": "org-ops"}
	h := newHarness(t, rt)

	body := `{ "model" : "gpt-client",  "messages":[{"role":"user","content":"hi"}], "temperature": 0.50, "x":{"model":"inner"} }`
	resp := h.do("POST", "/v1/chat/completions?api-version=1", body, map[string]string{
		"Authorization": "Bearer " + Placeholder, "X-Api-Key": "client-key", "Api-Key": "client-key",
		"Proxy-Authorization": "Basic abc", "Connection": "X-Hop", "X-Hop": "1", "X-Keep": "kept",
		"Content-Type": "application/json",
	})
	if resp.status != 200 {
		t.Fatalf("status %d: %s", resp.status, resp.body)
	}
	got := be.Last()
	if a := got.Header.Get("Authorization"); a != "Bearer "+testKey {
		t.Errorf("backend Authorization is not the route's key")
	}
	for _, hd := range []string{"X-Api-Key", "Api-Key", "Proxy-Authorization", "X-Hop"} {
		if v := got.Header.Get(hd); v != "" {
			t.Errorf("backend got client header %s=%q", hd, v)
		}
	}
	if got.Header.Get("X-Keep") != "kept" || got.Header.Get("Openai-Organization") != "org-ops" {
		t.Errorf("ordinary or route headers missing: %v", got.Header)
	}
	want := strings.Replace(body, `"gpt-client"`, `"served-model"`, 1)
	if string(got.Body) != want {
		t.Errorf("body not rewritten byte for byte:\n got %s\nwant %s", got.Body, want)
	}
	if got.Path != "/v1/chat/completions" || got.Query != "api-version=1" {
		t.Errorf("backend path %q query %q", got.Path, got.Query)
	}
	rec := h.lastRecord()
	if rec.Route != "main" || rec.Protocol != OpenAIChatCompletions || rec.ClientModel != "gpt-client" ||
		rec.RoutedModel != "served-model" || rec.Status != 200 || rec.InputTokens != 7 || rec.OutputTokens != 3 ||
		rec.BytesIn != int64(len(body)) || rec.BytesOut != int64(len(resp.body)) || rec.TTFB <= 0 || rec.Duration < rec.TTFB {
		t.Errorf("record %+v", rec)
	}
}

func TestBodiesWithoutModelOrNotJSONPassUnchanged(t *testing.T) {
	be := fakemodel.New()
	defer be.Close()
	rt := openAIRoute("main", be.URL)
	rt.Model = "served-model"
	h := newHarness(t, rt)
	for _, body := range []string{`{"input":"x"}`, `not json {"model":"a"}`, `["model"]`} {
		h.do("POST", "/v1/embeddings", body, nil)
		if got := string(be.Last().Body); got != body {
			t.Errorf("body %q forwarded as %q", body, got)
		}
	}
}

func TestAuthStyles(t *testing.T) {
	be := fakemodel.New()
	defer be.Close()
	for _, tc := range []struct {
		auth, protocol, path, header, want string
	}{
		{"", AnthropicMessages, "/v1/messages", "X-Api-Key", testKey},
		{"bearer", AnthropicMessages, "/v1/messages", "Authorization", "Bearer " + testKey},
		{"x-api-key", OpenAIChatCompletions, "/v1/chat/completions", "X-Api-Key", testKey},
		{"header:Api-Key", OpenAIChatCompletions, "/v1/chat/completions", "Api-Key", testKey},
		{"header:X-Custom-Token", OpenAIChatCompletions, "/v1/chat/completions", "X-Custom-Token", testKey},
	} {
		t.Run(tc.auth+tc.protocol, func(t *testing.T) {
			h := newHarness(t, Route{Name: "r", BaseURL: be.URL, Protocols: []string{tc.protocol}, Auth: tc.auth, APIKey: KeySource{FromEnv: "MODEL_KEY"}})
			resp := h.do("POST", tc.path, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`,
				map[string]string{"X-Custom-Token": "client", "Authorization": "Bearer client"})
			if resp.status != 200 {
				t.Fatalf("status %d %s", resp.status, resp.body)
			}
			got := be.Last().Header
			if got.Get(tc.header) != tc.want {
				t.Errorf("%s is not the route's credential", tc.header)
			}
			n := 0
			for _, hd := range []string{"Authorization", "X-Api-Key", "Api-Key", "X-Custom-Token"} {
				// X-Custom-Token is an ordinary header unless it is the
				// route's credential header.
				if got.Get(hd) != "" && (hd != "X-Custom-Token" || tc.header == hd) {
					n++
				}
			}
			if n != 1 {
				t.Errorf("backend got %d credential headers, want 1: %v", n, got)
			}
		})
	}
}

// TestKeylessRouteStripsClientCredential: a route without a key (a local
// server) still never forwards the client's credential headers.
func TestKeylessRouteStripsClientCredential(t *testing.T) {
	be := fakemodel.New()
	defer be.Close()
	h := newHarness(t, Route{Name: "local", BaseURL: be.URL, Protocols: []string{OpenAIChatCompletions}, Auth: "header:X-Custom-Token"})
	h.do("POST", "/v1/chat/completions", `{"model":"m","messages":[]}`, map[string]string{
		"X-Custom-Token": "client", "Authorization": "Bearer client", "X-Api-Key": "client", "Api-Key": "client"})
	for _, hd := range []string{"X-Custom-Token", "Authorization", "X-Api-Key", "Api-Key"} {
		if v := be.Last().Header.Get(hd); v != "" {
			t.Errorf("backend got client %s=%q", hd, v)
		}
	}
}

func TestStreamArrivesIncrementally(t *testing.T) {
	be := fakemodel.New()
	defer be.Close()
	gate := make(chan struct{})
	be.Set(fakemodel.Behavior{Tokens: 4, BeforeLast: gate})
	h := newHarness(t, openAIRoute("main", be.URL))

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", h.srv.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`))
	resp, err := h.srv.Client().Do(req)
	if err != nil {
		close(gate)
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	// The backend holds its last event until the gate opens, so reading
	// the first event here proves it was relayed while the stream was open.
	first, err := br.ReadString('\n')
	close(gate)
	if err != nil || !strings.HasPrefix(first, "data: ") {
		t.Fatalf("first event %q: %v", first, err)
	}
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatal(err)
	}
	h.note(first, string(rest))
	if !strings.HasSuffix(string(rest), "data: [DONE]\n\n") || strings.Count(string(rest), `"content":"tok`) != 4 {
		t.Errorf("rest of stream: %q", rest)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("content type %q", ct)
	}
	waitRecord(t, h)
	if rec := h.lastRecord(); rec.InputTokens != 7 || rec.OutputTokens != 4 || rec.Status != 200 || rec.Err != "" {
		t.Errorf("record %+v", rec)
	}
}

// waitRecord waits until the handler has returned (the record is emitted
// after the last byte reaches the client).
func waitRecord(t *testing.T, h *harness) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		h.mu.Lock()
		n := len(h.records)
		h.mu.Unlock()
		if n > 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("no record")
}

func TestAnthropicStreamUsage(t *testing.T) {
	be := fakemodel.New()
	defer be.Close()
	be.Set(fakemodel.Behavior{Tokens: 5, InputTokens: 11})
	h := newHarness(t, anthropicRoute("claude", be.URL))
	resp := h.do("POST", "/v1/messages", `{"model":"c","max_tokens":9,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
	if resp.status != 200 || !strings.Contains(resp.body, "event: message_stop") {
		t.Fatalf("%d %s", resp.status, resp.body)
	}
	waitRecord(t, h)
	if rec := h.lastRecord(); rec.InputTokens != 11 || rec.OutputTokens != 5 {
		t.Errorf("record %+v", rec)
	}
}

func TestErrorMapping(t *testing.T) {
	be := fakemodel.New()
	defer be.Close()
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadURL := "http://" + dead.Addr().String()
	dead.Close()

	chat := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct {
		name     string
		routes   []Route
		behavior fakemodel.Behavior
		path     string
		body     string
		status   int
		typ      string
		contains string
	}{
		{name: "not configured", status: 503, typ: "not_configured", contains: "--inference-routes"},
		{name: "no such route", routes: []Route{openAIRoute("a", be.URL)}, body: `{"model":"route:nope"}`, status: 400, typ: "route_not_found", contains: "nope"},
		{name: "no compatible route", routes: []Route{anthropicRoute("a", be.URL)}, status: 400, typ: "no_compatible_route", contains: OpenAIChatCompletions},
		{name: "named route cannot serve", routes: []Route{openAIRoute("o", be.URL), anthropicRoute("a", be.URL)},
			body: `{"model":"route:a"}`, status: 400, typ: "no_compatible_route"},
		{name: "backend 401", routes: []Route{openAIRoute("a", be.URL)}, behavior: fakemodel.Behavior{Fail: fakemodel.Unauthorized}, status: 401, typ: "authentication_error"},
		{name: "backend 500", routes: []Route{openAIRoute("a", be.URL)}, behavior: fakemodel.Behavior{Fail: fakemodel.ServerError}, status: 500, typ: "api_error"},
		{name: "unreachable", routes: []Route{openAIRoute("a", deadURL)}, status: 503, typ: "upstream_unavailable", contains: "unreachable"},
		{name: "timeout", routes: []Route{func() Route { r := openAIRoute("a", be.URL); r.Timeout = Duration(100 * time.Millisecond); return r }()},
			behavior: fakemodel.Behavior{FirstByteDelay: 3 * time.Second}, status: 503, typ: "upstream_unavailable", contains: "within"},
		{name: "garbage http", routes: []Route{openAIRoute("a", be.URL)}, behavior: fakemodel.Behavior{Fail: fakemodel.GarbageHTTP}, status: 502, typ: "upstream_protocol_error"},
		{name: "garbage body translated", routes: []Route{func() Route { r := openAIRoute("a", be.URL); r.Translate = true; return r }()},
			behavior: fakemodel.Behavior{Fail: fakemodel.GarbageBody}, path: "/v1/messages",
			body: `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, status: 502, typ: "upstream_protocol_error"},
		{name: "untranslatable field", routes: []Route{func() Route { r := openAIRoute("a", be.URL); r.Translate = true; return r }()},
			path: "/v1/messages", body: `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document","source":{}}]}]}`,
			status: 400, typ: "invalid_request_error", contains: "messages[0].content[0].type"},
		{name: "translation off", routes: []Route{openAIRoute("a", be.URL)}, path: "/v1/messages",
			body: `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, status: 400, typ: "no_compatible_route"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			be.Set(tc.behavior)
			defer be.Set(fakemodel.Behavior{})
			h := newHarness(t, tc.routes...)
			path, body := tc.path, tc.body
			if path == "" {
				path = "/v1/chat/completions"
			}
			if body == "" {
				body = chat
			}
			resp := h.do("POST", path, body, nil)
			if resp.status != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.status, tc.status, resp.body)
			}
			if typ := errorType(t, resp.body); typ != tc.typ {
				t.Errorf("error type %q, want %q (%s)", typ, tc.typ, resp.body)
			}
			if !strings.Contains(resp.body, tc.contains) {
				t.Errorf("body %q does not say %q", resp.body, tc.contains)
			}
			if rec := h.lastRecord(); rec.Status != tc.status || rec.Err == "" {
				t.Errorf("record %+v", rec)
			}
		})
	}
}

func TestBackendClosesMidStream(t *testing.T) {
	be := fakemodel.New()
	defer be.Close()
	be.Set(fakemodel.Behavior{Fail: fakemodel.CloseMidStream, Tokens: 6})
	h := newHarness(t, openAIRoute("a", be.URL))
	resp := h.do("POST", "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
	// The client must see a broken stream, not a clean end.
	if resp.status != -1 || strings.Contains(resp.body, "[DONE]") {
		t.Fatalf("client saw a complete stream: %d %q", resp.status, resp.body)
	}
	waitRecord(t, h)
	if rec := h.lastRecord(); !strings.Contains(rec.Err, "stream broke") {
		t.Errorf("record %+v", rec)
	}
}

func TestBackendClosesMidStreamTranslated(t *testing.T) {
	be := fakemodel.New()
	defer be.Close()
	be.Set(fakemodel.Behavior{Fail: fakemodel.CloseMidStream, Tokens: 6})
	rt := openAIRoute("a", be.URL)
	rt.Translate = true
	h := newHarness(t, rt)
	resp := h.do("POST", "/v1/messages", `{"model":"m","max_tokens":9,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
	if !strings.Contains(resp.body, "event: error") || strings.Contains(resp.body, "message_stop") {
		t.Fatalf("translated stream did not end in an error event: %q", resp.body)
	}
}

func TestBodyTooLarge(t *testing.T) {
	be := fakemodel.New()
	defer be.Close()
	h := newHarness(t, openAIRoute("a", be.URL))
	big := `{"model":"m","input":"` + strings.Repeat("x", MaxBodyBytes) + `"}`
	resp := h.do("POST", "/v1/embeddings", big, nil)
	if resp.status != 413 || errorType(t, resp.body) != "request_too_large" {
		t.Fatalf("%d %s", resp.status, resp.body)
	}
	if len(be.Requests()) != 0 {
		t.Error("an oversized body reached the backend")
	}
	ok := `{"model":"m","input":"` + strings.Repeat("x", MaxBodyBytes-100) + `"}`
	if resp := h.do("POST", "/v1/embeddings", ok, nil); resp.status != 200 {
		t.Errorf("body under the limit: %d", resp.status)
	}
}

func TestNonInferencePathsAre403(t *testing.T) {
	be := fakemodel.New()
	defer be.Close()
	h := newHarness(t, openAIRoute("a", be.URL))
	for _, c := range [][2]string{
		{"GET", "/"}, {"GET", "/etc/passwd"}, {"POST", "/v1/chat/completions/"}, {"POST", "/v2/chat/completions"},
		{"GET", "/v1/chat/completions"}, {"PUT", "/v1/messages"}, {"DELETE", "/v1/models/x"}, {"POST", "/v1/models"},
		{"POST", "/V1/messages"}, {"POST", "/v1/../v1/messages"}, {"GET", "/v1/models/"}, {"POST", "/v1/files"},
	} {
		resp := h.do(c[0], c[1], `{"model":"m"}`, nil)
		if resp.status != 403 || errorType(t, resp.body) != "forbidden" {
			t.Errorf("%s %s: %d %s", c[0], c[1], resp.status, resp.body)
		}
	}
	if n := len(be.Requests()); n != 0 {
		t.Errorf("%d non-inference requests reached the backend", n)
	}
}

func TestModels(t *testing.T) {
	be := fakemodel.New()
	defer be.Close()
	a := openAIRoute("a", be.URL)
	a.Model = "llama-3"
	h := newHarness(t, a, anthropicRoute("b", be.URL))
	resp := h.do("GET", "/v1/models?limit=5", "", nil)
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(resp.body), &list); err != nil || resp.status != 200 || list.Object != "list" ||
		len(list.Data) != 2 || list.Data[0].ID != "llama-3" || list.Data[1].ID != "route:b" {
		t.Fatalf("%d %s", resp.status, resp.body)
	}
	if resp := h.do("GET", "/v1/models/llama-3", "", nil); resp.status != 200 || !strings.Contains(resp.body, `"id":"llama-3"`) {
		t.Errorf("get: %d %s", resp.status, resp.body)
	}
	if resp := h.do("GET", "/v1/models/gpt-9", "", nil); resp.status != 404 {
		t.Errorf("unknown model: %d %s", resp.status, resp.body)
	}
	if len(be.Requests()) != 0 {
		t.Error("model discovery reached a backend")
	}
}

func TestRouteSelection(t *testing.T) {
	b1, b2, b3 := fakemodel.New(), fakemodel.New(), fakemodel.New()
	defer b1.Close()
	defer b2.Close()
	defer b3.Close()
	r1, r2, r3 := openAIRoute("first", b1.URL), openAIRoute("second", b2.URL), openAIRoute("third", b3.URL)
	r2.Model = "qwen"
	h := newHarness(t, r1, r2, r3)
	for _, tc := range []struct {
		model string
		want  *fakemodel.Server
		sent  string
	}{
		{"anything", b1, "anything"},
		{"qwen", b2, "qwen"},
		{"route:third", b3, "route:third"},
		{"route:second", b2, "qwen"},
	} {
		before := len(tc.want.Requests())
		resp := h.do("POST", "/v1/chat/completions", `{"model":"`+tc.model+`","messages":[{"role":"user","content":"x"}]}`, nil)
		if resp.status != 200 || len(tc.want.Requests()) != before+1 {
			t.Errorf("model %q did not reach its route (%d)", tc.model, resp.status)
			continue
		}
		if m := tc.want.Last().JSON()["model"]; m != tc.sent {
			t.Errorf("model %q sent as %v, want %q", tc.model, m, tc.sent)
		}
	}
}

func TestCAForPrivateBackend(t *testing.T) {
	be := fakemodel.NewTLS()
	defer be.Close()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, pemCert(be.Certificate().Raw), 0o600); err != nil {
		t.Fatal(err)
	}
	with := openAIRoute("tls", be.URL)
	with.CA = ca
	h := newHarness(t, with)
	if resp := h.do("POST", "/v1/embeddings", `{"model":"m","input":"x"}`, nil); resp.status != 200 {
		t.Errorf("with ca: %d %s", resp.status, resp.body)
	}
	h2 := newHarness(t, openAIRoute("tls", be.URL))
	if resp := h2.do("POST", "/v1/embeddings", `{"model":"m","input":"x"}`, nil); resp.status != 502 {
		t.Errorf("without ca the backend must not be trusted: %d %s", resp.status, resp.body)
	}
}

func TestSwapUnderLoad(t *testing.T) {
	b1, b2 := fakemodel.New(), fakemodel.New()
	defer b1.Close()
	defer b2.Close()
	gate := make(chan struct{})
	b1.Set(fakemodel.Behavior{BeforeLast: gate})
	h := newHarness(t, openAIRoute("one", b1.URL))

	// A stream that starts on the old routes must finish on them.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", h.srv.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`))
	inflight, err := h.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer inflight.Body.Close()
	br := bufio.NewReader(inflight.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}

	cfgs := []Config{{Routes: []Route{openAIRoute("two", b2.URL)}}, {Routes: []Route{openAIRoute("one", b1.URL)}}}
	var wg sync.WaitGroup
	var failures sync.Map
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 25 {
				resp, err := h.srv.Client().Post(h.srv.URL+"/v1/embeddings", "application/json", strings.NewReader(`{"model":"m","input":"x"}`))
				if err != nil {
					failures.Store(fmt.Sprint(g, i), err.Error())
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					failures.Store(fmt.Sprint(g, i), resp.Status)
				}
			}
		}()
	}
	for i := range 50 {
		if err := h.router.Swap(cfgs[i%2]); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	failures.Range(func(k, v any) bool { t.Errorf("request %v: %v", k, v); return true })

	close(gate)
	rest, err := io.ReadAll(br)
	if err != nil || !strings.Contains(string(rest), "[DONE]") {
		t.Errorf("in-flight stream broken by Swap: %v %q", err, rest)
	}

	if err := h.router.Swap(Config{Routes: []Route{{Name: "bad"}}}); err == nil {
		t.Fatal("invalid config accepted")
	}
	if err := h.router.Swap(Config{Routes: []Route{openAIRoute("two", b2.URL)}}); err != nil {
		t.Fatal(err)
	}
	n := len(b2.Requests())
	if resp := h.do("POST", "/v1/embeddings", `{"model":"m","input":"x"}`, nil); resp.status != 200 || len(b2.Requests()) != n+1 {
		t.Errorf("after Swap the new route does not serve: %d", resp.status)
	}
	if err := h.router.Swap(Config{}); err != nil {
		t.Fatal(err)
	}
	if resp := h.do("POST", "/v1/embeddings", `{"model":"m","input":"x"}`, nil); resp.status != 503 {
		t.Errorf("after Swap to no routes: %d", resp.status)
	}
}

// TestKeyNeverLeaks drives the router's own messages that could carry a
// key: a key-source error, validation errors. A backend that echoes the
// key is keymask's TestRouterScrubsKey.
func TestKeyNeverLeaks(t *testing.T) {
	var msgs []string
	for _, getenv := range []func(string) string{func(string) string { return "" }, func(string) string { return "a\n" + testKey }} {
		_, err := NewRouter(Config{Routes: []Route{openAIRoute("o", "http://127.0.0.1:1")}}, Options{Getenv: getenv})
		if err == nil {
			t.Fatal("bad key accepted")
		}
		msgs = append(msgs, err.Error())
	}
	if !strings.Contains(msgs[0], `"o"`) || !strings.Contains(msgs[0], "MODEL_KEY") {
		t.Errorf("key error does not name route and source: %s", msgs[0])
	}
	dir := t.TempDir()
	f := filepath.Join(dir, "routes.yaml")
	_ = os.WriteFile(f, []byte("routes:\n- name: x\n  base_url: http://h\n  protocols: [openai_chat_completions]\n  api_key: "+testKey+"\n"), 0o600)
	_, err := LoadRoutesFile(f)
	if err == nil {
		t.Fatal("inline key accepted")
	}
	msgs = append(msgs, err.Error())
	_ = os.WriteFile(f, []byte("routes:\n- name: x\n  base_url: http://h\n  protocols: [openai_chat_completions]\n  api_key: {from_env: "+testKey+", bogus: 1}\n"), 0o600)
	if _, err := LoadRoutesFile(f); err == nil {
		t.Fatal("unknown api_key field accepted")
	} else {
		msgs = append(msgs, err.Error())
	}
	_, err = NewRouter(Config{Routes: []Route{{Name: "u", BaseURL: "http://user:" + testKey + "@h/", Protocols: []string{OpenAIEmbeddings}}}}, Options{})
	if err == nil {
		t.Fatal("userinfo accepted")
	}
	msgs = append(msgs, err.Error())
	for _, m := range msgs {
		if strings.Contains(m, testKey) {
			t.Errorf("error message carries the key: %s", m)
		}
	}
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// TestRedirectDoesNotCarryKey: a backend that redirects must not make the
// router resend the request, and its key, somewhere else.
func TestRedirectDoesNotCarryKey(t *testing.T) {
	var mu sync.Mutex
	leaked := 0
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		leaked++
		mu.Unlock()
	}))
	defer elsewhere.Close()
	redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, elsewhere.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer redirector.Close()
	for _, auth := range []string{"bearer", "header:X-Token"} {
		rt := openAIRoute("r", redirector.URL)
		rt.Auth = auth
		h := newHarness(t, rt)
		resp := h.do("POST", "/v1/chat/completions", `{"model":"m","messages":[]}`, nil)
		if resp.status != http.StatusTemporaryRedirect {
			t.Errorf("%s: status %d", auth, resp.status)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if leaked != 0 {
		t.Errorf("the router followed a backend redirect %d times", leaked)
	}
}

func TestUsageOfOtherOpenAIEndpoints(t *testing.T) {
	be := fakemodel.New()
	defer be.Close()
	be.Set(fakemodel.Behavior{Tokens: 4, InputTokens: 9})
	h := newHarness(t, openAIRoute("a", be.URL))
	for _, tc := range []struct {
		path, body string
		in, out    int64
	}{
		{"/v1/completions", `{"model":"m","prompt":"x"}`, 9, 4},
		{"/v1/responses", `{"model":"m","input":"x"}`, 9, 4},
		{"/v1/responses", `{"model":"m","input":"x","stream":true}`, 9, 4},
		{"/v1/embeddings", `{"model":"m","input":"x"}`, 9, 0},
	} {
		h.mu.Lock()
		h.records = nil
		h.mu.Unlock()
		if resp := h.do("POST", tc.path, tc.body, nil); resp.status != 200 {
			t.Fatalf("%s: %d %s", tc.path, resp.status, resp.body)
		}
		waitRecord(t, h)
		if rec := h.lastRecord(); rec.InputTokens != tc.in || rec.OutputTokens != tc.out {
			t.Errorf("%s %s: record %+v", tc.path, tc.body, rec)
		}
	}
}

// TestClientGoneCancelsBackend: a client that hangs up mid-stream ends the
// backend request too, and the record says who left.
func TestClientGoneCancelsBackend(t *testing.T) {
	be := fakemodel.New()
	defer be.Close()
	gate := make(chan struct{})
	defer close(gate)
	be.Set(fakemodel.Behavior{BeforeLast: gate})
	h := newHarness(t, openAIRoute("a", be.URL))
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", h.srv.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"messages":[]}`))
	resp, err := h.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	waitRecord(t, h)
	if rec := h.lastRecord(); rec.Err != "client went away mid-stream" {
		t.Errorf("record %+v", rec)
	}
}
