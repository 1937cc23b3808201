package assemble

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/egress/egresstest"
	"github.com/corral-sandbox/corral/internal/linux/capture"
	"github.com/corral-sandbox/corral/internal/policy"
)

func allowing(host string) *policy.Policy {
	return &policy.Policy{Version: 1, NetworkPolicies: map[string]policy.NetworkPolicy{
		"p": {Endpoints: []policy.Endpoint{{Host: host, Port: 443}}},
	}}
}

func newEgress(t *testing.T, p *policy.Policy, log *egresstest.AuditBuffer) *Egress {
	t.Helper()
	c, err := p.Compile()
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	e, err := New(Config{ID: "test", Policy: c, Audit: audit.New(log)})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return e
}

// A reload takes effect whole or not at all: one the secrets refuse leaves
// the decisions as they were.
func TestSwapWholeOrNothing(t *testing.T) {
	e := newEgress(t, allowing("a.example.com"), &egresstest.AuditBuffer{})
	req := egress.Request{Host: "a.example.com", Port: 443}
	withSecret := allowing("b.example.com")
	withSecret.NetworkPolicies["p"].Endpoints[0].Protocol = policy.ProtocolREST
	withSecret.NetworkPolicies["p"].Endpoints[0].Access = policy.AccessFull
	withSecret.Secrets = map[string]policy.Secret{"TOKEN": {FromEnv: "TOKEN", Hosts: []string{"b.example.com"}}}
	if _, err := withSecret.Compile(); err != nil {
		t.Fatalf("the policy must be valid for the test to reach the secrets: %v", err)
	}
	if err := e.Policy().Apply(withSecret, "secret.yaml"); err == nil {
		t.Fatal("a reload adding a secret to a running sandbox was accepted")
	}
	if d := e.Policy().Decide(context.Background(), req); !d.Allow {
		t.Fatalf("after a refused reload a.example.com is denied (%s): the reload took effect in part", d.Reason)
	}
	if err := e.Policy().Apply(allowing("b.example.com"), "b.yaml"); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if d := e.Policy().Decide(context.Background(), req); d.Allow {
		t.Fatal("a.example.com is still allowed after a reload that removed it")
	}
}

// The trust files hold the sandbox CA, alone and added to the host's
// bundle, in the forms the plan mounts.
func TestTrustFiles(t *testing.T) {
	e := newEgress(t, allowing("a.example.com"), &egresstest.AuditBuffer{})
	files := e.TrustFiles()
	ca := string(bytes.Join(files["ca.pem"], nil))
	if !strings.Contains(ca, "BEGIN CERTIFICATE") || !strings.Contains(string(bytes.Join(files["ca-bundle.pem"], nil)), ca) {
		t.Errorf("ca.pem is not a certificate contained in ca-bundle.pem")
	}
	var store bytes.Buffer
	if err := e.JavaTrustStore(&store, t.TempDir()); err != nil || store.Len() == 0 {
		t.Errorf("no Java trust store (%v)", err)
	}
	// The browsers' managed policy names the same CA, as base64 DER.
	var pol struct{ CACertificates []string }
	if err := json.Unmarshal(e.BrowserPolicy(), &pol); err != nil || len(pol.CACertificates) != 1 {
		t.Fatalf("browser policy %q: %v", e.BrowserPolicy(), err)
	}
	der, err := base64.StdEncoding.DecodeString(pol.CACertificates[0])
	block, _ := pem.Decode([]byte(ca))
	if err != nil || block == nil || !bytes.Equal(der, block.Bytes) {
		t.Errorf("the browser policy's certificate is not the sandbox CA (%v)", err)
	}
}

// listenerFile returns a listening socket's file, as the sandbox's init
// hands it over, and its address.
func listenerFile(t *testing.T) (*os.File, string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	f, err := l.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	return f, l.Addr().String()
}

// Start serves the listeners it is given through one gate: a connection
// on the HTTP proxy is identified, refused when that fails, and audited.
func TestStartServesListeners(t *testing.T) {
	var log egresstest.AuditBuffer
	e := newEgress(t, allowing("a.example.com"), &log)
	f, addr := listenerFile(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// No init pid: every identification fails, so the refusal shows the
	// identifier is in the path.
	if err := e.Start(ctx, Sandbox{Listeners: &capture.Listeners{HTTPProxy: f}}); err != nil {
		t.Fatalf("Start: %v", err)
	}
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprint(c, "CONNECT a.example.com:443 HTTP/1.1\r\nHost: a.example.com:443\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("read reply: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("CONNECT by an unidentifiable client: %s, want 403", resp.Status)
	}
	if e.gate.Load() == nil {
		t.Error("Start left no gate for reloads to re-decide")
	}
	for _, ev := range log.Events(t) {
		if ev["event"] == string(audit.NetConnectDenied) && ev["reason"] == egress.ReasonIdentity && ev["via"] == egress.ViaHTTPConnect {
			return
		}
	}
	t.Errorf("no %s event with reason %s:\n%s", audit.NetConnectDenied, egress.ReasonIdentity, log.String())
}
