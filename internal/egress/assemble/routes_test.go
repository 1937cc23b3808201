package assemble

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/egress/egresstest"
	"github.com/corral-sandbox/corral/internal/inference"
	"github.com/corral-sandbox/corral/internal/policy"
)

func modelRoute(model string) inference.Config {
	return inference.Config{Routes: []inference.Route{{
		Name: model, BaseURL: "http://127.0.0.1:9/v1", Model: model,
		Protocols: []string{inference.OpenAIChatCompletions, inference.ModelDiscovery},
	}}}
}

// modelsListed is inference.local's GET /v1/models, which names the
// routes in force.
func modelsListed(t *testing.T, e *Egress) string {
	t.Helper()
	w := httptest.NewRecorder()
	e.router.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "https://inference.local/v1/models", nil))
	if w.Code != http.StatusOK {
		t.Fatalf("GET /v1/models: %d %s", w.Code, w.Body)
	}
	return w.Body.String()
}

// TestSetRoutes: routes set on the running egress (the gateway's) replace
// the policy's at once, survive a policy reload, and routes that do not
// build leave the ones in force.
func TestSetRoutes(t *testing.T) {
	p := allowing("a.example.com")
	p.Inference = new(modelRoute("policy-model"))
	e := newEgress(t, p, &egresstest.AuditBuffer{})
	if got := modelsListed(t, e); !strings.Contains(got, "policy-model") {
		t.Fatalf("start: %s", got)
	}
	if err := e.SetRoutes(modelRoute("gateway-model")); err != nil {
		t.Fatal(err)
	}
	if got := modelsListed(t, e); !strings.Contains(got, "gateway-model") || strings.Contains(got, "policy-model") {
		t.Fatalf("after SetRoutes: %s", got)
	}
	next := allowing("b.example.com")
	next.Inference = new(modelRoute("policy-model-2"))
	if err := e.Policy().Apply(next, "next.yaml"); err != nil {
		t.Fatal(err)
	}
	if got := modelsListed(t, e); !strings.Contains(got, "gateway-model") {
		t.Fatalf("a policy reload replaced the gateway's routes: %s", got)
	}
	bad := modelRoute("bad-model")
	bad.Routes[0].Protocols = []string{"smoke_signals"}
	if err := e.SetRoutes(bad); err == nil {
		t.Fatal("routes that do not validate were put in force")
	}
	if got := modelsListed(t, e); !strings.Contains(got, "gateway-model") {
		t.Fatalf("after bad routes: %s", got)
	}
}

// Without SetRoutes a reload still moves the policy's routes.
func TestReloadMovesPolicyRoutes(t *testing.T) {
	p := allowing("a.example.com")
	p.Inference = new(modelRoute("policy-model"))
	e := newEgress(t, p, &egresstest.AuditBuffer{})
	next := &policy.Policy{Version: 1, NetworkPolicies: p.NetworkPolicies, Inference: new(modelRoute("policy-model-2"))}
	if err := e.Policy().Apply(next, "next.yaml"); err != nil {
		t.Fatal(err)
	}
	if got := modelsListed(t, e); !strings.Contains(got, "policy-model-2") {
		t.Fatalf("after a reload: %s", got)
	}
}

// Routes a reload or the gateway brings in whose key file the sandbox
// could read are refused, the routes in force kept, as for any routes
// that do not build.
func TestRouteKeysCheckedBeforeSwap(t *testing.T) {
	p := allowing("a.example.com")
	p.Inference = new(modelRoute("policy-model"))
	c, err := p.Compile()
	if err != nil {
		t.Fatal(err)
	}
	var checked []string
	e, err := New(Config{ID: "test", Policy: c, Audit: audit.New(&egresstest.AuditBuffer{}),
		RouteKeys: func(origin string, rs []inference.Route) error {
			checked = append(checked, origin)
			for _, r := range rs {
				if r.APIKey.FromFile != "" {
					return errors.New("readable key file")
				}
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	readable := modelRoute("readable-key")
	readable.Routes[0].APIKey.FromFile = "/w/.key"
	next := allowing("a.example.com")
	next.Inference = &readable
	if err := e.Policy().Apply(next, "next.yaml"); err == nil {
		t.Error("a reload with a readable route key file was put in force")
	}
	if err := e.SetRoutes(readable); err == nil {
		t.Error("gateway routes with a readable key file were put in force")
	}
	if got := modelsListed(t, e); !strings.Contains(got, "policy-model") || strings.Contains(got, "readable-key") {
		t.Fatalf("routes in force after the refusals: %s", got)
	}
	if len(checked) != 2 {
		t.Errorf("checked %q, want the reload's and the gateway's routes", checked)
	}
}
