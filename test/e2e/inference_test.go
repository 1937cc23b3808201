package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/testutil/fakemodel"
)

// The inference tests run real clients in a proxy-mode sandbox against
// inference.local, which corral routes to a fake model backend listening
// on the host's loopback: the local model server a route (and only a
// route) may name. The key is the operator's; the workload never holds it.

const modelKey = "sk-operator-0123456789abcdefABCDEF"

// inferenceScript exercises inference.local with curl, then waits for the
// test to reload the policy and asks again.
const inferenceScript = `#!/bin/bash
cd "$W" || exit 99
C="curl -sS --max-time 20"
chat='{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}'
echo "ENV_BASE $OPENAI_BASE_URL $ANTHROPIC_BASE_URL"
echo "ENV_KEY $OPENAI_API_KEY"
env | grep -v '^KEYPROBE=' | grep -c -- "$KEYPROBE" | sed 's/^/KEY_IN_ENV /'
echo "H1 $($C -H 'Authorization: Bearer client-secret' -H 'x-api-key: client-secret' -H 'Content-Type: application/json' -d "$chat" https://inference.local/v1/chat/completions)"
echo "H2 $($C --http2 -H 'Content-Type: application/json' -d "$chat" https://inference.local/v1/chat/completions)"
echo "PLAIN $($C -H 'Content-Type: application/json' -d "$chat" http://inference.local/v1/chat/completions)"
echo "STREAM $($C -N -H 'Content-Type: application/json' -d '{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}' https://inference.local/v1/chat/completions | grep -c '^data:')"
echo "MODELS $($C https://inference.local/v1/models)"
echo "OTHER $($C -o /dev/null -w '%{http_code}' https://inference.local/admin)"
echo "TRANSPARENT $($C --noproxy '*' -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' -d "$chat" https://inference.local/v1/chat/completions 2>&1)"
echo "SOCKS $($C --noproxy '' -x socks5h://$CAPTURE:1080 -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' -d "$chat" https://inference.local/v1/chat/completions 2>&1)"
echo "PROXY $(HTTPS_PROXY= https_proxy= $C -o /dev/null -w '%{http_code}' -x http://$CAPTURE:3128 -H 'Content-Type: application/json' -d "$chat" https://inference.local/v1/chat/completions 2>&1)"
if [ -n "$SDKS" ]; then
	echo "SDK $(NODE_PATH=$SDKS/node_modules node sdk.cjs https://inference.local 2>&1 | tail -1)"
fi
echo PHASE1
for i in $(seq 200); do [ -e reloaded ] && break; sleep 0.1; done
echo "RELOADED $($C -H 'Content-Type: application/json' -d "$chat" https://inference.local/v1/chat/completions)"
`

func inferencePolicy(url, model string) string {
	return basePolicy(fmt.Sprintf(`network:
  mode: proxy
inference:
  routes:
    - name: local
      base_url: %s/v1
      protocols: [openai_chat_completions, model_discovery]
      model: %s
      translate: true
      api_key: {from_env: CORRAL_TEST_MODEL_KEY}
`, url, model))
}

