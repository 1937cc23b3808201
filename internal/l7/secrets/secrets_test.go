package secrets

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/internal/policy"
)

const (
	ghReal     = "ghp_R3alT0kenValue0123456789abcdefGHIJ"
	patReal    = "github_pat_11ABCDEFG0abcdefghij_KLMNOPQRSTuvwxyz0123456789"
	anthReal   = "sk-ant-api03-Abc_DEF-ghi.jkl/MNO+pqr=0123456789xyzXYZ"
	apiKeyReal = "k3y-VALUE.for_the.api-0123"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func load(t *testing.T, specs map[string]policy.Secret, vars map[string]string) *Set {
	t.Helper()
	s, err := loadSpecs(specs, env(vars))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return s
}

// surrogateOf reads the surrogate through the public Env output, as the
// sandbox would see it.
func surrogateOf(t *testing.T, s *Set, name string) string {
	t.Helper()
	for _, kv := range s.Env() {
		if k, v, _ := strings.Cut(kv, "="); k == name {
			return v
		}
	}
	t.Fatalf("no %s in Env()", name)
	return ""
}

func ghSet(t *testing.T) *Set {
	return load(t, map[string]policy.Secret{
		"GH_TOKEN": {FromEnv: "GITHUB_TOKEN", Hosts: []string{"api.github.com", "*.githubusercontent.com"}},
		"API_KEY":  {FromEnv: "API_KEY", Hosts: []string{"api.example.com"}, Headers: []string{"x-api-key"}},
	}, map[string]string{"GITHUB_TOKEN": ghReal, "API_KEY": apiKeyReal})
}

func TestSurrogateShape(t *testing.T) {
	for _, tc := range []struct{ real, prefix string }{
		{ghReal, "ghp_"},
		{patReal, "github_pat_"},
		{anthReal, "sk-ant-api03-"},
	} {
		t.Run(tc.prefix, func(t *testing.T) {
			specs := map[string]policy.Secret{"TOK": {FromEnv: "SRC", Hosts: []string{"api.example.com"}}}
			vars := map[string]string{"SRC": tc.real}
			g := surrogateOf(t, load(t, specs, vars), "TOK")
			if len(g) != len(tc.real) {
				t.Fatalf("surrogate length %d, real %d", len(g), len(tc.real))
			}
			if !strings.HasPrefix(g, tc.prefix) {
				t.Fatalf("surrogate %q lost prefix %q", g, tc.prefix)
			}
			if g == tc.real || strings.Contains(g, tc.real) {
				t.Fatal("surrogate equals the real value")
			}
			for i := len(tc.prefix); i < len(g); i++ {
				r, s := tc.real[i], g[i]
				if class(r) != class(s) {
					t.Fatalf("byte %d: class of %q differs from %q", i, s, r)
				}
				if class(r) == "" && r != s {
					t.Fatalf("byte %d: separator %q became %q", i, r, s)
				}
			}
			if g2 := surrogateOf(t, load(t, specs, vars), "TOK"); g2 == g {
				t.Fatal("two loads produced the same surrogate")
			}
		})
	}
}

func TestSurrogatesDifferBetweenSecrets(t *testing.T) {
	s := load(t, map[string]policy.Secret{
		"A": {FromEnv: "SRC", Hosts: []string{"a.example.com"}},
		"B": {FromEnv: "SRC", Hosts: []string{"b.example.com"}},
	}, map[string]string{"SRC": ghReal})
	if surrogateOf(t, s, "A") == surrogateOf(t, s, "B") {
		t.Fatal("two secrets share a surrogate")
	}
}

func TestLoadErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		value string
		want  string
	}{
		{"unset", "", "secret GH_TOKEN: from_env GITHUB_TOKEN is not set in corral's environment"},
		{"short", "abc123", "the value is 6 bytes; at least 8 are needed"},
		{"space", "abcd efgh1234", "cannot be replaced safely in headers"},
		{"control", "abcd\tefgh1234", "cannot be replaced safely in headers"},
		{"prefix only", "ghp_____--__--", "too little randomisable content"},
		{"few random", "ghp_abc_1234", "too little randomisable content"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadSpecs(map[string]policy.Secret{
				"GH_TOKEN": {FromEnv: "GITHUB_TOKEN", Hosts: []string{"api.github.com"}},
			}, env(map[string]string{"GITHUB_TOKEN": tc.value}))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
			if tc.value != "" && strings.Contains(err.Error(), tc.value) {
				t.Fatalf("error %q reveals the value", err)
			}
		})
	}
}

