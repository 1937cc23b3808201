package control

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/statedir"
)

// policyHandler accepts any policy but "bad", counting versions as the
// supervisor does.
type policyHandler struct {
	mu       sync.Mutex
	version  int
	policy   string
	source   string
	setCalls int
}

func (h *policyHandler) Status() Status {
	h.mu.Lock()
	defer h.mu.Unlock()
	return Status{ID: "sb", PolicyVersion: h.version}
}

func (h *policyHandler) calls() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.setCalls
}

func (h *policyHandler) SetPolicy(yaml []byte, source string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.setCalls++
	if string(yaml) == "bad" {
		return errors.New("policy rejected: network_policies.x: bad")
	}
	h.version++
	h.policy, h.source = string(yaml), source
	return nil
}

type server struct {
	state, id string
	h         *policyHandler
}

func (s *server) path() string { return statedir.Control(s.state, s.id) }

func (s *server) call(t *testing.T, req Request) Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := Call(ctx, s.state, s.id, req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// raw sends bytes as they are, for requests Call would never send.
func (s *server) raw(t *testing.T, payload string) Response {
	t.Helper()
	c, err := net.Dial("unix", s.path())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(payload)); err != nil {
		t.Fatal(err)
	}
	// A request cut short ends here instead of at the server's deadline.
	if err := c.(*net.UnixConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	var resp Response
	if err := json.NewDecoder(c).Decode(&resp); err != nil {
		t.Fatalf("read response: %v", err)
	}
	return resp
}

// serve starts a control server the way the supervisor does, on a socket
// in a fresh state directory, and stops it when the test ends.
func serve(t *testing.T, allow func(Peer) error) *server {
	t.Helper()
	s := &server{state: t.TempDir(), id: "sb", h: &policyHandler{version: 1}}
	if err := os.MkdirAll(statedir.Run(s.state, s.id), 0o700); err != nil {
		t.Fatal(err)
	}
	l, err := Listen(s.path())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, l, s.h, allow, slog.New(slog.DiscardHandler)) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve after cancel: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Serve did not return after its context was cancelled")
		}
		if _, err := net.Dial("unix", s.path()); err == nil {
			t.Error("the control socket still accepts connections after Serve returned")
		}
	})
	return s
}

func allowAll(Peer) error { return nil }

func wantError(t *testing.T, resp Response, parts ...string) {
	t.Helper()
	if resp.OK || resp.Status != nil {
		t.Fatalf("got success %+v, want an error", resp)
	}
	for _, p := range parts {
		if !strings.Contains(resp.Error, p) {
			t.Errorf("error %q does not mention %q", resp.Error, p)
		}
	}
	if resp.V != Version {
		t.Errorf("error response has version %d, want %d", resp.V, Version)
	}
}

func TestStatusRoundTrip(t *testing.T) {
	s := serve(t, allowAll)
	fi, err := os.Stat(s.path())
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("control socket mode %04o, want 0600", fi.Mode().Perm())
	}
	resp := s.call(t, Request{Op: OpStatus})
	if !resp.OK || resp.Status == nil || resp.Status.ID != "sb" || resp.Status.PolicyVersion != 1 || resp.V != Version {
		t.Fatalf("status: got %+v", resp)
	}
}

func TestSetPolicy(t *testing.T) {
	s := serve(t, allowAll)
	resp := s.call(t, Request{Op: OpSetPolicy, Policy: "network_policies: {}\n", Source: "new.yaml"})
	if !resp.OK || resp.Status == nil || resp.Status.PolicyVersion != 2 {
		t.Fatalf("accepted policy: got %+v, want OK with version 2", resp)
	}
	s.h.mu.Lock()
	policy, source := s.h.policy, s.h.source
	s.h.mu.Unlock()
	if policy != "network_policies: {}\n" || source != "new.yaml" {
		t.Errorf("handler got policy %q from %q", policy, source)
	}
	wantError(t, s.call(t, Request{Op: OpSetPolicy, Policy: "bad", Source: "bad.yaml"}), "policy rejected: network_policies.x: bad")
	if st := s.call(t, Request{Op: OpStatus}); st.Status == nil || st.Status.PolicyVersion != 2 {
		t.Errorf("after a rejected policy: got %+v, want version 2 kept", st)
	}
}