func TestInference(t *testing.T) {
	requireRoot(t)
	sdks := os.Getenv("CORRAL_NODE_SDKS")
	if sdks == "" && noSkip() {
		t.Fatal("CORRAL_NODE_SDKS is not set: .ci/run installs the official Node SDKs there")
	}
	sdkScript, err := os.ReadFile("../../internal/inference/testdata/sdk.cjs")
	if err != nil {
		t.Fatal(err)
	}
	forEachMode(t, true, func(t *testing.T, m *mode) {
		fake := fakemodel.New()
		t.Cleanup(fake.Close)
		fx := newFixture(t, m)
		writeOwned(t, m, filepath.Join(fx.W, "inf.sh"), []byte(inferenceScript), 0o755)
		writeOwned(t, m, filepath.Join(fx.W, "sdk.cjs"), sdkScript, 0o644)
		p := startCorral(t, fx, runOpts{
			args:   []string{"/usr/bin/bash", filepath.Join(fx.W, "inf.sh")},
			policy: inferencePolicy(fake.URL, "llama-one"),
			env:    []string{"CORRAL_TEST_MODEL_KEY=" + modelKey},
			flags: []string{"--env", "W=" + fx.W, "--env", "KEYPROBE=" + modelKey[:20], "--env", "SDKS=" + sdks,
				"--env", "CAPTURE=" + captureAddr},
			timeout: 90 * time.Second,
		})
		waitOut(t, p, "PHASE1", 60*time.Second)
		id := ""
		for _, e := range readEvents(t, p.audit) {
			if e["event"] == "sandbox.start" {
				id = fmt.Sprint(e["sandbox_id"])
			}
		}
		next := fx.writePolicy(t, inferencePolicy(fake.URL, "llama-two"))
		if code, out := corralCLI(t, m, "policy", "set", "--state-dir", fx.state, "--sandbox", id, next); code != 0 {
			t.Fatalf("policy set failed (exit %d):\n%s", code, out)
		}
		fx.signal(t, "reloaded")
		r := p.wait()
		out := r.stdout
		line := func(prefix string) string {
			for _, l := range strings.Split(out, "\n") {
				if strings.HasPrefix(l, prefix+" ") {
					return strings.TrimPrefix(l, prefix+" ")
				}
			}
			t.Errorf("no %s line\n%s", prefix, r)
			return ""
		}
		if got := line("ENV_BASE"); got != "https://inference.local/v1 https://inference.local" {
			t.Errorf("base URLs in the workload: %q", got)
		}
		if got := line("ENV_KEY"); got == "" || strings.Contains(got, modelKey[:10]) {
			t.Errorf("OPENAI_API_KEY in the workload is %q, want the placeholder", got)
		}
		if got := line("KEY_IN_ENV"); got != "0" {
			t.Errorf("the operator's key is in the workload's environment (%s)", got)
		}
		for _, prefix := range []string{"H1", "H2", "PLAIN", "RELOADED"} {
			var resp struct {
				Choices []struct {
					Message struct{ Content string } `json:"message"`
				} `json:"choices"`
			}
			if err := json.Unmarshal([]byte(line(prefix)), &resp); err != nil || len(resp.Choices) == 0 || resp.Choices[0].Message.Content == "" {
				t.Errorf("%s: not a chat completion: %q (%v)", prefix, line(prefix), err)
			}
		}
		if got := line("STREAM"); got == "" || got == "0" || got == "1" {
			t.Errorf("a streamed answer arrived as %s SSE events", got)
		}
		if got := line("MODELS"); !strings.Contains(got, "llama-one") {
			t.Errorf("/v1/models: %q, want the route's model", got)
		}
		if got := line("OTHER"); got != "403" {
			t.Errorf("a non-inference path answered %s, want 403", got)
		}
		// Every listener reaches it: the synthetic address through the
		// transparent capture, and SOCKS5 with the name.
		for _, via := range []string{"TRANSPARENT", "SOCKS"} {
			if got := line(via); got != "200" {
				t.Errorf("inference.local %s answered %s, want 200", strings.ToLower(via), got)
			}
		}
		if got := line("PROXY"); got != "200" {
			t.Errorf("inference.local through the CONNECT proxy answered %s, want 200", got)
		}
		if sdks != "" {
			var sdk map[string]any
			if err := json.Unmarshal([]byte(line("SDK")), &sdk); err != nil {
				t.Errorf("the official SDKs failed: %s", line("SDK"))
			}
			for _, k := range []string{"openai_plain", "openai_stream", "openai_tool", "anthropic_plain", "anthropic_stream", "anthropic_tool"} {
				if s, _ := sdk[k].(string); s == "" {
					t.Errorf("SDK result %s is empty: %v", k, sdk)
				}
			}
		}

		// What the backend received: the operator's key, the route's
		// model, and nothing of the client's credentials.
		reqs := fake.Requests()
		if len(reqs) < 5 {
			t.Fatalf("the backend got %d requests", len(reqs))
		}
		for _, q := range reqs {
			if got := q.Header.Get("Authorization"); got != "Bearer "+modelKey {
				t.Errorf("%s %s reached the backend with Authorization %q", q.Method, q.Path, got)
			}
			if q.Header.Get("X-Api-Key") != "" || strings.Contains(fmt.Sprint(q.Header), "client-secret") {
				t.Errorf("a client credential reached the backend: %v", q.Header)
			}
		}
		models := map[string]bool{}
		for _, q := range reqs {
			if m, ok := q.JSON()["model"].(string); ok {
				models[m] = true
			}
		}
		if !models["llama-one"] || !models["llama-two"] || models["gpt-4o"] {
			t.Errorf("models the backend saw: %v; want llama-one, then llama-two after the reload, never the client's", models)
		}
		for _, via := range []string{"transparent", "socks5", "http_connect", "http_forward"} {
			r.requireEvent(t, "net.connect.allowed", map[string]any{"host": "inference.local", "via": via, "policy": "inference.local"})
		}
		ev := r.requireEvent(t, "inference.request", map[string]any{"route": "local", "protocol": "openai_chat_completions",
			"client_model": "gpt-4o", "routed_model": "llama-one", "status": 200.0, "binary": "/usr/bin/curl"})
		if n, _ := ev["output_tokens"].(float64); n == 0 {
			t.Errorf("no token usage in %v", ev)
		}
		audit, _ := os.ReadFile(p.audit)
		for what, text := range map[string]string{"audit log": string(audit), "stdout": r.stdout, "stderr": r.stderr} {
			if strings.Contains(text, modelKey) {
				t.Errorf("the key appears in the %s", what)
			}
		}
	})
}
