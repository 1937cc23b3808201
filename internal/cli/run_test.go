package cli

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/internal/l7/ca"
	"github.com/corral-sandbox/corral/internal/plan"
)

func TestWorkloadEnvKeepsOnlySafeVariables(t *testing.T) {
	host := []string{"PATH=/bin", "HOME=/root", "SECRET_TOKEN=hunter2", "AWS_SECRET_ACCESS_KEY=x",
		"LANG=C.UTF-8", "LC_ALL=C", "TERM=xterm", "SSH_AUTH_SOCK=/run/agent", "TZ=UTC", "USER=root"}
	pl := &plan.Plan{User: plan.User{Name: "nobody", Home: "/home/nobody"}}
	env := workloadEnv(host, pl, false, []string{"CI=1", "PATH=/opt/bin"})
	want := []string{"PATH=/opt/bin", "LANG=C.UTF-8", "LC_ALL=C", "TERM=xterm", "TZ=UTC",
		"HOME=/home/nobody", "USER=nobody", "LOGNAME=nobody", "CORRAL_SANDBOX=1", "CI=1"}
	if !slices.Equal(env, want) {
		t.Fatalf("env =\n%v\nwant\n%v", env, want)
	}
	for _, kv := range env {
		if strings.Contains(kv, "SECRET") || strings.HasPrefix(kv, "SSH_AUTH_SOCK") {
			t.Errorf("leaked %s", kv)
		}
	}
}

func TestParseEnvFlags(t *testing.T) {
	t.Setenv("CORRAL_TEST_PASS", "v1")
	got, err := parseEnvFlags([]string{"A=b=c", "EMPTY="}, []string{"CORRAL_TEST_PASS"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"CORRAL_TEST_PASS=v1", "A=b=c", "EMPTY="}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for _, bad := range []struct{ set, pass []string }{
		{[]string{"NOEQUALS"}, nil},
		{[]string{"=v"}, nil},
		{[]string{"A B=c"}, nil},
		{nil, []string{"CORRAL_TEST_SURELY_UNSET"}},
	} {
		if _, err := parseEnvFlags(bad.set, bad.pass); err == nil {
			t.Errorf("parseEnvFlags(%v, %v) accepted bad input", bad.set, bad.pass)
		}
	}
}

func TestUpstreamRoots(t *testing.T) {
	dir := t.TempDir()
	authority, err := ca.New("test", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "ca.pem")
	empty := filepath.Join(dir, "empty.pem")
	os.WriteFile(good, authority.CertPEM(), 0o644)
	os.WriteFile(empty, []byte("not a certificate\n"), 0o644)
	for _, bad := range []string{empty, filepath.Join(dir, "missing.pem")} {
		if _, err := upstreamRoots([]string{bad}); err == nil || !strings.Contains(err.Error(), "--upstream-ca") {
			t.Errorf("%s: err = %v, want an --upstream-ca error at start", bad, err)
		}
	}
	roots, err := upstreamRoots([]string{good})
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := authority.Leaf("api.example.com")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "api.example.com", Roots: roots()}); err != nil {
		t.Errorf("a leaf of the --upstream-ca does not verify: %v", err)
	}
	if first, second := roots(), roots(); first != second {
		t.Error("the roots are built again on each use")
	}
}

func TestParseTrustedCIDRs(t *testing.T) {
	got, err := parseTrustedCIDRs([]string{"10.20.0.0/16", "fd12:3456::/48"})
	if err != nil || len(got) != 2 {
		t.Fatalf("private networks refused: %v %v", got, err)
	}
	for _, bad := range []string{"10.20.0.1/16", "0.0.0.0/0", "127.0.0.0/8", "169.254.0.0/16", "8.8.8.0/24", "nonsense"} {
		if _, err := parseTrustedCIDRs([]string{bad}); err == nil {
			t.Errorf("--trusted-cidr %s accepted", bad)
		}
	}
}

// Session names: a letter or digit, then letters, digits, dots, dashes and
// underscores, 64 bytes at most.
func TestValidSession(t *testing.T) {
	for name, want := range map[string]bool{
		"default": true, "ci.build-7_x": true, strings.Repeat("s", 64): true,
		strings.Repeat("s", 65): false, "": false, "-x": false, "a/b": false,
	} {
		if got := validSession(name); got != want {
			t.Errorf("validSession(%q) = %v, want %v", name, got, want)
		}
	}
}

// The working directory is refused when a planted link leads to it, and
// the link is only seen in the path the user reached it by: from a shell
// that did `cd pkg`, that is $PWD, which resolveWorkdir must keep.
func TestResolveWorkdirKeepsTheNamedPath(t *testing.T) {
	dir := t.TempDir()
	target, link := filepath.Join(dir, "target"), filepath.Join(dir, "pkg")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	t.Chdir(link)
	t.Setenv("PWD", link)
	real, named, err := resolveWorkdir("")
	if err != nil || real != target || named != link {
		t.Fatalf("from cd pkg: %q named %q, %v; want %q named %q", real, named, err, target, link)
	}
	if real, named, err = resolveWorkdir(link); err != nil || real != target || named != link {
		t.Fatalf("--workdir pkg: %q named %q, %v", real, named, err)
	}
}
