package server

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1"
)

func createFake(t *testing.T, g *gw, name string) (id string, sup clients) {
	t.Helper()
	sb, err := g.clients(g.user, nil).sandbox.Create(ctxT(t), connect.NewRequest(&gatewayv1.CreateSandboxRequest{Name: name, Command: []string{"agent"}, Driver: "fake"}))
	if err != nil {
		t.Fatal(err)
	}
	return sb.Msg.Id, g.clients(g.fake.link(sb.Msg.Id).Token, nil)
}

func push(t *testing.T, sup clients, dropped int64, entries ...*gatewayv1.LogEntry) int64 {
	t.Helper()
	s := sup.supervisor.PushLogs(ctxT(t))
	if err := s.Send(&gatewayv1.LogBatch{Entries: entries, Dropped: dropped}); err != nil {
		t.Fatal(err)
	}
	resp, err := s.CloseAndReceive()
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.Accepted
}

// TestPushedLogsAreForcedToTheirSandbox: a supervisor cannot write into
// another sandbox's logs nor pass its lines off as the gateway's.
func TestPushedLogsAreForcedToTheirSandbox(t *testing.T) {
	g := startGateway(t, gwOpts{})
	ctx := ctxT(t)
	a, supA := createFake(t, g, "a")
	b, _ := createFake(t, g, "b")
	n := push(t, supA, 0,
		&gatewayv1.LogEntry{SandboxId: b, Source: "gateway", Level: "error", Event: "sandbox.exit", Message: "forged"},
		&gatewayv1.LogEntry{Source: "audit", Level: "info", Event: "net.connect.denied", Message: "denied", Fields: []byte(`{"host":"x"}`)},
	)
	if n != 2 {
		t.Fatalf("accepted %d", n)
	}
	user := g.clients(g.user, nil)
	inB, err := user.logs.Query(ctx, connect.NewRequest(&gatewayv1.LogQuery{SandboxId: b}))
	if err != nil || len(inB.Msg.Entries) != 0 {
		t.Fatalf("b's logs: %v, %v", inB, err)
	}
	inA, err := user.logs.Query(ctx, connect.NewRequest(&gatewayv1.LogQuery{SandboxId: a}))
	if err != nil || len(inA.Msg.Entries) != 2 {
		t.Fatalf("a's logs: %v, %v", inA, err)
	}
	forged := inA.Msg.Entries[0]
	if forged.SandboxId != a || forged.Source != "supervisor" || forged.Message != "forged" {
		t.Fatalf("forged entry stored as %+v", forged)
	}
	if e := inA.Msg.Entries[1]; e.Source != "audit" || string(e.Fields) != `{"host":"x"}` {
		t.Fatalf("audit entry stored as %+v", e)
	}
}

