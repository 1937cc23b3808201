package gatewayconf

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func cleanEnv(t *testing.T) string {
	t.Helper()
	cfg := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", cfg)
	for _, k := range []string{EnvURL, EnvCA, EnvToken, EnvTokenFile} {
		t.Setenv(k, "")
	}
	return cfg
}

func TestNormalizeURL(t *testing.T) {
	for in, want := range map[string]string{
		"https://gw.example:7443":   "https://gw.example:7443",
		"https://gw.example:7443/":  "https://gw.example:7443",
		"gw.example:7443":           "https://gw.example:7443",
		" https://127.0.0.1:7443 ":  "https://127.0.0.1:7443",
		"https://gw.example/prefix": "https://gw.example/prefix",
	} {
		if got, err := NormalizeURL(in); err != nil || got != want {
			t.Errorf("NormalizeURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"http://gw.example:7443", "https://", "https://u:p@gw.example", "https://gw?x=1", "ftp://gw"} {
		if got, err := NormalizeURL(bad); err == nil {
			t.Errorf("NormalizeURL(%q) = %q, want an error", bad, got)
		}
	}
}

// TestResolvePrecedence: flag over environment over login, for the URL
// and the CA; the environment's token over the login's.
func TestResolvePrecedence(t *testing.T) {
	cleanEnv(t)
	if _, err := Resolve(Options{}); err == nil || !strings.Contains(err.Error(), "corral gateway login") {
		t.Fatalf("nothing configured: %v", err)
	}
	if ok, err := Configured(Options{}); ok || err != nil {
		t.Fatalf("Configured with nothing = %v, %v", ok, err)
	}
	if _, err := WriteLogin(Login{URL: "https://login.example:7443", CAFile: "rel/ca.pem", Token: "cgw_u_login"}); err != nil {
		t.Fatal(err)
	}
	wd, _ := os.Getwd()
	got, err := Resolve(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got.URL != "https://login.example:7443" || got.CAFile != filepath.Join(wd, "rel/ca.pem") || got.Token != "cgw_u_login" {
		t.Errorf("from the login: %+v", got)
	}
	t.Setenv(EnvCA, "/env/ca.pem")
	t.Setenv(EnvToken, "cgw_u_env")
	if got, _ := Resolve(Options{}); got.CAFile != "/env/ca.pem" || got.Token != "cgw_u_env" || got.TokenFrom != "$"+EnvToken {
		t.Errorf("environment over the login: %+v", got)
	}
	if got, _ := Resolve(Options{CAFile: "/flag/ca.pem"}); got.CAFile != "/flag/ca.pem" {
		t.Errorf("flag over the environment: %+v", got)
	}
	t.Setenv(EnvToken, "")
	tok := filepath.Join(t.TempDir(), "tok")
	os.WriteFile(tok, []byte("  cgw_u_file  \nsecond line\n"), 0o600)
	t.Setenv(EnvTokenFile, tok)
	t.Setenv(EnvURL, "https://env.example:7443")
	if got, err := Resolve(Options{}); err != nil || got.URL != "https://env.example:7443" || got.Token != "cgw_u_file" || got.TokenFrom != tok {
		t.Errorf("token file and URL from the environment: %+v %v", got, err)
	}
	if got, _ := Resolve(Options{URL: "flag.example:1"}); got.URL != "https://flag.example:1" {
		t.Errorf("flag over the environment: %+v", got)
	}
}

// TestLoginScopedToItsGateway: the login's token and CA are for its own
// gateway only; another URL from a flag or the environment gets neither.
func TestLoginScopedToItsGateway(t *testing.T) {
	cleanEnv(t)
	if _, err := WriteLogin(Login{URL: "https://login.example:7443", CAFile: "/login/ca.pem", Token: "cgw_u_login"}); err != nil {
		t.Fatal(err)
	}
	if got, err := Resolve(Options{URL: "https://login.example:7443/"}); err != nil || got.Token != "cgw_u_login" {
		t.Fatalf("the login's own gateway: %+v %v", got, err)
	}
	for _, o := range []Options{{URL: "https://evil.example:7443"}, {URL: "https://evil.example:7443", CAFile: "/evil/ca.pem"}} {
		got, err := Resolve(o)
		if err == nil || got.Token != "" || !strings.Contains(err.Error(), "the login in") {
			t.Errorf("Resolve(%+v) = %+v, %v; want no token", o, got, err)
		}
	}
	t.Setenv(EnvURL, "https://evil.example:7443")
	if got, err := Resolve(Options{}); err == nil || got.Token != "" {
		t.Errorf("CORRAL_GATEWAY elsewhere: %+v, %v; want no token", got, err)
	}
}

func TestLoginFileChecks(t *testing.T) {
	cfg := cleanEnv(t)
	path, err := WriteLogin(Login{URL: "gw.example:7443", Token: "cgw_u_x"})
	if err != nil {
		t.Fatal(err)
	}
	if path != filepath.Join(cfg, "corral", "gateway.json") {
		t.Errorf("login at %s", path)
	}
	for name, text := range map[string]string{
		"damaged":       "{",
		"unknown field": `{"url":"https://gw.example:7443","token":"t","extra":1}`,
		"no token":      `{"url":"https://gw.example:7443"}`,
	} {
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadLogin(); err == nil || !strings.Contains(err.Error(), "corral gateway login again") {
			t.Errorf("%s login: %v", name, err)
		}
	}
	if _, existed, err := RemoveLogin(); err != nil || !existed {
		t.Fatalf("remove: %v %v", existed, err)
	}
	if l, err := ReadLogin(); l != nil || err != nil {
		t.Fatalf("after remove: %v %v", l, err)
	}
	if _, existed, err := RemoveLogin(); err != nil || existed {
		t.Fatalf("remove twice: %v %v", existed, err)
	}
	t.Setenv("XDG_CONFIG_HOME", "relative/dir")
	home := t.TempDir()
	t.Setenv("HOME", home)
	if p, _ := LoginPath(); p != filepath.Join(home, ".config", "corral", "gateway.json") {
		t.Errorf("a relative XDG_CONFIG_HOME was used: %s", p)
	}
}

// With no home directory there is no login, and commands that use a
// gateway only when one is configured work as without one.
func TestNoHomeMeansNoLogin(t *testing.T) {
	t.Setenv("HOME", "")
	t.Setenv("XDG_CONFIG_HOME", "")
	l, err := ReadLogin()
	if err != nil || l != nil {
		t.Fatalf("ReadLogin without a home = %v, %v; want none", l, err)
	}
}