func TestRefusedPeer(t *testing.T) {
	seen := make(chan Peer, 1)
	s := serve(t, func(p Peer) error {
		seen <- p
		return errors.New("client in another pid namespace")
	})
	wantError(t, s.call(t, Request{Op: OpSetPolicy, Policy: "network_policies: {}\n"}), "refused", "client in another pid namespace")
	if s.h.calls() != 0 {
		t.Errorf("a refused client's policy reached the handler %d time(s)", s.h.calls())
	}
	if p := <-seen; p.PID != os.Getpid() || p.UID != os.Getuid() {
		t.Errorf("allow saw %+v, want this process (pid %d, uid %d)", p, os.Getpid(), os.Getuid())
	}
}

func TestBadRequests(t *testing.T) {
	s := serve(t, allowAll)
	for _, c := range []struct{ name, payload, want string }{
		{"not JSON", "{nope\n", "bad request"},
		{"not an object", "[1,2]\n", "bad request"},
		{"cut short", `{"op":"status"`, "bad request"},
		{"unknown field", `{"op":"status","policy_path":"/etc/x"}` + "\n", `unknown field "policy_path"`},
		{"unknown operation", `{"op":"shutdown"}` + "\n", `unknown operation "shutdown"`},
	} {
		t.Run(c.name, func(t *testing.T) { wantError(t, s.raw(t, c.payload), c.want) })
	}
	if s.h.calls() != 0 {
		t.Errorf("bad requests reached the handler %d time(s)", s.h.calls())
	}
}

func TestOversizedRequest(t *testing.T) {
	s := serve(t, allowAll)
	resp := s.call(t, Request{Op: OpSetPolicy, Policy: strings.Repeat("#", maxRequest)})
	wantError(t, resp, "larger than 4194304 bytes")
	if s.h.calls() != 0 {
		t.Errorf("an oversized policy reached the handler")
	}
	// The server is still there for the next client.
	if st := s.call(t, Request{Op: OpStatus}); !st.OK {
		t.Errorf("status after an oversized request: %+v", st)
	}
}

func TestProtocolVersion(t *testing.T) {
	s := serve(t, allowAll)
	// A corral from before the field sends none: it speaks version 1.
	if resp := s.raw(t, `{"op":"status"}`+"\n"); !resp.OK || resp.V != Version {
		t.Errorf("request without a version: got %+v", resp)
	}
	if resp := s.raw(t, `{"v":1,"op":"status"}`+"\n"); !resp.OK {
		t.Errorf("version 1 request: got %+v", resp)
	}
	// The version is judged before anything else, so fields of a newer
	// version are not reported as unknown.
	wantError(t, s.raw(t, `{"v":2,"op":"set_policy","policy":"x","dry_run":true}`+"\n"),
		"control protocol version 2 is not supported", "speaks version 1")
	wantError(t, s.raw(t, `{"v":0,"op":"status"}`+"\n"), "version 0 is not supported")
	if s.h.calls() != 0 {
		t.Errorf("a request of another version reached the handler")
	}
}

// TestCallRejectsNewerResponse: a client never reads a newer response as
// if it were its own version.
func TestCallRejectsNewerResponse(t *testing.T) {
	state := t.TempDir()
	if err := os.MkdirAll(statedir.Run(state, "sb"), 0o700); err != nil {
		t.Fatal(err)
	}
	l, err := Listen(statedir.Control(state, "sb"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var req Request
		_ = json.NewDecoder(c).Decode(&req)
		_ = json.NewEncoder(c).Encode(map[string]any{"v": Version + 1, "ok": true})
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = Call(ctx, state, "sb", Request{Op: OpStatus})
	if err == nil || !strings.Contains(err.Error(), "control protocol version 2") {
		t.Fatalf("Call of a newer sandbox: err %v, want one naming version 2", err)
	}
}
