package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/internal/sandbox"
)

// TestRunFromGatewayNeedsGateway: a policy taking a secret from_gateway
// stops the run before anything starts when there is no gateway.
func TestRunFromGatewayNeedsGateway(t *testing.T) {
	t.Setenv("CORRAL_GATEWAY", "")
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	err := os.WriteFile(pol, []byte(`version: 1
network_policies:
  gh:
    endpoints:
      - {host: api.github.com, port: 443, protocol: rest, tls: terminate, access: read-only}
secrets:
  GH_TOKEN: {from_gateway: gh-token, hosts: [api.github.com]}
`), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	code := execute(context.Background(), []string{"run", "--policy", pol, "--state-dir", filepath.Join(dir, "state"), "--", "true"}, strings.NewReader(""), &out, &errOut)
	if code != sandbox.ExitSetupFailed || !strings.Contains(errOut.String(), "gh-token from_gateway, but corral run has no --gateway") {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut.String())
	}
}
