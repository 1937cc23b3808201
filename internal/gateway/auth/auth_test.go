package auth

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/internal/gateway/store"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1/gatewayv1connect"
)

func TestEnsurePKI(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	p1, err := EnsurePKI(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{fileCAKey, fileServerKey} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v, %v", f, fi.Mode(), err)
		}
	}
	for _, n := range []string{"localhost", "127.0.0.1", "::1"} {
		if err := p1.Server.Leaf.VerifyHostname(n); err != nil {
			t.Errorf("server certificate: %v", err)
		}
	}
	// A restart reuses everything; a new --san re-issues only the server
	// certificate, under the same CA.
	p2, err := EnsurePKI(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !p2.CA.Equal(p1.CA) || !p2.Server.Leaf.Equal(p1.Server.Leaf) {
		t.Fatal("a restart made new certificates")
	}
	p3, err := EnsurePKI(dir, []string{"gw.example.com", "192.0.2.10"})
	if err != nil {
		t.Fatal(err)
	}
	if !p3.CA.Equal(p1.CA) || p3.Server.Leaf.Equal(p1.Server.Leaf) {
		t.Fatal("a new SAN should re-issue the server certificate under the same CA")
	}
	for _, n := range []string{"gw.example.com", "192.0.2.10"} {
		if err := p3.Server.Leaf.VerifyHostname(n); err != nil {
			t.Errorf("re-issued certificate: %v", err)
		}
	}
}

func TestSecretsAndHash(t *testing.T) {
	for kind, re := range map[store.TokenKind]string{
		store.TokenUser:    `^cgw_u_[a-z2-7]{32}$`,
		store.TokenSandbox: `^cgw_s_[a-z2-7]{32}$`,
		store.TokenJoin:    `^cgw_j_[a-z2-7]{32}$`,
	} {
		s := NewSecret(kind)
		if !regexp.MustCompile(re).MatchString(s) {
			t.Errorf("%s secret %q does not match %s", kind, s, re)
		}
		if s == NewSecret(kind) {
			t.Errorf("two %s secrets are equal", kind)
		}
	}
	if Hash("x") == "x" || len(Hash("x")) != 64 {
		t.Fatalf("Hash = %q", Hash("x"))
	}
}

func TestAllowedFailsClosed(t *testing.T) {
	for _, tc := range []struct {
		kind store.TokenKind
		proc string
		want bool
	}{
		{store.TokenUser, gatewayv1connect.SandboxServiceCreateProcedure, true},
		{store.TokenUser, gatewayv1connect.SupervisorServiceSubscribeProcedure, false},
		{store.TokenSandbox, gatewayv1connect.SupervisorServiceSubscribeProcedure, true},
		{store.TokenSandbox, gatewayv1connect.SupervisorServiceJoinProcedure, false},
		{store.TokenSandbox, gatewayv1connect.PolicyServiceSetProcedure, false},
		{store.TokenJoin, gatewayv1connect.SupervisorServiceJoinProcedure, true},
		{store.TokenJoin, gatewayv1connect.SupervisorServiceSubscribeProcedure, false},
		{"admin", gatewayv1connect.SandboxServiceCreateProcedure, false},
		{store.TokenUser, "/corral.gateway.v1.SandboxService", false},
		{store.TokenUser, "/corral.gateway.v2.SandboxService/Create", false},
	} {
		if got := Allowed(tc.kind, tc.proc); got != tc.want {
			t.Errorf("Allowed(%s, %s) = %v", tc.kind, tc.proc, got)
		}
	}
}

// TestIssueClientNames: a client certificate's name is a user name and
// the files' names in the output directory, so one that could reach
// outside it (a separator, "..") or is not a plain name is refused and
// nothing is written.
func TestIssueClientNames(t *testing.T) {
	p, err := EnsurePKI(filepath.Join(t.TempDir(), "tls"), nil)
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	out := filepath.Join(base, "out")
	for _, name := range []string{"../escaped", "a/b", "..", ".hidden", "a..b", "/abs", "tab\tname", "esc\x1b[2J", strings.Repeat("n", 65)} {
		if _, _, err := p.IssueClient(name, out); err == nil || !strings.Contains(err.Error(), "--name") {
			t.Errorf("IssueClient(%q): %v, want a refusal naming --name", name, err)
		}
	}
	var written []string
	_ = filepath.WalkDir(base, func(path string, d fs.DirEntry, _ error) error {
		if !d.IsDir() {
			written = append(written, path)
		}
		return nil
	})
	if len(written) > 0 {
		t.Fatalf("refused names wrote %q", written)
	}
	path, cert, err := p.IssueClient("carol.smith@example", out)
	if err != nil || path != filepath.Join(out, "carol.smith@example.pem") || cert.Subject.CommonName != "carol.smith@example" {
		t.Fatalf("a plain name: %q, %v", path, err)
	}
}
