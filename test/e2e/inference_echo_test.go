package e2e

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/testutil/keyecho"
)

// A model backend that reflects the credential it received (a debugging
// proxy, an error page quoting the request's headers) must not hand the
// operator's route key to the workload, whatever the status, wherever
// and however it writes it: curl inside sees a surrogate, or, for a body
// corral cannot decode, a 502.

const inferenceEchoKey = "sk-operator-ECHO0123456789abcdefXYZ"

const inferenceEchoScript = `#!/bin/bash
cd "$W" || exit 99
for mode in ok-body ok-header ok-split sse err-header err-b64 err-json err-hex err-deflate err-br err-cut; do
  echo "=== $mode"
  curl -sS --max-time 20 -D head -o body --compressed -H 'Content-Type: application/json' \
    -d '{"model":"gpt-4o","messages":[{"role":"user","content":"'$mode'"}]}' \
    https://inference.local/v1/chat/completions
  cat head; tail -c 3000 body
  echo
done
echo "=== end"
`

// inferenceEchoBackend reflects the key in the mode the request's first
// message names.
func inferenceEchoBackend(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: keyecho.Handler(func(r *http.Request) string {
		var req struct {
			Messages []struct{ Content string } `json:"messages"`
		}
		body, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(body, &req)
		if len(req.Messages) == 0 {
			return ""
		}
		return req.Messages[0].Content
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

func TestInferenceKeyEchoScrubbed(t *testing.T) {
	requireRoot(t)
	url := inferenceEchoBackend(t)
	forEachMode(t, true, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		writeOwned(t, m, filepath.Join(fx.W, "echo.sh"), []byte(inferenceEchoScript), 0o755)
		r := runCorral(t, fx, runOpts{
			args:    []string{"/usr/bin/bash", filepath.Join(fx.W, "echo.sh")},
			policy:  inferencePolicy(url, "llama-one"),
			env:     []string{"CORRAL_TEST_MODEL_KEY=" + inferenceEchoKey},
			flags:   []string{"--env", "W=" + fx.W},
			timeout: 90 * time.Second,
		})
		if r.code != 0 || !strings.Contains(r.stdout, "=== end") {
			t.Fatalf("the script did not run through\n%s", r)
		}
		// What each answer must still be, so that a leak cannot hide
		// behind a request that failed.
		want := map[string]string{
			"ok-body":     "HTTP/1.1 200|HTTP/2 200|you authenticated with Bearer sk-",
			"ok-header":   "HTTP/1.1 200|HTTP/2 200|X-Debug-Auth: Bearer sk-",
			"ok-split":    "HTTP/1.1 200|HTTP/2 200| end",
			"sse":         "HTTP/1.1 200|HTTP/2 200|[DONE]",
			"err-header":  "HTTP/1.1 401|HTTP/2 401|token=\"sk-",
			"err-b64":     "HTTP/1.1 401|HTTP/2 401|bad credential ",
			"err-json":    "HTTP/1.1 401|HTTP/2 401|Incorrect API key provided",
			"err-hex":     "HTTP/1.1 403|HTTP/2 403|key digest input",
			"err-deflate": "HTTP/1.1 401|HTTP/2 401|bad key sk-",
			"err-br":      "HTTP/1.1 502|HTTP/2 502|cannot decode",
			"err-cut":     "HTTP/1.1 500|HTTP/2 500|xxxx",
		}
		got := sections(r.stdout)
		for name, w := range want {
			out := got[name]
			forms := leakedIn(out, inferenceEchoKey)
			if strings.Contains(out, inferenceEchoKey[:20]) && len(forms) == 0 {
				forms = append(forms, "prefix (cut short)")
			}
			if len(forms) > 0 {
				t.Errorf("%s: the route key reached the workload as %q", name, forms)
			}
			parts := strings.Split(w, "|")
			if !strings.Contains(out, parts[0]) && !strings.Contains(out, parts[1]) || !strings.Contains(strings.ToLower(out), strings.ToLower(parts[2])) {
				t.Errorf("%s: want status %s with %q in what curl printed:\n%.1500s", name, parts[0], parts[2], out)
			}
		}
	})
}
