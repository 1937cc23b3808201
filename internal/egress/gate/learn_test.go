package gate_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/egress/egresstest"
	"github.com/corral-sandbox/corral/internal/egress/gate"
)

// refusing refuses everything with one reason.
type refusing struct {
	egresstest.Decider
	reason string
}

func (r refusing) Decide(context.Context, egress.Request) egress.Decision {
	return egress.Decision{Reason: r.reason}
}

// Learn mode lets through what is refused for want of a policy, marked
// "learn", and nothing refused for who the client is or what it claims.
func TestLearn(t *testing.T) {
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	go func() {
		for {
			c, err := up.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	for _, tc := range []struct {
		reason string
		allow  bool
	}{
		{egress.ReasonNoPolicy, true},
		{egress.ReasonBinary, true},
		{egress.ReasonIntegrity, false},
		{egress.ReasonIdentity, false},
		{egress.ReasonEngine, false},
		{egress.ReasonInternalAddress, false},
	} {
		var buf bytes.Buffer
		g := &gate.Gate{Decider: refusing{reason: tc.reason}, Dialer: &egresstest.Dialer{Addr: up.Addr().String()}, Audit: audit.New(&buf), Learn: true}
		client, _ := net.Pipe()
		tun, err := g.Connect(context.Background(), client, egress.Request{Host: "learn.example.com", Port: 443})
		client.Close()
		if tun != nil {
			tun.Up.Close()
		}
		if allowed := err == nil; allowed != tc.allow {
			t.Errorf("%s: allowed %v, want %v (%v)", tc.reason, allowed, tc.allow, err)
		}
		if tc.allow && !strings.Contains(buf.String(), `"decision":"learn"`) {
			t.Errorf("%s: event without decision learn: %s", tc.reason, buf.String())
		}
	}
	// Off, the same refusal stands.
	g := &gate.Gate{Decider: refusing{reason: egress.ReasonNoPolicy}, Dialer: &egresstest.Dialer{Addr: "127.0.0.1:9"}}
	client, _ := net.Pipe()
	defer client.Close()
	if _, err := g.Connect(context.Background(), client, egress.Request{Host: "learn.example.com", Port: 443}); err == nil {
		t.Errorf("without learn mode the connection was allowed")
	}
}

type advice struct{}

func (advice) For(r egress.Request) (string, []string) {
	return "c0ffee", []string{"corral draft approve c0ffee"}
}

// A denial event names the pending chunk the advice has for it.
func TestDenialNamesDraft(t *testing.T) {
	var buf bytes.Buffer
	g := &gate.Gate{Decider: egresstest.Decider{}, Dialer: &egresstest.Dialer{Addr: "127.0.0.1:9"}, Audit: audit.New(&buf), Advice: advice{}}
	client, _ := net.Pipe()
	defer client.Close()
	if _, err := g.Connect(context.Background(), client, egress.Request{Host: "x.example.com", Port: 443}); err == nil {
		t.Fatal("allowed")
	}
	var ev map[string]any
	if err := json.Unmarshal(buf.Bytes(), &ev); err != nil {
		t.Fatal(err)
	}
	if ev["draft_chunk"] != "c0ffee" || ev["next_steps"] != "corral draft approve c0ffee" {
		t.Errorf("event %v", ev)
	}
}
