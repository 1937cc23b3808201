package fleet

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Credentials go to the gateway from stdin or a file, never back out:
// list shows names only; a value too large or empty is refused before
// anything is sent.
func TestGatewaySecretCommands(t *testing.T) {
	g := startTestGateway(t)
	g.useEnv()
	if r := runCorral(t, "s3cr3t-value\n", "gateway", "secret", "set", "GH_TOKEN"); r.code != 0 || !strings.Contains(r.stdout, "stored GH_TOKEN (12 bytes)") {
		t.Fatalf("secret set from stdin: %s", r)
	}
	f := filepath.Join(t.TempDir(), "v")
	if err := os.WriteFile(f, []byte("other\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := runCorral(t, "", "gateway", "secret", "set", "NPM_TOKEN", "--from-file", f); r.code != 0 {
		t.Fatalf("secret set from a file: %s", r)
	}
	r := runCorral(t, "", "gateway", "secret", "list")
	if r.code != 0 || r.stdout != "GH_TOKEN\nNPM_TOKEN\n" || strings.Contains(r.stdout, "s3cr3t") {
		t.Fatalf("secret list: %s", r)
	}
	if r := runCorral(t, "", "gateway", "secret", "set", "EMPTY"); r.code != 2 || !strings.Contains(r.stderr, "no value") {
		t.Fatalf("empty value: %s", r)
	}
	if r := runCorral(t, strings.Repeat("x", maxSecretBytes+1), "gateway", "secret", "set", "BIG"); r.code != 2 || !strings.Contains(r.stderr, "KiB") {
		t.Fatalf("oversized value: %s", r)
	}
	if r := runCorral(t, "", "gateway", "secret", "delete", "GH_TOKEN"); r.code != 0 {
		t.Fatalf("secret delete: %s", r)
	}
	if r := runCorral(t, "", "gateway", "secret", "list"); r.stdout != "NPM_TOKEN\n" {
		t.Fatalf("after delete: %s", r)
	}
}

// Model routes set from a file come back with their version; a document
// the inference checker refuses is reported as it words it.
func TestGatewayRoutesCommands(t *testing.T) {
	g := startTestGateway(t)
	g.useEnv()
	if r := runCorral(t, "", "gateway", "routes", "get"); r.code != 1 || !strings.Contains(r.stderr, "no model routes") {
		t.Fatalf("routes get with none: %s", r)
	}
	dir := t.TempDir()
	good := filepath.Join(dir, "routes.yaml")
	if err := os.WriteFile(good, []byte("routes:\n  - name: m\n    base_url: https://models.example/v1\n    protocols: [openai_chat_completions]\n    api_key: {from_env: MODEL_KEY}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := runCorral(t, "", "gateway", "routes", "set", good); r.code != 0 || !strings.Contains(r.stdout, "model routes version 1") {
		t.Fatalf("routes set: %s", r)
	}
	if r := runCorral(t, "", "gateway", "routes", "get"); r.code != 0 || !strings.Contains(r.stdout, "base_url: https://models.example/v1") {
		t.Fatalf("routes get: %s", r)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("routes:\n  - name: m\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := runCorral(t, "", "gateway", "routes", "set", bad); r.code == 0 {
		t.Fatalf("a route without base_url was accepted: %s", r)
	}
}
