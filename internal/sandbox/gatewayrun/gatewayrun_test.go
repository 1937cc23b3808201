package gatewayrun

import (
	"bytes"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/inference"
	"github.com/corral-sandbox/corral/internal/l7/secrets"
	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/corral-sandbox/corral/internal/reload"
	"github.com/corral-sandbox/corral/internal/sandbox"
)

const gatewaySecretPolicy = `version: 1
network_policies:
  gh:
    endpoints:
      - {host: api.github.com, port: 443, protocol: rest, tls: terminate, access: read-only}
secrets:
  GH_TOKEN: {from_gateway: gh-token, hosts: [api.github.com]}
`

const (
	firstValue   = "ghp_firstVALUE0123456789"
	rotatedValue = "ghp_rotateVALUE012345678"
)

func mustPolicy(t *testing.T, src string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(src), "test")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestGatewayCachedStartRefusesGatewaySecrets: values are never cached, so
// a start from the cached policy cannot load secrets from_gateway.
func TestGatewayCachedStartRefusesGatewaySecrets(t *testing.T) {
	withSecret := mustPolicy(t, gatewaySecretPolicy)
	plain := mustPolicy(t, "version: 1\n")
	cached := &Gateway{cached: true}
	err := cached.CheckSecrets(withSecret)
	if err == nil || !strings.Contains(err.Error(), "gh-token") || !strings.Contains(err.Error(), "never cached") {
		t.Fatalf("cached start with from_gateway: %v", err)
	}
	if err := cached.CheckSecrets(plain); err != nil {
		t.Errorf("cached start without from_gateway: %v", err)
	}
	if err := (&Gateway{}).CheckSecrets(withSecret); err != nil {
		t.Errorf("live start: %v", err)
	}
}

type gatewayHarness struct {
	g     *Gateway
	set   *secrets.Set
	r     *reload.Reloader
	audit *bytes.Buffer
	logs  *bytes.Buffer
	sur   string
}