func TestLoadRefusesBadSpecs(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec policy.Secret
		want string
	}{
		{"GH_TOKEN", policy.Secret{FromEnv: "SRC", Hosts: []string{"api.github.com"}, Headers: []string{"host"}}, "framing header"},
		{"GH_TOKEN", policy.Secret{FromEnv: "SRC", Hosts: []string{"api.github.com"}, Headers: []string{"X Key"}}, "not a valid header name"},
		{"GH_TOKEN", policy.Secret{FromEnv: "SRC"}, "no hosts"},
		{"GH_TOKEN", policy.Secret{FromEnv: "SRC", Hosts: []string{"*.com"}}, "top-level domain"},
		{"GH_TOKEN", policy.Secret{FromEnv: "SRC", FromFile: "/x", Hosts: []string{"api.github.com"}}, "exactly one source"},
		{"GH_TOKEN", policy.Secret{Hosts: []string{"api.github.com"}}, "needs from_env, from_file or from_gateway"},
		{"GH=TOKEN", policy.Secret{FromEnv: "SRC", Hosts: []string{"api.github.com"}}, "environment variable name"},
	} {
		_, err := loadSpecs(map[string]policy.Secret{tc.name: tc.spec}, env(map[string]string{"SRC": ghReal}))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want %q", tc.spec, err, tc.want)
		}
	}
}

func TestLoadFromFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, content := range []string{ghReal, ghReal + "\n", ghReal + "\r\n"} {
		p := write("tok", content)
		s := load(t, map[string]policy.Secret{"GH_TOKEN": {FromFile: p, Hosts: []string{"api.github.com"}}}, nil)
		h := http.Header{"Authorization": {"Bearer " + surrogateOf(t, s, "GH_TOKEN")}}
		if s.Swap("api.github.com", h); h.Get("Authorization") != "Bearer "+ghReal {
			t.Fatalf("file %q: swapped to %q", content, h.Get("Authorization"))
		}
	}

	big := write("big", strings.Repeat("a", maxFileSize+1))
	_, err := loadSpecs(map[string]policy.Secret{"BIG": {FromFile: big, Hosts: []string{"api.github.com"}}}, nil)
	if err == nil || !strings.Contains(err.Error(), "secret BIG") || !strings.Contains(err.Error(), "larger than 64 KiB") {
		t.Fatalf("big file: %v", err)
	}

	_, err = loadSpecs(map[string]policy.Secret{"GONE": {FromFile: filepath.Join(dir, "missing"), Hosts: []string{"api.github.com"}}}, nil)
	if err == nil || !strings.HasPrefix(err.Error(), "secret GONE: from_file") {
		t.Fatalf("missing file: %v", err)
	}

	_, err = loadSpecs(map[string]policy.Secret{"EMPTY": {FromFile: write("empty", "\n"), Hosts: []string{"api.github.com"}}}, nil)
	if err == nil || !strings.Contains(err.Error(), "is empty") {
		t.Fatalf("empty file: %v", err)
	}
}

func TestSwapBearer(t *testing.T) {
	s := ghSet(t)
	g := surrogateOf(t, s, "GH_TOKEN")
	for _, host := range []string{"api.github.com", "API.GitHub.com.", "api.github.com:443", "raw.githubusercontent.com"} {
		h := http.Header{"Authorization": {"Bearer " + g}}
		if n := s.Swap(host, h); n != 1 || h.Get("Authorization") != "Bearer "+ghReal {
			t.Fatalf("%s: n=%d, header %q", host, n, h.Get("Authorization"))
		}
	}
}

func TestSwapOtherHostUntouched(t *testing.T) {
	s := ghSet(t)
	g := surrogateOf(t, s, "GH_TOKEN")
	for _, host := range []string{"evil.example.com", "api.github.com.evil.example.com", "githubusercontent.com", "api.example.com"} {
		h := http.Header{"Authorization": {"Bearer " + g}, "X-Api-Key": {g}}
		if n := s.Swap(host, h); n != 0 || h.Get("Authorization") != "Bearer "+g || h.Get("X-Api-Key") != g {
			t.Fatalf("%s: n=%d, headers %v", host, n, h)
		}
	}
}

