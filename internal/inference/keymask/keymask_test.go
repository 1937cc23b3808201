package keymask

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/inference"
	"github.com/corral-sandbox/corral/internal/testutil/keyecho"
)

const key = "sk-operator-KEYMASK0123456789abcdefXYZ"

// reflector is a backend that hands the credential it received back in
// the way the request's X-Mode header asks.
func reflector(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(keyecho.Handler(func(r *http.Request) string { return r.Header.Get("X-Mode") }))
	t.Cleanup(srv.Close)
	return srv
}

func newRouter(t *testing.T, routes []inference.Route, recs *[]inference.Record) *httptest.Server {
	var mu sync.Mutex
	r, err := inference.NewRouter(inference.Config{Routes: routes}, inference.Options{
		Getenv: func(string) string { return key },
		Mask:   New,
		OnRequest: func(_ context.Context, rec inference.Record) {
			mu.Lock()
			defer mu.Unlock()
			*recs = append(*recs, rec)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	// What the router sends, not what a client undoes.
	srv.Client().Transport.(*http.Transport).DisableCompression = true
	return srv
}

// leaks lists the forms of key in text: raw, cut in half, hex, JSON
// \u-escaped, and base64 in both alphabets at each byte alignment (the
// characters made of the key's bits alone).
func leaks(text string) []string {
	var found []string
	check := func(form, s string) {
		if strings.Contains(text, s) {
			found = append(found, form)
		}
	}
	check("raw", key)
	check("first half", key[:len(key)/2])
	check("hex", hex.EncodeToString([]byte(key)))
	var j strings.Builder
	for _, c := range key {
		fmt.Fprintf(&j, `\u%04x`, c)
	}
	check("json", j.String())
	for a := range 3 {
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
			e := enc.EncodeToString(append(make([]byte, a), key...))
			check(fmt.Sprintf("base64 at %d", a), e[(8*a+5)/6:8*(a+len(key))/6])
		}
	}
	return found
}

// TestRouterScrubsKey: whatever a backend does with the key it got, the
// client sees a surrogate, never the key in any form: in a 2xx body or
// header (names too), a body read in pieces, an event stream, an error's
// headers, base64, JSON-escaped or hex in an error body, compressed with a
// coding the transport leaves alone, or cut off at the error body's limit;
// a coding the router cannot undo is refused.
func TestRouterScrubsKey(t *testing.T) {
	be := reflector(t)
	openai := inference.Route{Name: "o", BaseURL: be.URL + "/v1", Protocols: []string{inference.OpenAIChatCompletions},
		APIKey: inference.KeySource{FromEnv: "K"}}
	claude := inference.Route{Name: "a", BaseURL: be.URL, Protocols: []string{inference.AnthropicMessages},
		APIKey: inference.KeySource{FromEnv: "K"}, Translate: true}
	var recs []inference.Record
	srv := newRouter(t, []inference.Route{openai, claude}, &recs)
	sameLength := regexp.MustCompile(`Bearer sk-\S{` + fmt.Sprint(len(key)-3) + `}`)
	for _, tc := range []struct {
		mode, route string
		status      int
		want        string // in the body
	}{
		{"ok-body", "o", 200, "you authenticated with Bearer sk-"},
		{"ok-header", "o", 200, "hello"},
		{"ok-split", "o", 200, " end"},
		{"sse", "o", 200, "[DONE]"},
		{"err-header", "o", 401, "bad key"},
		{"err-b64", "o", 401, "bad credential"},
		{"err-json", "o", 401, "Incorrect API key provided"},
		{"err-json", "a", 401, "Incorrect API key provided"},
		{"err-hex", "o", 403, "key digest input"},
		{"err-deflate", "o", 401, "bad key sk-"},
		{"err-br", "o", 502, "content encoding"},
		{"err-cut", "o", 500, "xxxx"},
	} {
		t.Run(tc.mode+"/"+tc.route, func(t *testing.T) {
			req, _ := http.NewRequest("POST", srv.URL+"/v1/chat/completions",
				strings.NewReader(`{"model":"route:`+tc.route+`","messages":[{"role":"user","content":"hi"}]}`))
			req.Header.Set("X-Mode", tc.mode)
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			var head strings.Builder
			_ = resp.Header.Write(&head)
			if l := leaks(head.String() + string(body)); len(l) > 0 {
				t.Errorf("the key reached the client as %q:\n%s\n%.2000s", l, head.String(), body)
			}
			if resp.StatusCode != tc.status || !strings.Contains(string(body), tc.want) {
				t.Errorf("status %d, body %.300q; want %d with %q", resp.StatusCode, body, tc.status, tc.want)
			}
			if tc.mode == "ok-body" && !sameLength.Match(body) {
				t.Errorf("the key was not replaced by a surrogate of its shape: %.300q", body)
			}
			if tc.mode == "ok-header" && !strings.HasPrefix(resp.Header.Get("X-Debug-Auth"), "Bearer sk-") {
				t.Errorf("X-Debug-Auth %q: the header should stay, with a surrogate", resp.Header.Get("X-Debug-Auth"))
			}
			if tc.mode == "err-deflate" && resp.Header.Get("Content-Encoding") != "" {
				t.Errorf("decoded body still labelled %q", resp.Header.Get("Content-Encoding"))
			}
		})
	}
	if l := leaks(fmt.Sprintf("%+v", recs)); len(l) > 0 {
		t.Errorf("the key reached the audit records as %q", l)
	}
}

// TestRouterScrubbedStreamFlows: scrubbing does not hold an event back
// until the next one; the client gets each as the backend sends it.
func TestRouterScrubbedStreamFlows(t *testing.T) {
	release := make(chan struct{})
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", r.Header.Get("Authorization"))
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	defer be.Close()
	defer close(release)
	var recs []inference.Record
	srv := newRouter(t, []inference.Route{{Name: "o", BaseURL: be.URL + "/v1", Protocols: []string{inference.OpenAIChatCompletions},
		APIKey: inference.KeySource{FromEnv: "K"}}}, &recs)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true,"messages":[]}`))
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil {
		t.Fatalf("first event not delivered before the backend sent the next: %v", err)
	}
	if !strings.Contains(line, "Bearer sk-") || len(leaks(line)) > 0 {
		t.Errorf("first event %q: want the surrogate in place of the key", line)
	}
}

// TestRouterRefusesUnmaskableKey: a key too short to be told apart from
// ordinary text cannot be scrubbed, so its route does not start; the
// error says why without printing the key.
func TestRouterRefusesUnmaskableKey(t *testing.T) {
	_, err := inference.NewRouter(inference.Config{Routes: []inference.Route{{Name: "o", BaseURL: "http://127.0.0.1:1/v1",
		Protocols: []string{inference.OpenAIChatCompletions}, APIKey: inference.KeySource{FromEnv: "K"}}}},
		inference.Options{Getenv: func(string) string { return "sk-1234" }, Mask: New})
	if err == nil || !strings.Contains(err.Error(), "cannot be kept out of the backend's answers") || strings.Contains(err.Error(), "sk-1234") {
		t.Fatalf("err = %v", err)
	}
}