func newGatewayHarness(t *testing.T) *gatewayHarness {
	t.Helper()
	c, err := mustPolicy(t, gatewaySecretPolicy).Compile()
	if err != nil {
		t.Fatal(err)
	}
	h := &gatewayHarness{audit: &bytes.Buffer{}, logs: &bytes.Buffer{}}
	h.g = &Gateway{aud: audit.New(h.audit), log: slog.New(slog.NewTextHandler(h.logs, nil)), values: map[string][]byte{"gh-token": []byte(firstValue)}}
	if h.set, err = secrets.LoadFrom(c.Secrets, secrets.Sources{Getenv: func(string) string { return "" }, Gateway: h.g.SecretLookup()}); err != nil {
		t.Fatal(err)
	}
	if h.g.values != nil {
		t.Error("the gateway keeps the values after handing them over")
	}
	if h.r, err = reload.New(c, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	h.sur = strings.TrimPrefix(h.set.Env()[0], "GH_TOKEN=")
	return h
}

func (h *gatewayHarness) swapped() string {
	hd := http.Header{"Authorization": {"Bearer " + h.sur}}
	h.set.Swap("api.github.com", hd)
	return strings.TrimPrefix(hd.Get("Authorization"), "Bearer ")
}

// TestGatewaySecretUpdate: a new value pushed by the gateway is what the
// proxy swaps in from then on; one that does not fit the surrogate is
// refused, audited by name, and the old value stays. No value reaches
// the audit trail or the log.
func TestGatewaySecretUpdate(t *testing.T) {
	h := newGatewayHarness(t)
	handlers := h.g.handlers(sandbox.GatewayTargets{Policy: h.r, Secrets: h.set})
	if got := h.swapped(); got != firstValue {
		t.Fatalf("start: swapped %q", got)
	}
	handlers.Secrets(map[string][]byte{"gh-token": []byte(rotatedValue), "unrelated": []byte("xxxxxxxxxxxxxxxx")})
	if got := h.swapped(); got != rotatedValue {
		t.Fatalf("after the update: swapped %q", got)
	}
	const misfit = "ghp_tooLONGvalue0123456789012345"
	handlers.Secrets(map[string][]byte{"gh-token": []byte(misfit)})
	if got := h.swapped(); got != rotatedValue {
		t.Fatalf("after a refused update: swapped %q", got)
	}
	if !strings.Contains(h.audit.String(), `"source":"gateway:secrets"`) || !strings.Contains(h.audit.String(), "GH_TOKEN") {
		t.Errorf("refused update not audited: %s", h.audit)
	}
	for _, v := range []string{firstValue, rotatedValue, misfit} {
		if strings.Contains(h.audit.String(), v) || strings.Contains(h.logs.String(), v) {
			t.Errorf("a value reached the audit trail or the log:\n%s\n%s", h.audit, h.logs)
		}
	}
}

// TestGatewayRoutesUpdate: routes pushed by the gateway go to the router;
// a bad document is reported (log and audit) and never reaches it; with
// routes fixed locally nothing is applied.
func TestGatewayRoutesUpdate(t *testing.T) {
	h := newGatewayHarness(t)
	var applied []inference.Config
	handlers := h.g.handlers(sandbox.GatewayTargets{Policy: h.r, Secrets: h.set, Routes: func(c inference.Config) error {
		applied = append(applied, c)
		return nil
	}})
	good := "routes:\n  - {name: local, base_url: \"http://127.0.0.1:8000/v1\", protocols: [openai_chat_completions]}\n"
	if err := handlers.Routes(2, []byte(good)); err != nil || len(applied) != 1 || applied[0].Routes[0].Name != "local" {
		t.Fatalf("good routes: %v, applied %+v", err, applied)
	}
	for _, bad := range []string{"routes: []\nunknown: 1\n", "routes:\n  - {name: x, base_url: ftp://nowhere, protocols: [smoke_signals]}\n"} {
		if err := handlers.Routes(3, []byte(bad)); err == nil {
			t.Errorf("bad routes %q accepted", bad)
		}
	}
	if len(applied) != 1 {
		t.Fatalf("bad routes reached the router: %+v", applied)
	}
	if !strings.Contains(h.audit.String(), `"source":"gateway:routes v3"`) || !strings.Contains(h.logs.String(), "model routes from the gateway refused") {
		t.Errorf("bad routes not reported:\n%s\n%s", h.audit, h.logs)
	}
	fixed := h.g.handlers(sandbox.GatewayTargets{Policy: h.r, RoutesFixed: "--inference-routes given locally wins"})
	if err := fixed.Routes(4, []byte(good)); err != nil || len(applied) != 1 {
		t.Fatalf("routes applied although fixed locally: %v", err)
	}
	if !strings.Contains(h.logs.String(), "--inference-routes given locally wins") {
		t.Errorf("no warning for routes fixed locally: %s", h.logs)
	}
}

// TestGatewayHostKeys: a policy or routes document from the gateway that
// reads a key from this host's files or environment is refused unless the
// supervisor was started with --gateway-host-keys; from_gateway needs no
// such trust.
func TestGatewayHostKeys(t *testing.T) {
	hostFile := strings.Replace(gatewaySecretPolicy, "from_gateway: gh-token", "from_file: /root/.ssh/id_ed25519", 1)
	hostEnv := "version: 1\ninference:\n  routes:\n    - {name: r, base_url: \"https://m.test/v1\", protocols: [openai_chat_completions], api_key: {from_env: AWS_SECRET_ACCESS_KEY}}\n"
	routes := "routes:\n  - {name: r, base_url: \"https://m.test/v1\", protocols: [openai_chat_completions], api_key: {from_file: /etc/shadow}}\n"
	h := newGatewayHarness(t)
	for _, doc := range []string{hostFile, hostEnv} {
		if _, err := h.g.policy([]byte(doc), "gateway:v2"); err == nil || !strings.Contains(err.Error(), "--gateway-host-keys") {
			t.Errorf("policy %q: %v, want a refusal naming --gateway-host-keys", doc, err)
		}
	}
	if _, err := h.g.routeDoc([]byte(routes)); err == nil || !strings.Contains(err.Error(), "routes[0].api_key.from_file /etc/shadow") {
		t.Errorf("routes reading /etc/shadow: %v, want refused", err)
	}
	if _, err := h.g.policy([]byte(gatewaySecretPolicy), "gateway:v2"); err != nil {
		t.Errorf("from_gateway refused: %v", err)
	}
	h.g.hostKeys = true
	for _, doc := range []string{hostFile, hostEnv} {
		if _, err := h.g.policy([]byte(doc), "gateway:v2"); err != nil {
			t.Errorf("policy %q with --gateway-host-keys: %v", doc, err)
		}
	}
	if _, err := h.g.routeDoc([]byte(routes)); err != nil {
		t.Errorf("routes with --gateway-host-keys: %v", err)
	}
}
