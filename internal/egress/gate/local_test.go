package gate_test

import (
	"bufio"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/egress/egresstest"
	"github.com/corral-sandbox/corral/internal/egress/gate"
)

// greeter is a local service that answers one line with the request it
// was handed.
type greeter struct{}

func (greeter) ServeConn(_ context.Context, c net.Conn, r egress.Request) {
	defer c.Close()
	line, _ := bufio.NewReader(c).ReadString('\n')
	c.Write([]byte("hello " + r.Host + " " + strings.TrimSpace(line) + "\n"))
}

// A service's name is answered by the supervisor on 80 and 443 whatever
// the policy says, with an audit event and no upstream; a reload never
// revokes it, and other ports of the name are refused.
func TestLocalServiceBypassesThePolicy(t *testing.T) {
	var trail egresstest.AuditBuffer
	dial := &egresstest.Dialer{Addr: "127.0.0.1:1"}
	g := &gate.Gate{
		Decider:  egresstest.Decider{}, // allows nothing
		Dialer:   dial,
		Audit:    audit.New(&trail),
		Services: map[string]egress.LocalService{"policy.local": greeter{}},
	}
	client, proxySide := net.Pipe()
	defer client.Close()
	tun, err := g.Connect(context.Background(), proxySide, egress.Request{Host: "Policy.Local.", Port: 80, Via: "transparent"})
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	if tun.Up != nil || tun.Local == nil || len(dial.Requests()) != 0 {
		t.Fatalf("a service connection was dialled upstream: %+v", tun)
	}
	done := make(chan struct{})
	go func() {
		g.Carry(context.Background(), proxySide, tun, []byte("ping"), time.Minute)
		close(done)
	}()
	if n := g.Revoke(context.Background()); n != 0 {
		t.Errorf("a reload revoked %d service connections", n)
	}
	client.Write([]byte("\n"))
	got, _ := bufio.NewReader(client).ReadString('\n')
	if got != "hello Policy.Local. ping\n" {
		t.Errorf("service answered %q, want the bytes read ahead replayed to it", got)
	}
	<-done
	if _, err := g.Connect(context.Background(), proxySide, egress.Request{Host: "policy.local", Port: 22}); err == nil {
		t.Error("port 22 of a service name was admitted")
	}
	ev := trail.Events(t)
	if len(ev) != 2 || ev[0]["event"] != "net.connect.allowed" || ev[0]["policy"] != "Policy.Local." || ev[1]["event"] != "net.connect.denied" {
		t.Errorf("events %v, want one allowed and one denied connection", ev)
	}
}
