package fleet

import (
	"encoding/json"
	"encoding/pem"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/corral-sandbox/corral/internal/gateway/auth"
	"github.com/corral-sandbox/corral/internal/gateway/store"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1"
	"github.com/corral-sandbox/corral/internal/gatewayconf"
	"github.com/corral-sandbox/corral/internal/policy"
)

// TestGatewayLoginThenCommands: login checks the token, saves it 0600 in
// a 0700 directory with the CA made absolute, later commands find the
// gateway through it alone, and logout removes it.
func TestGatewayLoginThenCommands(t *testing.T) {
	g := startTestGateway(t)
	t.Chdir(filepath.Dir(g.caFile))

	bad := runCorral(t, "cgw_u_notatoken\n", "gateway", "login", "--gateway", g.url, "--gateway-ca", "ca.pem")
	if bad.code == 0 || !strings.Contains(bad.stderr, "refused the token") {
		t.Fatalf("login with a bad token: %s", bad)
	}
	path, err := gatewayconf.LoginPath()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("a refused login was saved: %v", err)
	}

	r := runCorral(t, g.user+"\n", "gateway", "login", "--gateway", g.url, "--gateway-ca", "ca.pem")
	if r.code != 0 || !strings.Contains(r.stdout, "logged in to "+g.url) {
		t.Fatalf("login: %s", r)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("login file mode %04o, want 0600", fi.Mode().Perm())
	}
	if di, err := os.Stat(filepath.Dir(path)); err != nil || di.Mode().Perm() != 0o700 {
		t.Errorf("login directory: %v %v, want mode 0700", di.Mode(), err)
	}
	var saved map[string]string
	if err := json.Unmarshal(mustReadFile(t, path), &saved); err != nil {
		t.Fatal(err)
	}
	if saved["url"] != g.url || saved["ca_file"] != g.caFile || saved["token"] != g.user {
		t.Errorf("saved %v; want url %s, the CA's absolute path %s and the token", saved, g.url, g.caFile)
	}

	t.Chdir(t.TempDir()) // the saved CA path must not depend on the directory
	id := g.createExternal("via-login")
	if r := runCorral(t, "", "sandbox", "list"); r.code != 0 || !strings.Contains(r.stdout, id) {
		t.Fatalf("list through the login: %s", r)
	}

	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte(g.user+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := runCorral(t, "", "gateway", "login", "--gateway", g.url, "--gateway-ca", g.caFile, "--token-file", tokFile); r.code != 0 {
		t.Fatalf("login --token-file: %s", r)
	}

	if r := runCorral(t, "", "gateway", "logout"); r.code != 0 || !strings.Contains(r.stdout, "removed "+path) {
		t.Fatalf("logout: %s", r)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("logout left %s: %v", path, err)
	}
	if r := runCorral(t, "", "sandbox", "list"); r.code != 2 || !strings.Contains(r.stderr, "no gateway: pass --gateway URL") {
		t.Fatalf("list after logout: %s", r)
	}
}

// TestLoginTokenNotSentToAnotherGateway: the saved token belongs to the
// gateway it was saved with. Pointing --gateway or CORRAL_GATEWAY (and a
// CA that verifies it) at another server must not hand that server the
// token.
func TestLoginTokenNotSentToAnotherGateway(t *testing.T) {
	g := startTestGateway(t)
	if r := runCorral(t, g.user, "gateway", "login", "--gateway", g.url, "--gateway-ca", g.caFile); r.code != 0 {
		t.Fatalf("login: %s", r)
	}
	var mu sync.Mutex
	var seen []string
	other := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		w.WriteHeader(http.StatusUnauthorized)
	}))
	other.EnableHTTP2 = true
	other.StartTLS()
	defer other.Close()
	otherCA := filepath.Join(t.TempDir(), "other-ca.pem")
	if err := os.WriteFile(otherCA, pemCert(other.Certificate().Raw), 0o644); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		args []string
		env  string
	}{
		{"flag", []string{"--gateway", other.URL}, ""},
		{"env", nil, other.URL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(gatewayconf.EnvURL, tc.env)
			r := runCorral(t, "", append([]string{"sandbox", "list", "--gateway-ca", otherCA}, tc.args...)...)
			if r.code == 0 || !strings.Contains(r.stderr, "no token for the gateway at "+other.URL) {
				t.Errorf("list at another gateway: %s", r)
			}
		})
	}
	// Positive control: the server does see a token given for it.
	t.Setenv(gatewayconf.EnvToken, "cgw_u_meant_for_other")
	r := runCorral(t, "", "sandbox", "list", "--gateway", other.URL, "--gateway-ca", otherCA)
	if r.code != 1 || !strings.Contains(r.stderr, "refused the token") {
		t.Errorf("control: %s", r)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) == 0 || seen[len(seen)-1] != "Bearer cgw_u_meant_for_other" {
		t.Errorf("control: the other server saw %q", seen)
	}
	for _, h := range seen {
		if strings.Contains(h, g.user) {
			t.Fatalf("the login's token was sent to %s", other.URL)
		}
	}
}