func TestSwapOnlyNamedHeaders(t *testing.T) {
	s := ghSet(t)
	g := surrogateOf(t, s, "GH_TOKEN")
	h := http.Header{"Authorization": {"token " + g}, "X-Other": {g}, "Cookie": {"t=" + g}}
	if n := s.Swap("api.github.com", h); n != 1 {
		t.Fatalf("n=%d", n)
	}
	if h.Get("Authorization") != "token "+ghReal || h.Get("X-Other") != g || h.Get("Cookie") != "t="+g {
		t.Fatalf("headers %v", h)
	}
}

func TestSwapBasic(t *testing.T) {
	s := ghSet(t)
	g := surrogateOf(t, s, "GH_TOKEN")
	h := http.Header{"Authorization": {"Basic " + base64.StdEncoding.EncodeToString([]byte("x-access-token:"+g))}}
	if n := s.Swap("api.github.com", h); n != 1 {
		t.Fatalf("n=%d", n)
	}
	enc, ok := strings.CutPrefix(h.Get("Authorization"), "Basic ")
	if !ok {
		t.Fatalf("scheme lost: %q", h.Get("Authorization"))
	}
	dec, err := base64.StdEncoding.DecodeString(enc)
	if err != nil || string(dec) != "x-access-token:"+ghReal {
		t.Fatalf("decoded %q, %v", dec, err)
	}
}

func TestSwapCustomHeaderAndMultipleValues(t *testing.T) {
	s := ghSet(t)
	k := surrogateOf(t, s, "API_KEY")
	g := surrogateOf(t, s, "GH_TOKEN")
	// A hand-built, non-canonical key still goes on the wire, so it must
	// be found too.
	h := http.Header{"x-api-key": {k, "other", "a," + k}, "Authorization": {"Bearer " + k}}
	if n := s.Swap("api.example.com", h); n != 2 {
		t.Fatalf("n=%d, headers %v", n, h)
	}
	//lint:ignore SA1008 the key is non-canonical on purpose
	if want := []string{apiKeyReal, "other", "a," + apiKeyReal}; !slices.Equal(h["x-api-key"], want) {
		//lint:ignore SA1008 the key is non-canonical on purpose
		t.Fatalf("x-api-key %q, want %q", h["x-api-key"], want)
	}
	if h.Get("Authorization") != "Bearer "+k {
		t.Fatal("Authorization is not among API_KEY's headers but was swapped")
	}

	h = http.Header{"Authorization": {"Bearer " + g, "Bearer " + g}}
	if n := s.Swap("api.github.com", h); n != 2 || h["Authorization"][0] != "Bearer "+ghReal || h["Authorization"][1] != "Bearer "+ghReal {
		t.Fatalf("n=%d, headers %v", n, h)
	}
}

func TestScrubEnv(t *testing.T) {
	s := load(t, map[string]policy.Secret{
		"GH_TOKEN": {FromEnv: "GITHUB_TOKEN", Hosts: []string{"api.github.com"}},
		"API_KEY":  {FromEnv: "API_KEY", Hosts: []string{"api.example.com"}},
	}, map[string]string{"GITHUB_TOKEN": ghReal, "API_KEY": apiKeyReal})
	g, k := surrogateOf(t, s, "GH_TOKEN"), surrogateOf(t, s, "API_KEY")
	b64 := base64.StdEncoding.EncodeToString
	got := s.ScrubEnv([]string{
		"PATH=/usr/bin",
		"GITHUB_TOKEN=" + ghReal,
		"API_KEY=" + apiKeyReal,
		"GH_TOKEN=stale",
		"GIT_CONFIG=url.https://x:" + ghReal + "@github.com/",
		"DOCKER_AUTH=" + b64([]byte(ghReal)),
	})
	want := []string{
		"PATH=/usr/bin",
		"API_KEY=" + k,
		"GH_TOKEN=" + g,
		"GIT_CONFIG=url.https://x:" + g + "@github.com/",
		"DOCKER_AUTH=" + b64([]byte(g)),
	}
	if !slices.Equal(got, want) {
		t.Fatalf("ScrubEnv:\n got %q\nwant %q", got, want)
	}
	for _, kv := range got {
		if strings.Contains(kv, ghReal) || strings.Contains(kv, apiKeyReal) {
			t.Fatalf("real value survives in %q", kv)
		}
	}
}

