package secrets

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/internal/policy"
)

// gatewayValues is a gateway lookup over a fixed map.
func gatewayValues(m map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := m[name]
		return v, ok
	}
}

func gatewaySet(t *testing.T, values map[string]string) *Set {
	t.Helper()
	scopes, err := compileSpecs(map[string]policy.Secret{
		"GH_TOKEN": {FromGateway: "gh-token", Hosts: []string{"api.github.com"}},
		"API_KEY":  {FromEnv: "API_KEY", Hosts: []string{"api.example.com"}, Headers: []string{"x-api-key"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	s, err := LoadFrom(scopes, Sources{Getenv: env(map[string]string{"API_KEY": apiKeyReal}), Gateway: gatewayValues(values)})
	if err != nil {
		t.Fatalf("LoadFrom: %v", err)
	}
	return s
}

func swapped(s *Set, host, header, value string) string {
	h := http.Header{header: {value}}
	s.Swap(host, h)
	return h.Get(header)
}

// TestLoadFromGateway: a from_gateway secret takes its value from the
// gateway lookup; the workload gets a surrogate and the proxy swaps it.
func TestLoadFromGateway(t *testing.T) {
	s := gatewaySet(t, map[string]string{"gh-token": ghReal, "unrelated": "xxxxxxxxxxxx"})
	sur := surrogateOf(t, s, "GH_TOKEN")
	if sur == ghReal || !strings.HasPrefix(sur, "ghp_") || len(sur) != len(ghReal) {
		t.Fatalf("surrogate %q does not stand for the gateway value", sur)
	}
	if got := swapped(s, "api.github.com", "Authorization", "Bearer "+sur); got != "Bearer "+ghReal {
		t.Errorf("swap to the scoped host = %q", got)
	}
	if got := swapped(s, "evil.example", "Authorization", "Bearer "+sur); got != "Bearer "+sur {
		t.Errorf("swap to another host = %q", got)
	}
	if got := s.Redact("leaked " + ghReal); strings.Contains(got, ghReal) {
		t.Errorf("Redact left the gateway value: %q", got)
	}
}

func TestLoadFromGatewayMissing(t *testing.T) {
	scopes, err := compileSpecs(map[string]policy.Secret{"GH_TOKEN": {FromGateway: "gh-token", Hosts: []string{"api.github.com"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		src  Sources
		want string
	}{
		{"no gateway", Sources{Getenv: env(nil)}, "secret GH_TOKEN: from_gateway gh-token: corral run has no --gateway"},
		{"not sent", Sources{Getenv: env(nil), Gateway: gatewayValues(map[string]string{"other": ghReal})}, "secret GH_TOKEN: from_gateway gh-token: the gateway sent no such secret"},
		{"too short", Sources{Getenv: env(nil), Gateway: gatewayValues(map[string]string{"gh-token": "short"})}, "secret GH_TOKEN: the value is 5 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadFrom(scopes, tc.src)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			if strings.Contains(err.Error(), ghReal) {
				t.Fatalf("error carries a value: %v", err)
			}
		})
	}
}

// TestUpdateGateway: a new value of a gateway secret is swapped in from
// then on, by the Set and by every Set rescoped from it, under the same
// surrogate; the old value is still scrubbed and redacted.
func TestUpdateGateway(t *testing.T) {
	s := gatewaySet(t, map[string]string{"gh-token": ghReal})
	sur := surrogateOf(t, s, "GH_TOKEN")
	scopes, err := compileSpecs(map[string]policy.Secret{
		"GH_TOKEN": {FromGateway: "gh-token", Hosts: []string{"api.github.com", "uploads.github.com"}},
		"API_KEY":  {FromEnv: "API_KEY", Hosts: []string{"api.example.com"}, Headers: []string{"x-api-key"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	rescoped, err := s.Rescope(scopes)
	if err != nil {
		t.Fatal(err)
	}
	const rotated = "ghp_N3wwT0kenValue0123456789abcdefKLMN"
	changed, err := s.UpdateGateway(gatewayValues(map[string]string{"gh-token": rotated}))
	if err != nil || !slices.Equal(changed, []string{"GH_TOKEN"}) {
		t.Fatalf("UpdateGateway = %v, %v", changed, err)
	}
	for _, set := range []*Set{s, rescoped} {
		if got := surrogateOf(t, set, "GH_TOKEN"); got != sur {
			t.Fatalf("surrogate changed: %q, was %q", got, sur)
		}
		if got := swapped(set, "api.github.com", "Authorization", "Bearer "+sur); got != "Bearer "+rotated {
			t.Errorf("swap after the update = %q, want the new value", got)
		}
		for _, v := range []string{ghReal, rotated} {
			if got := set.Redact("x " + v); strings.Contains(got, v) {
				t.Errorf("Redact left a value: %q", got)
			}
			body := set.Scrub(nil, []byte(`{"token":"`+v+`"}`))
			if want := `{"token":"` + sur + `"}`; string(body) != want {
				t.Errorf("Scrub = %s, want %s", body, want)
			}
		}
	}
	if got := swapped(rescoped, "uploads.github.com", "Authorization", "token "+sur); got != "token "+rotated {
		t.Errorf("rescoped swap = %q", got)
	}
	// The env secret is untouched.
	if got := swapped(s, "api.example.com", "X-Api-Key", surrogateOf(t, s, "API_KEY")); got != apiKeyReal {
		t.Errorf("env secret after the update = %q", got)
	}
	if changed, err := s.UpdateGateway(gatewayValues(map[string]string{"gh-token": rotated})); err != nil || changed != nil {
		t.Errorf("the same value again = %v, %v", changed, err)
	}
	if changed, err := s.UpdateGateway(gatewayValues(nil)); err != nil || changed != nil {
		t.Errorf("no value sent = %v, %v", changed, err)
	}
}

// TestUpdateGatewayRefusesMisfit: a value the surrogate cannot stand for
// is refused and the old value stays in force.
func TestUpdateGatewayRefusesMisfit(t *testing.T) {
	s := gatewaySet(t, map[string]string{"gh-token": ghReal})
	sur := surrogateOf(t, s, "GH_TOKEN")
	for _, bad := range []string{
		ghReal + "X",                             // longer
		"ghp-R3alT0kenValue0123456789abcdefGHIJ", // other punctuation
		"ghp_ R3alT0kenValue0123456789abcdefGHI", // a space
		sur,                                      // the surrogate itself
	} {
		_, err := s.UpdateGateway(gatewayValues(map[string]string{"gh-token": bad}))
		if err == nil || !strings.Contains(err.Error(), "secret GH_TOKEN") {
			t.Errorf("%q: error %v", bad, err)
		}
		if err != nil && strings.Contains(err.Error(), bad) {
			t.Errorf("error carries the value: %v", err)
		}
		if got := swapped(s, "api.github.com", "Authorization", sur); got != ghReal {
			t.Fatalf("after a refused update the swap gives %q", got)
		}
	}
}