// TestLoginFileReadableByOthersRefused: a login file others may read
// leaks the token; corral refuses it rather than use it.
func TestLoginFileReadableByOthersRefused(t *testing.T) {
	g := startTestGateway(t)
	if r := runCorral(t, g.user, "gateway", "login", "--gateway", g.url, "--gateway-ca", g.caFile); r.code != 0 {
		t.Fatalf("login: %s", r)
	}
	path, _ := gatewayconf.LoginPath()
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	r := runCorral(t, "", "sandbox", "list")
	if r.code != 2 || !strings.Contains(r.stderr, "others may read it") || !strings.Contains(r.stderr, "chmod 600 "+path) {
		t.Fatalf("list with a world-readable login: %s", r)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if r := runCorral(t, "", "sandbox", "list"); r.code != 0 {
		t.Fatalf("control, mode 0600: %s", r)
	}
}

func TestSandboxCommands(t *testing.T) {
	g := startTestGateway(t)
	g.useEnv()
	watch := startCorral(t, "sandbox", "watch", "--selector", "team=a")

	id := g.createExternal("one", "--label", "team=a", "--label", "tier=x", "--env", "A=b", "--", "agent", "--fast")
	other := g.createExternal("two", "--label", "team=b")
	watch.waitFor(t, id+"\tone\tprovisioning\tpolicy v1 PENDING")

	r := runCorral(t, "", "sandbox", "list")
	if r.code != 0 {
		t.Fatalf("list: %s", r)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 || strings.Join(strings.Fields(lines[0]), " ") != "ID NAME PHASE EXIT POLICY AGE LABELS" {
		t.Fatalf("list:\n%s", r.stdout)
	}
	row := ""
	for _, l := range lines {
		if strings.HasPrefix(l, id) {
			row = strings.Join(strings.Fields(l), " ")
		}
	}
	if want := id + " one provisioning - v1 PENDING "; !strings.HasPrefix(row, want) || !strings.HasSuffix(row, " team=a,tier=x") {
		t.Errorf("row %q, want %q…team=a,tier=x", row, want)
	}

	r = runCorral(t, "", "sandbox", "list", "--selector", "team=b", "--json")
	var list struct {
		Sandboxes []struct {
			ID   string `json:"id"`
			Name string `json:"name"`
		} `json:"sandboxes"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list.Sandboxes) != 1 || list.Sandboxes[0].ID != other {
		t.Fatalf("list --selector team=b --json: %v %s", err, r)
	}

	r = runCorral(t, "", "sandbox", "get", id)
	for _, want := range []string{"name:     one", "phase:    provisioning", "command:  agent --fast", "driver:   external", "labels:   team=a,tier=x"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("get: no %q in\n%s", want, r)
		}
	}
	r = runCorral(t, "", "sandbox", "get", id, "--json")
	var got struct {
		Env []string `json:"env"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || len(got.Env) != 1 || got.Env[0] != "A=b" {
		t.Fatalf("get --json: %v %s", err, r)
	}

	g.reportPhase(id, gatewayv1.Phase_PHASE_READY, nil)
	watch.waitFor(t, id+"\tone\tready\tpolicy v1 PENDING")

	// --wait prints the phase the sandbox settles in.
	create := startCorral(t, "sandbox", "create", "--driver", "external", "--name", "three", "--wait")
	var third string
	for third == "" {
		create.waitFor(t, "\n")
		third = strings.TrimSpace(create.out.String())
	}
	code := int32(3)
	g.reportPhase(third, gatewayv1.Phase_PHASE_EXITED, &code)
	create.waitFor(t, "exited (exit 3)")
	if c := <-create.done; c != 0 {
		t.Fatalf("create --wait exited %d: %s", c, create.err.String())
	}
	create.done <- 0

	if r := runCorral(t, "", "sandbox", "delete", id); r.code != 0 || r.stdout != "deleted "+id+"\n" {
		t.Fatalf("delete: %s", r)
	}
	watch.waitFor(t, id+"\tone\tdeleted")
	if c := watch.stop(t); c != 0 {
		t.Errorf("watch exited %d when interrupted: %s", c, watch.err.String())
	}
	if r := runCorral(t, "", "sandbox", "get", id); r.code != 1 || !strings.Contains(r.stderr, "no sandbox "+id+" at the gateway "+g.url) {
		t.Fatalf("get after delete: %s", r)
	}

	// corral ps with a gateway lists the gateway's; --local this host's.
	if r := runCorral(t, "", "ps"); r.code != 0 || !strings.Contains(r.stdout, other) {
		t.Fatalf("ps with a gateway: %s", r)
	}
	if r := runCorral(t, "", "ps", "--local", "--state-dir", t.TempDir()); r.code != 0 || !strings.HasPrefix(r.stdout, "ID  ") || !strings.Contains(r.stdout, "PID") {
		t.Fatalf("ps --local: %s", r)
	}
}

// TestGatewayErrors: each way a gateway call fails says what to do.
func TestGatewayErrors(t *testing.T) {
	g := startTestGateway(t)
	g.useEnv()
	id := g.createExternal("e")

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "https://" + ln.Addr().String()
	ln.Close()
	otherPKI, err := auth.EnsurePKI(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	sandboxToken, _, err := auth.CreateToken(t.Context(), g.store, store.TokenSandbox, "sb", id)
	if err != nil {
		t.Fatal(err)
	}
	badPolicy := writeTemp(t, "bad.yaml", "version: 1\nnetwork:\n  mode: sideways\n")

	for _, tc := range []struct {
		name  string
		env   map[string]string
		args  []string
		code  int
		wants []string
	}{
		{"unreachable", nil, []string{"sandbox", "list", "--gateway", closed}, 1,
			[]string{"cannot reach the gateway at " + closed + ": ", "is corral gateway running? check --gateway"}},
		{"wrong CA", nil, []string{"sandbox", "list", "--gateway-ca", otherPKI.CAFile()}, 1,
			[]string{"the CA file " + otherPKI.CAFile() + " does not verify the gateway at " + g.url}},
		{"bad token", map[string]string{gatewayconf.EnvToken: "cgw_u_nosuchtoken"}, []string{"sandbox", "list"}, 1,
			[]string{"the gateway at " + g.url + " refused the token from $CORRAL_GATEWAY_TOKEN", "run corral gateway login"}},
		{"sandbox token", map[string]string{gatewayconf.EnvToken: sandboxToken}, []string{"sandbox", "list"}, 1,
			[]string{"does not let the token from $CORRAL_GATEWAY_TOKEN do this", "corral gateway token create"}},
		{"unknown sandbox", nil, []string{"sandbox", "get", "nosuch"}, 1,
			[]string{"no sandbox nosuch at the gateway " + g.url}},
		{"unknown sandbox logs", nil, []string{"logs", "nosuch"}, 1,
			[]string{"no sandbox nosuch at the gateway"}},
		{"unknown sandbox delete", nil, []string{"sandbox", "delete", "nosuch"}, 1,
			[]string{"no sandbox nosuch at the gateway"}},
		{"invalid policy", nil, []string{"sandbox", "create", "--driver", "external", "--policy", badPolicy}, 2,
			checkerProblems(t, badPolicy)},
		{"token file missing", map[string]string{gatewayconf.EnvToken: "", gatewayconf.EnvTokenFile: "/nonexistent/token"}, []string{"sandbox", "list"}, 2,
			[]string{"$CORRAL_GATEWAY_TOKEN_FILE: read token"}},
		{"plain http", nil, []string{"sandbox", "list", "--gateway", "http://127.0.0.1:1"}, 2,
			[]string{"the gateway speaks TLS only"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			r := runCorral(t, "", tc.args...)
			if r.code != tc.code {
				t.Errorf("exit %d, want %d: %s", r.code, tc.code, r)
			}
			for _, w := range tc.wants {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("no %q in:\n%s", w, r.stderr)
				}
			}
		})
	}
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// checkerProblems is what corral policy check says of the file, one
// problem a line: the gateway's refusal must carry it as is.
func checkerProblems(t *testing.T, path string) []string {
	t.Helper()
	_, err := policy.Parse(mustReadFile(t, path), "gateway")
	var ve *policy.ValidationError
	if !errors.As(err, &ve) || len(ve.Problems) == 0 {
		t.Fatalf("%s is not invalid: %v", path, err)
	}
	var out []string
	for _, p := range ve.Problems {
		out = append(out, p.String())
	}
	return out
}

func mustReadFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeTemp(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
