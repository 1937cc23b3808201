package fleet

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1/gatewayv1connect"
)

func pushLogs(t *testing.T, sup gatewayv1connect.SupervisorServiceClient, dropped int64, entries ...*gatewayv1.LogEntry) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := sup.PushLogs(ctx)
	if err := s.Send(&gatewayv1.LogBatch{Entries: entries, Dropped: dropped}); err != nil {
		t.Fatal(err)
	}
	resp, err := s.CloseAndReceive()
	if err != nil {
		t.Fatal(err)
	}
	if int(resp.Msg.Accepted) != len(entries) {
		t.Fatalf("accepted %d of %d", resp.Msg.Accepted, len(entries))
	}
}

func TestLogsQueryAndFollow(t *testing.T) {
	g := startTestGateway(t)
	g.useEnv()
	a := g.createExternal("a")
	b := g.createExternal("b")
	pushLogs(t, g.supervisor(a), 7,
		&gatewayv1.LogEntry{Time: timestamppb.New(time.Now().Add(-time.Hour)), Level: "debug", Event: "old", Message: "an hour ago"},
		&gatewayv1.LogEntry{Level: "warn", Event: "net.connect.denied", Source: "audit", Message: "denied",
			Fields: []byte(`{"event":"net.connect.denied","host":"x.example.com","port":443,"reason":"no_matching_policy"}`)},
		&gatewayv1.LogEntry{Level: "info", Event: "net.connect.allowed", Source: "audit", Message: "allowed"},
	)
	pushLogs(t, g.supervisor(b), 0, &gatewayv1.LogEntry{Level: "error", Event: "sandbox.exit", Message: "b broke"})

	lines := func(r cliResult) []string {
		t.Helper()
		if r.code != 0 {
			t.Fatalf("%s", r)
		}
		return strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	}
	dropped := "corral: 7 lines were dropped by the supervisor before reaching the gateway\n"

	r := runCorral(t, "", "logs", a)
	got := lines(r)
	// The gateway records the drop as an entry of its own, too.
	if len(got) != 4 || r.stderr != dropped || !strings.Contains(got[3], "logs.dropped") {
		t.Fatalf("logs %s: %s", a, r)
	}
	if want := " WARN  net.connect.denied denied host=x.example.com port=443 reason=no_matching_policy"; !strings.HasSuffix(got[1], want) {
		t.Errorf("line %q, want …%q", got[1], want)
	}
	if _, err := time.Parse("2006-01-02T15:04:05.000Z07:00", strings.Fields(got[1])[0]); err != nil {
		t.Errorf("line %q does not start with the time: %v", got[1], err)
	}

	if got := lines(runCorral(t, "", "logs", a, "--event", "net.connect.denied")); len(got) != 1 || !strings.Contains(got[0], "denied host=") {
		t.Errorf("--event: %q", got)
	}
	if got := lines(runCorral(t, "", "logs", a, "--level", "info")); len(got) != 3 || strings.Contains(got[0], "an hour ago") {
		t.Errorf("--level info: %q", got)
	}
	if got := lines(runCorral(t, "", "logs", a, "--since", "10m")); len(got) != 3 || strings.Contains(got[0], "an hour ago") {
		t.Errorf("--since 10m: %q", got)
	}
	if got := lines(runCorral(t, "", "logs", a, "--limit", "1")); len(got) != 1 || !strings.Contains(got[0], "an hour ago") {
		t.Errorf("--limit 1: %q", got)
	}
	r = runCorral(t, "", "logs", b)
	if r.stderr != "" {
		t.Errorf("a sandbox with no drops reports some: %s", r)
	}

	for i, l := range lines(runCorral(t, "", "logs", a, "--json")) {
		var e struct {
			SandboxID string         `json:"sandbox_id"`
			Event     string         `json:"event"`
			Fields    map[string]any `json:"fields"`
		}
		if err := json.Unmarshal([]byte(l), &e); err != nil || e.SandboxID != a {
			t.Fatalf("--json line %d %q: %v", i, l, err)
		}
		if e.Event == "net.connect.denied" && e.Fields["host"] != "x.example.com" {
			t.Errorf("--json fields: %v", e.Fields)
		}
	}

	follow := startCorral(t, "logs", "--all", "--follow", "--level", "warn")
	follow.waitFor(t, " "+a+" WARN  net.connect.denied", " "+b+" ERROR sandbox.exit b broke")
	pushLogs(t, g.supervisor(b), 0,
		&gatewayv1.LogEntry{Level: "info", Event: "quiet", Message: "below the level"},
		&gatewayv1.LogEntry{Level: "warn", Event: "net.connect.denied", Message: "live one"})
	follow.waitFor(t, " "+b+" WARN  net.connect.denied live one")
	if c := follow.stop(t); c != 0 {
		t.Errorf("follow exited %d: %s", c, follow.err.String())
	}
	if strings.Contains(follow.out.String(), "below the level") {
		t.Errorf("follow printed an entry below --level:\n%s", follow.out.String())
	}
	if follow.err.String() != dropped {
		t.Errorf("follow --all stderr %q, want %q", follow.err.String(), dropped)
	}

	for _, bad := range [][]string{{"logs"}, {"logs", a, "--all"}, {"logs", a, "--level", "loud"}, {"logs", a, "--since", "yesterday"}, {"logs", a, "-f", "--limit", "3"}} {
		if r := runCorral(t, "", bad...); r.code != 2 {
			t.Errorf("%q: %s", bad, r)
		}
	}
}

