package egress_test

import (
	"context"
	"net"
	"testing"

	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/egress/egresstest"
)

// inspecting allows everything and asks for HTTP inspection.
type inspecting struct{ egresstest.Decider }

func (inspecting) Decide(context.Context, egress.Request) egress.Decision {
	return egress.Decision{Allow: true, Policy: "p", Inspect: true}
}

// A gate without an inspector must refuse a connection whose endpoint asks
// for inspection: relaying it as bytes would drop the policy's HTTP rules
// without a word.
func TestGateRefusesInspectionItCannotDo(t *testing.T) {
	dialer := &egresstest.Dialer{Addr: "127.0.0.1:9"}
	g := &egress.Gate{Decider: inspecting{}, Dialer: dialer}
	client, _ := net.Pipe()
	defer client.Close()
	_, err := g.Connect(context.Background(), client, egress.Request{Host: "api.example.com", Port: 443})
	de, ok := egress.AsDeny(err)
	if !ok || de.Decision.Reason != egress.ReasonEngine {
		t.Fatalf("Connect: %v, want a decision_error refusal", err)
	}
	if len(dialer.Requests()) != 0 {
		t.Errorf("the gate dialled upstream for a connection it refused")
	}
}