func TestLogsQueryFollowDropped(t *testing.T) {
	g := startGateway(t, gwOpts{})
	ctx := ctxT(t)
	a, supA := createFake(t, g, "a")
	b, supB := createFake(t, g, "b")
	old := timestamppb.New(time.Now().Add(-time.Hour))
	push(t, supA, 0,
		&gatewayv1.LogEntry{Time: old, Level: "debug", Message: "old debug"},
		&gatewayv1.LogEntry{Level: "warn", Event: "net.connect.denied", Source: "audit", Message: "denied 1", Fields: []byte(`{"host":"x.example.com","reason":"no_matching_policy"}`)},
		&gatewayv1.LogEntry{Level: "info", Event: "net.connect.allowed", Source: "audit", Message: "allowed 1"},
	)
	push(t, supB, 7, &gatewayv1.LogEntry{Level: "error", Message: "b broke"})
	user := g.clients(g.user, nil)

	q := func(lq *gatewayv1.LogQuery) []string {
		t.Helper()
		r, err := user.logs.Query(ctx, connect.NewRequest(lq))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range r.Msg.Entries {
			out = append(out, e.Message)
		}
		return out
	}
	for name, tc := range map[string]struct {
		q    *gatewayv1.LogQuery
		want string
	}{
		"event":     {&gatewayv1.LogQuery{SandboxId: a, Event: "net.connect.denied"}, "denied 1"},
		"min level": {&gatewayv1.LogQuery{SandboxId: a, MinLevel: "info"}, "denied 1|allowed 1"},
		"since":     {&gatewayv1.LogQuery{SandboxId: a, Since: timestamppb.New(time.Now().Add(-time.Minute))}, "denied 1|allowed 1"},
		"limit":     {&gatewayv1.LogQuery{SandboxId: a, Limit: 1}, "old debug"},
		"all warn":  {&gatewayv1.LogQuery{All: true, MinLevel: "warn"}, "denied 1|b broke|the supervisor dropped 7 log lines before they reached the gateway"},
	} {
		if got := strings.Join(q(tc.q), "|"); got != tc.want {
			t.Errorf("%s: got %q, want %q", name, got, tc.want)
		}
	}
	if _, err := user.logs.Query(ctx, connect.NewRequest(&gatewayv1.LogQuery{})); codeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("query without a sandbox: %v", err)
	}
	if _, err := user.logs.Query(ctx, connect.NewRequest(&gatewayv1.LogQuery{SandboxId: a, MinLevel: "loud"})); codeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("query with a bad level: %v", err)
	}

	// Dropped lines are counted per sandbox and in the metrics.
	rb, err := user.logs.Query(ctx, connect.NewRequest(&gatewayv1.LogQuery{SandboxId: b}))
	if err != nil || rb.Msg.Dropped != 7 {
		t.Fatalf("b dropped: %v, %v", rb, err)
	}
	ra, err := user.logs.Query(ctx, connect.NewRequest(&gatewayv1.LogQuery{SandboxId: a}))
	if err != nil || ra.Msg.Dropped != 0 {
		t.Fatalf("a dropped: %v, %v", ra, err)
	}
	var dropped map[string]int64
	if last := rb.Msg.Entries[len(rb.Msg.Entries)-1]; last.Source != "gateway" || last.Event != "logs.dropped" || json.Unmarshal(last.Fields, &dropped) != nil || dropped["dropped"] != 7 {
		t.Fatalf("dropped entry: %+v", last)
	}
	metrics := get(t, g, "/metrics")
	for _, want := range []string{
		"corral_gateway_log_lines_dropped_total 7",
		"corral_gateway_log_lines_received_total 4",
		`corral_gateway_connections_total{decision="denied",reason="no_matching_policy"} 1`,
		`corral_gateway_connections_total{decision="allowed",reason="none"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	// Follow a from after its first entry: the stored ones, then live
	// ones, with filters applied to both, and nothing of b.
	first := ra.Msg.Entries[0].Seq
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	f, err := user.logs.Follow(fctx, connect.NewRequest(&gatewayv1.LogQuery{SandboxId: a, AfterSeq: first, MinLevel: "info"}))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	all, err := user.logs.Follow(fctx, connect.NewRequest(&gatewayv1.LogQuery{All: true, AfterSeq: ra.Msg.Entries[len(ra.Msg.Entries)-1].Seq}))
	if err != nil {
		t.Fatal(err)
	}
	defer all.Close()
	recv := func(s *connect.ServerStreamForClient[gatewayv1.LogEntry]) string {
		t.Helper()
		if !s.Receive() {
			t.Fatal(s.Err())
		}
		return s.Msg().Message
	}
	for _, want := range []string{"denied 1", "allowed 1"} {
		if got := recv(f); got != want {
			t.Fatalf("follow stored: got %q, want %q", got, want)
		}
	}
	push(t, supB, 0, &gatewayv1.LogEntry{Level: "info", Message: "b live"})
	push(t, supA, 0, &gatewayv1.LogEntry{Level: "debug", Message: "a live debug"}, &gatewayv1.LogEntry{Level: "warn", Message: "a live"})
	if got := recv(f); got != "a live" {
		t.Fatalf("follow live: got %q, want a live", got)
	}
	var got []string
	for range 5 {
		got = append(got, recv(all))
	}
	want := "b broke|the supervisor dropped 7 log lines before they reached the gateway|b live|a live debug|a live"
	if strings.Join(got, "|") != want {
		t.Fatalf("follow all: got %q, want %q", strings.Join(got, "|"), want)
	}
}

func TestLogRetention(t *testing.T) {
	g := startGateway(t, gwOpts{retention: 3})
	a, supA := createFake(t, g, "a")
	var es []*gatewayv1.LogEntry
	for i := range 10 {
		es = append(es, &gatewayv1.LogEntry{Level: "info", Message: string(rune('a' + i))})
	}
	push(t, supA, 0, es...)
	g.srv.Prune(ctxT(t))
	r, err := g.clients(g.user, nil).logs.Query(ctxT(t), connect.NewRequest(&gatewayv1.LogQuery{SandboxId: a}))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range r.Msg.Entries {
		got = append(got, e.Message)
	}
	if strings.Join(got, "") != "hij" {
		t.Fatalf("after pruning to 3: %v", got)
	}
}

// TestNegativeDroppedRefused: a batch claiming a negative number of
// dropped lines is refused whole, so a supervisor can neither hide the
// drops it reported nor make the dropped-lines counter panic.
func TestNegativeDroppedRefused(t *testing.T) {
	g := startGateway(t, gwOpts{})
	ctx := ctxT(t)
	id, sup := createFake(t, g, "neg")
	push(t, sup, 500, &gatewayv1.LogEntry{Level: "info", Message: "first"})
	s := sup.supervisor.PushLogs(ctx)
	_ = s.Send(&gatewayv1.LogBatch{Entries: []*gatewayv1.LogEntry{{Level: "info", Message: "hidden"}}, Dropped: -1000000})
	if _, err := s.CloseAndReceive(); codeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "negative") {
		t.Fatalf("push with a negative dropped count: %v, want invalid argument", err)
	}
	q, err := g.clients(g.user, nil).logs.Query(ctx, connect.NewRequest(&gatewayv1.LogQuery{SandboxId: id}))
	if err != nil {
		t.Fatal(err)
	}
	if q.Msg.Dropped != 500 {
		t.Errorf("dropped shown after a refused negative count: %d, want 500", q.Msg.Dropped)
	}
	for _, e := range q.Msg.Entries {
		if e.Message == "hidden" {
			t.Errorf("the refused batch's entry was stored: %v", e)
		}
	}
	if m := get(t, g, "/metrics"); !strings.Contains(m, "corral_gateway_log_lines_dropped_total 500") {
		t.Errorf("metrics after a refused negative count:\n%s", m)
	}
}

// TestPushedEntriesBounded: a supervisor's pushed line is stored with its
// message cut and oversized fields replaced by their size, so one
// credential cannot pin megabytes per line in the gateway's tails; a
// line within the bounds is stored as it came.
func TestPushedEntriesBounded(t *testing.T) {
	g := startGateway(t, gwOpts{})
	ctx := ctxT(t)
	id, sup := createFake(t, g, "big")
	big := strings.Repeat("é", 2<<20)
	fields := `{"x":"` + strings.Repeat("A", 6<<20) + `"}`
	push(t, sup, 0, &gatewayv1.LogEntry{Level: "info", Event: strings.Repeat("e", 1000), Message: big, Fields: []byte(fields)},
		&gatewayv1.LogEntry{Level: "info", Event: "net.connect", Message: "small", Fields: []byte(`{"host":"a.test"}`)})
	q, err := g.clients(g.user, nil).logs.Query(ctx, connect.NewRequest(&gatewayv1.LogQuery{SandboxId: id}))
	if err != nil {
		t.Fatal(err)
	}
	if len(q.Msg.Entries) != 2 {
		t.Fatalf("stored %d entries, want 2", len(q.Msg.Entries))
	}
	e, small := q.Msg.Entries[0], q.Msg.Entries[1]
	if len(e.Event) > maxEventBytes || len(e.Message) > maxLogLineBytes+64 || !utf8.ValidString(e.Message) || !strings.Contains(e.Message, "bytes cut") {
		t.Errorf("oversized line stored with event of %d bytes and message of %d (valid UTF-8 %v): %.80q", len(e.Event), len(e.Message), utf8.ValidString(e.Message), e.Message)
	}
	if string(e.Fields) != `{"fields_cut_bytes":`+strconv.Itoa(len(fields))+`}` {
		t.Errorf("oversized fields stored as %.80q", e.Fields)
	}
	if small.Event != "net.connect" || small.Message != "small" || string(small.Fields) != `{"host":"a.test"}` {
		t.Errorf("a line within the bounds changed: %v", small)
	}
}