func TestFieldsSummary(t *testing.T) {
	for raw, want := range map[string]string{
		``:                              "",
		`{"msg":"m","level":"warn"}`:    "",
		`{"b":2,"a":"x","c":{"d":[1]}}`: `a=x b=2 c={"d":[1]}`,
		`{"path":"/a b"}`:               `path="/a b"`,
		`not json`:                      "not json",
	} {
		if got := fieldsSummary([]byte(raw)); got != want {
			t.Errorf("fieldsSummary(%s) = %q, want %q", raw, got, want)
		}
	}
}

// TestLogLineEscapesWorkloadText: red-team finding rt-gw 4. The workload
// named an executable with escape sequences and was denied a connection;
// the supervisor's audit event carries the name (and a supervisor writes
// the event, message and field names too). corral logs prints each as
// visible escapes, the entry on one line.
func TestLogLineEscapesWorkloadText(t *testing.T) {
	bin := "/tmp/\x1b]0;PWNED\x07\x1b[2J\x1b[31mEVIL\u009b2J\u202egnp"
	fields, err := json.Marshal(map[string]any{"event": "net.connect.denied", "binary": bin, "host": "x.test",
		"ancestors": []string{"/bin/dash", bin}, "k\x1b[8m": "v"})
	if err != nil {
		t.Fatal(err)
	}
	// encoding/json writes ESC as \u001b but leaves C1 and bidi controls as
	// they are, and a supervisor's fields need not be JSON at all.
	e := &gatewayv1.LogEntry{Time: timestamppb.Now(), Level: "warn\x1b[0m", Event: "net.connect.denied\x1b]52;c;cHduZWQK\x07",
		Message: "network connection denied\nFAKE line", Fields: fields}
	var b strings.Builder
	if err := (logPrinter{out: &b}).print(e); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, c := range []string{"\x1b", "\x07", "\u009b", "\u202e"} {
		if strings.Contains(out, c) {
			t.Errorf("corral logs prints %q from the workload: %q", c, out)
		}
	}
	if strings.Count(out, "\n") != 1 || !strings.HasSuffix(out, "\n") {
		t.Errorf("one entry printed as more than one line: %q", out)
	}
	for _, want := range []string{
		` WARN\x1b[0M net.connect.denied\x1b]52;c;cHduZWQK\a network connection denied\nFAKE line `,
		` binary=/tmp/\x1b]0;PWNED\a\x1b[2J\x1b[31mEVIL\u009b2J\u202egnp `,
		`"/tmp/\u001b]0;PWNED\u0007\u001b[2J\u001b[31mEVIL\u009b2J\u202egnp"]`,
		` k\x1b[8m=v`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("line lacks %q:\n%q", want, out)
		}
	}

	b.Reset()
	e.Fields = []byte("not json \x1b[2J")
	if err := (logPrinter{out: &b}).print(e); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(b.String(), ` not json \x1b[2J`+"\n") {
		t.Errorf("fields that are not JSON: %q", b.String())
	}
}

func TestParseSince(t *testing.T) {
	now := time.Date(2026, 1, 2, 15, 0, 0, 0, time.UTC)
	if got, err := parseSince("10m", now); err != nil || !got.Equal(now.Add(-10*time.Minute)) {
		t.Errorf("10m: %v %v", got, err)
	}
	if got, err := parseSince("2026-01-01T00:00:00Z", now); err != nil || got.Day() != 1 {
		t.Errorf("RFC 3339: %v %v", got, err)
	}
	for _, bad := range []string{"-5m", "yesterday", ""} {
		if _, err := parseSince(bad, now); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
