package inference

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/testutil/fakemodel"
)

// sdkDir is a directory where `npm install openai @anthropic-ai/sdk` ran;
// .ci/run sets CORRAL_NODE_SDKS to it.
func sdkDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("CORRAL_NODE_SDKS")
	if dir == "" {
		t.Skip("CORRAL_NODE_SDKS is not set (a directory where `npm install openai @anthropic-ai/sdk` ran)")
	}
	for _, p := range []string{"openai", "@anthropic-ai/sdk"} {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", p, "package.json")); err != nil {
			t.Skipf("%s is not installed under %s: %v", p, dir, err)
		}
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not installed")
	}
	return dir
}

// TestOfficialSDKs drives the official OpenAI and Anthropic Node SDKs
// against the Router: once with an OpenAI-only backend (the Anthropic SDK
// is translated) and once with an Anthropic-only backend (the OpenAI SDK
// is translated).
func TestOfficialSDKs(t *testing.T) {
	dir := sdkDir(t)
	want := map[string]any{
		"openai_plain": "tok0 tok1 tok2 ", "openai_plain_usage": 3.0,
		"openai_stream": "tok0 tok1 tok2 ", "openai_stream_usage": 3.0,
		"openai_tool": "weather " + fakemodel.ToolArgs, "openai_after_tool": "tok0 tok1 tok2 ",
		"anthropic_plain": "tok0 tok1 tok2 ", "anthropic_plain_usage": 3.0,
		"anthropic_stream": "tok0 tok1 tok2 ", "anthropic_stream_usage": 3.0,
		"anthropic_tool": "weather " + fakemodel.ToolArgs, "anthropic_after_tool": "tok0 tok1 tok2 ",
	}
	for _, tc := range []struct {
		name   string
		route  func(url string) Route
		models []any
	}{
		{"openai backend", translatingOpenAIRoute, []any{"qwen-local"}},
		{"anthropic backend", translatingAnthropicRoute, []any{"claude-real"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			be := fakemodel.New()
			defer be.Close()
			rt := tc.route(be.URL)
			rt.Protocols = append(rt.Protocols, ModelDiscovery)
			h := newHarness(t, rt)
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, "node", "testdata/sdk.cjs", h.srv.URL)
			cmd.Env = append(os.Environ(), "NODE_PATH="+filepath.Join(dir, "node_modules"),
				"OPENAI_API_KEY="+Placeholder, "ANTHROPIC_API_KEY="+Placeholder)
			out, err := cmd.Output()
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			h.note(string(out), string(stderr))
			if err != nil {
				t.Fatalf("node: %v\n%s", err, stderr)
			}
			var got map[string]any
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("node output %q: %v", out, err)
			}
			models := got["models"]
			delete(got, "models")
			if !reflect.DeepEqual(got, want) {
				t.Errorf("clients got\n%v\nwant\n%v", got, want)
			}
			if !reflect.DeepEqual(models, tc.models) {
				t.Errorf("models %v", models)
			}
			for _, req := range be.Requests() {
				if m := req.JSON()["model"]; m != rt.Model {
					t.Errorf("backend got model %v", m)
				}
				if req.Header.Get("Authorization") != "Bearer "+testKey && req.Header.Get("X-Api-Key") != testKey {
					t.Errorf("backend request without the route's key")
				}
			}
		})
	}
}
