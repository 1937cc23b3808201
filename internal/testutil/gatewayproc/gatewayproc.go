// Package gatewayproc runs a real corral-gateway process for tests and
// benchmarks: a fresh data directory, a free loopback port, the local
// driver starting a given corral, a user token, and a cleanup that deletes
// every sandbox, stops the gateway and fails the test for any supervisor
// left running.
package gatewayproc

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1/gatewayv1connect"
)

// Options say which binaries to run and where.
type Options struct {
	// Gateway and Corral are the corral-gateway and corral binaries.
	Gateway, Corral string
	// Dir holds the data directory; empty is a TempDir of the test.
	Dir string
	// LogLevel is the gateway's (default debug).
	LogLevel string
	// Args are more flags for the gateway.
	Args []string
}

// Proc is one gateway; a restart keeps its data directory and address.
type Proc struct {
	tb   testing.TB
	opts Options
	// Data is the data directory, URL the gateway's https:// address,
	// User a user token's secret.
	Data, Addr, URL, User string

	runs int
	cmd  *exec.Cmd
	done chan struct{}
	log  string

	mu         sync.Mutex
	transports []*http.Transport
}

// Start starts a gateway and creates a user token.
func Start(tb testing.TB, o Options) *Proc {
	tb.Helper()
	if o.LogLevel == "" {
		o.LogLevel = "debug"
	}
	dir := o.Dir
	if dir == "" {
		dir = tb.TempDir()
	}
	data, err := os.MkdirTemp(dir, "gw-")
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	p := &Proc{tb: tb, opts: o, Data: data, Addr: addr, URL: "https://" + addr}
	tb.Cleanup(func() {
		p.Stop()
		p.killLeftovers()
		os.RemoveAll(data)
	})
	p.Restart()
	p.User = p.Token("--name", "test")
	// Registered after the stop above, so it runs first, with the
	// gateway up.
	tb.Cleanup(p.DeleteAll)
	return p
}

// SandboxStateDir is the state directory of the supervisors the gateway
// starts.
func (p *Proc) SandboxStateDir() string { return filepath.Join(p.Data, "sandbox-state") }

// Restart runs the gateway (again) and waits until /readyz answers.
func (p *Proc) Restart() {
	p.tb.Helper()
	p.runs++
	p.log = filepath.Join(p.Data, fmt.Sprintf("gateway-%d.log", p.runs))
	logf, err := os.Create(p.log)
	if err != nil {
		p.tb.Fatal(err)
	}
	defer logf.Close()
	// The supervisors' state (audit log, carried programs, saved gateway
	// credentials) stays with the test's data, not in the host's
	// /var/lib/corral.
	args := append([]string{"--listen", p.Addr, "--data", p.Data, "--corral", p.opts.Corral, "--log-level", p.opts.LogLevel,
		"--sandbox-state-dir", p.SandboxStateDir()}, p.opts.Args...)
	cmd := exec.Command(p.opts.Gateway, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", "HOME=/root"}
	if err := cmd.Start(); err != nil {
		p.tb.Fatalf("start corral-gateway: %v", err)
	}
	p.cmd, p.done = cmd, make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for !p.ready() {
		select {
		case <-p.done:
			p.tb.Fatalf("corral-gateway exited at start:\n%s", p.Logs())
		default:
		}
		if time.Now().After(deadline) {
			p.tb.Fatalf("corral-gateway not ready after 30s:\n%s", p.Logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *Proc) ready() bool {
	if _, err := os.Stat(p.CAFile()); err != nil {
		return false
	}
	resp, err := p.HTTPClient("").Get(p.URL + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// CAFile is the gateway's CA certificate.
func (p *Proc) CAFile() string { return filepath.Join(p.Data, "tls", "ca.pem") }

// Logs is what the current run of the gateway wrote.
func (p *Proc) Logs() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

// PID is the gateway process's.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Kill ends the gateway with SIGKILL: no graceful stop, no last words.
func (p *Proc) Kill() {
	p.closeIdle()
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop ends the gateway with SIGTERM, then SIGKILL.
func (p *Proc) Stop() {
	if p.cmd == nil {
		return
	}
	select {
	case <-p.done:
		return
	default:
	}
	p.closeIdle()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		p.tb.Errorf("corral-gateway ignored SIGTERM for 15s")
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
	}
}

func (p *Proc) closeIdle() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, tr := range p.transports {
		tr.CloseIdleConnections()
	}
}

// HTTPClient trusts the gateway's CA and sends token ("" sends none).
func (p *Proc) HTTPClient(token string) *http.Client {
	pem, _ := os.ReadFile(p.CAFile())
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}
	p.mu.Lock()
	p.transports = append(p.transports, tr)
	p.mu.Unlock()
	var rt http.RoundTripper = tr
	if token != "" {
		rt = bearer{token, tr}
	}
	return &http.Client{Transport: rt}
}

type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// Token makes a token with corral-gateway's admin command on the same data
// directory, as an operator would, and returns its secret.
func (p *Proc) Token(args ...string) string {
	p.tb.Helper()
	args = append([]string{"token", "create", "--data", p.Data}, args...)
	out, err := exec.Command(p.opts.Gateway, args...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			p.tb.Fatalf("corral-gateway %s: %v\n%s", strings.Join(args, " "), err, ee.Stderr)
		}
		p.tb.Fatalf("corral-gateway %s: %v", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out))
}

// SandboxToken is the credential the local driver gave sandbox id.
func (p *Proc) SandboxToken(id string) string {
	p.tb.Helper()
	b, err := os.ReadFile(filepath.Join(p.Data, "sandboxes", id, "token"))
	if err != nil {
		p.tb.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// SupervisorLog is what the supervisor of id (and its workload) wrote.
func (p *Proc) SupervisorLog(id string) string {
	b, _ := os.ReadFile(filepath.Join(p.Data, "sandboxes", id, "supervisor.log"))
	return string(b)
}

// DeleteAll deletes every sandbox the gateway has, a few at a time; the
// local driver stops their supervisors.
func (p *Proc) DeleteAll() {
	select {
	case <-p.done:
		return
	default:
	}
	c := gatewayv1connect.NewSandboxServiceClient(p.HTTPClient(p.User), p.URL, connect.WithGRPC())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	resp, err := c.List(ctx, connect.NewRequest(&gatewayv1.ListSandboxesRequest{}))
	if err != nil {
		p.tb.Errorf("cleanup: list sandboxes: %v", err)
		return
	}
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for _, sb := range resp.Msg.Sandboxes {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if _, err := c.Delete(ctx, connect.NewRequest(&gatewayv1.DeleteSandboxRequest{Id: sb.Id})); err != nil {
				p.tb.Errorf("cleanup: delete sandbox %s: %v", sb.Id, err)
			}
		}()
	}
	wg.Wait()
}

// Supervisors returns the pids of the supervisors the local driver started
// for this gateway (all of them for ""): their token file lies in its data
// directory.
func (p *Proc) Supervisors(sandboxID string) []int {
	needle := filepath.Join(p.Data, "sandboxes", sandboxID)
	if sandboxID == "" {
		needle = filepath.Join(p.Data, "sandboxes") + "/"
	}
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), needle) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// killLeftovers fails the test for any supervisor still running once the
// gateway deleted its sandboxes, and kills it with its process group.
func (p *Proc) killLeftovers() {
	for _, pid := range p.Supervisors("") {
		if st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); strings.Contains(string(st), ") Z ") {
			continue
		}
		p.tb.Errorf("supervisor %d still runs after its sandbox was deleted and the gateway stopped", pid)
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}