func TestRedact(t *testing.T) {
	s := ghSet(t)
	b64 := base64.StdEncoding.EncodeToString
	for _, tc := range []struct{ in, want string }{
		{"auth: Bearer " + ghReal + " ok", "auth: Bearer [REDACTED:GH_TOKEN] ok"},
		{"key=" + apiKeyReal, "key=[REDACTED:API_KEY]"},
		{"b64 " + b64([]byte(ghReal)), "b64 [REDACTED:GH_TOKEN]"},
		{"nothing here", "nothing here"},
	} {
		if got := s.Redact(tc.in); got != tc.want {
			t.Errorf("Redact(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	// A password inside an encoded "user:password" starts at an arbitrary
	// byte offset; whatever is left must not decode to the value.
	for _, user := range []string{"x", "xy", "xyz"} {
		got := s.Redact("Authorization: Basic " + b64([]byte(user+":"+ghReal)))
		if !strings.Contains(got, "[REDACTED:GH_TOKEN]") {
			t.Errorf("user %q: %q not redacted", user, got)
		}
	}
}

func TestPrintingHidesValues(t *testing.T) {
	s := ghSet(t)
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "%v %+v %#v %s %v %+v %#v", s, s, s, s, *s, *s, *s)
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("loaded", "set", s)
	slog.New(slog.NewTextHandler(&buf, nil)).Info("loaded", "set", s)
	out := buf.String()
	for _, real := range []string{ghReal, apiKeyReal} {
		if strings.Contains(out, real) {
			t.Fatalf("output reveals a real value: %s", out)
		}
	}
	if got := fmt.Sprintf("%#v", s); got != s.String() {
		t.Fatalf("%%#v = %q, want the names-only String()", got)
	}
	if !strings.Contains(out, "GH_TOKEN") || !strings.Contains(out, `"names":["API_KEY","GH_TOKEN"]`) {
		t.Fatalf("output lacks the names: %s", out)
	}
}

func TestNilAndEmptySet(t *testing.T) {
	for _, s := range []*Set{nil, load(t, nil, nil)} {
		h := http.Header{"Authorization": {"Bearer x"}}
		in := []string{"A=1", "B"}
		if s.Swap("api.github.com", h) != 0 || s.Env() != nil || s.Len() != 0 || s.Names() != nil ||
			s.Redact("text") != "text" || !slices.Equal(s.ScrubEnv(in), in) || s.String() != "secrets[]" {
			t.Fatalf("%v does not behave as an empty set", s)
		}
		_ = s.LogValue()
	}
}

func TestNamesAndEnvSorted(t *testing.T) {
	s := ghSet(t)
	if got := s.Names(); !slices.Equal(got, []string{"API_KEY", "GH_TOKEN"}) || s.Len() != 2 {
		t.Fatalf("Names %q, Len %d", got, s.Len())
	}
	e := s.Env()
	if len(e) != 2 || !strings.HasPrefix(e[0], "API_KEY=") || !strings.HasPrefix(e[1], "GH_TOKEN=") {
		t.Fatalf("Env %q", e)
	}
}

// The random retries cannot be forced from outside, so the rule they
// enforce is checked directly.
func TestSurrogateAcceptance(t *testing.T) {
	other := &entry{real: "otherREALvalue99", surrogate: "otherSURROGATE11"}
	for _, tc := range []struct {
		g    string
		want bool
	}{
		{ghReal, false},                   // equal to its own real value
		{"xx" + other.real + "yy", false}, // would hand another real value to the workload
		{other.surrogate, false},          // would swap in the wrong secret
		{"ghp_Fresh0Surrogate1234", true},
	} {
		if got := acceptable(tc.g, ghReal, []*entry{other}); got != tc.want {
			t.Errorf("acceptable(%q) = %v, want %v", tc.g, got, tc.want)
		}
	}
}

// loadSpecs compiles each secret as validation does, then loads them.
func loadSpecs(specs map[string]policy.Secret, getenv func(string) string) (*Set, error) {
	scopes, err := compileSpecs(specs)
	if err != nil {
		return nil, err
	}
	return Load(scopes, getenv)
}

func compileSpecs(specs map[string]policy.Secret) ([]policy.SecretScope, error) {
	var scopes []policy.SecretScope
	for _, name := range slices.Sorted(maps.Keys(specs)) {
		sc, err := policy.CompileSecret(name, specs[name])
		if err != nil {
			return nil, err
		}
		scopes = append(scopes, sc)
	}
	return scopes, nil
}
