package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// clock is a fake time source the tests move by hand.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// syncBuf is a bytes.Buffer the writer goroutine and the test share.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func parse(t *testing.T, text string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("audit line %q: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}

func named(evs []map[string]any, name string) []map[string]any {
	var out []map[string]any
	for _, e := range evs {
		if e[FieldEvent] == name {
			out = append(out, e)
		}
	}
	return out
}

// suppressed sums the counts audit.suppressed reports for event.
func suppressed(evs []map[string]any, event string) int {
	n := 0
	for _, e := range named(evs, AuditSuppressed) {
		if e[FieldSuppressedEvent] == event {
			n += int(e[FieldCount].(float64))
		}
	}
	return n
}

func testLogger(w *syncBuf, async bool, tune func(*config)) (*Logger, *clock) {
	c := defaults()
	clk := newClock()
	c.now = clk.now
	if tune != nil {
		tune(&c)
	}
	return (&Logger{s: newSink(JSONLines(w, nil), c, async)}).For("sb1", "sess"), clk
}

func denied(l *Logger, host string, port int, path string) {
	l.emit(HTTPRequest, "via", "transparent", "host", host, "port", port, "method", "GET", "path", path,
		"decision", "deny", "rule", "", "reason", "l7_no_matching_rule", "status", 403)
}

func TestTruncate(t *testing.T) {
	var buf syncBuf
	l, _ := testLogger(&buf, false, nil)
	long := "/" + strings.Repeat("a", 60<<10)
	l.emit(HTTPRequest, "path", long, "short", "ok", "err", errors.New(strings.Repeat("e", 2000)),
		"paths", []string{long, "x"}, "many", make([]string, 100), "n", 7)
	l.emit(SandboxExit, "detail", strings.Repeat("é", 1000)) // 2000 bytes, 2-byte runes
	l.Close()
	evs := parse(t, buf.String())
	if len(evs) != 2 {
		t.Fatalf("want 2 events, got %d:\n%s", len(evs), buf.String())
	}
	e := evs[0]
	want := long[:1024] + fmt.Sprintf("…[truncated %d bytes]", len(long)-1024)
	if e["path"] != want {
		t.Errorf("path is %d bytes ending %q, want the first 1024 bytes and the marker", len(e["path"].(string)), tail(e["path"]))
	}
	if e["short"] != "ok" || e["n"] != float64(7) || e[FieldSandboxID] != "sb1" {
		t.Errorf("short fields changed: %v %v %v", e["short"], e["n"], e[FieldSandboxID])
	}
	if s := e["err"].(string); !strings.HasSuffix(s, "…[truncated 976 bytes]") {
		t.Errorf("error field not truncated: %q", tail(s))
	}
	if p := e["paths"].([]any); len(p) != 2 || p[0] != want || p[1] != "x" {
		t.Errorf("list elements not truncated: %d elements", len(p))
	}
	if m := e["many"].([]any); len(m) != 65 || m[64] != "…[truncated 36 items]" {
		t.Errorf("a 100-element list kept %d elements, last %v", len(m), m[len(m)-1])
	}
	d := evs[1]["detail"].(string)
	if !strings.HasPrefix(d, strings.Repeat("é", 512)+"…[truncated 976 bytes]") {
		t.Errorf("multi-byte value cut inside a rune: %q", tail(d))
	}
}

func tail(v any) string {
	s := fmt.Sprint(v)
	return s[max(0, len(s)-40):]
}

// A flood of refusals that differ only in the path (what an attacker
// varies) is one key: 20 logged, the rest counted, and the counts come
// back as audit.suppressed without the path.
func TestRateLimitPerKey(t *testing.T) {
	var buf syncBuf
	l, clk := testLogger(&buf, false, nil)
	for i := range 100 {
		denied(l, "api.test", 443, fmt.Sprintf("/x/%d", i))
	}
	clk.add(1100 * time.Millisecond) // 5 tokens back, and a report is due
	for i := range 10 {
		denied(l, "api.test", 443, fmt.Sprintf("/y/%d", i))
	}
	l.Close()
	evs := parse(t, buf.String())
	if n := len(named(evs, HTTPRequest)); n != 25 {
		t.Errorf("logged %d requests, want 20 (burst) + 5 (one second at 5/s)", n)
	}
	reps := named(evs, AuditSuppressed)
	if len(reps) != 2 {
		t.Fatalf("want 2 audit.suppressed (after a second, at close), got %d:\n%s", len(reps), buf.String())
	}
	r := reps[0]
	if r[FieldCount] != float64(80) || r["host"] != "api.test" || r["method"] != "GET" || r["reason"] != "l7_no_matching_rule" ||
		r[FieldSuppressedEvent] != HTTPRequest || r[FieldScope] != "key" || r[FieldSandboxID] != "sb1" {
		t.Errorf("first report: %v", r)
	}
	if _, ok := r["path"]; ok {
		t.Errorf("the report carries the path, which is not part of the key: %v", r)
	}
	if r[FieldWindowStart] == r[FieldWindowEnd] || r[FieldWindowStart] == nil {
		t.Errorf("report window %v..%v", r[FieldWindowStart], r[FieldWindowEnd])
	}
	if reps[1][FieldCount] != float64(5) {
		t.Errorf("the report at close counts %v, want 5", reps[1][FieldCount])
	}
	if got := len(named(evs, HTTPRequest)) + suppressed(evs, HTTPRequest); got != 110 {
		t.Errorf("logged + suppressed = %d, want the 110 emitted", got)
	}
	// Different keys have their own buckets.
	buf = syncBuf{}
	l, _ = testLogger(&buf, false, nil)
	for range 30 {
		denied(l, "a.test", 443, "/")
		denied(l, "b.test", 443, "/")
	}
	l.Close()
	evs = parse(t, buf.String())
	if n := len(named(evs, HTTPRequest)); n != 40 {
		t.Errorf("two keys logged %d events, want 20 each", n)
	}
}

// Varying a key field (the port) makes new keys, but the event's own
// budget still bounds what is written, and every event is accounted for.
func TestRateLimitEventBudget(t *testing.T) {
	var buf syncBuf
	l, _ := testLogger(&buf, false, func(c *config) { c.maxKeys = 16 })
	const n = 5000
	for i := range n {
		l.emit(NetConnectDenied, "via", "transparent", "host", "", "ip", "203.0.113.9", "port", 1000+i%1000,
			"binary", "/usr/bin/curl", "reason", "no_matching_policy", "pid", i)
	}
	l.Close()
	evs := parse(t, buf.String())
	logged := len(named(evs, NetConnectDenied))
	if logged != 200 {
		t.Errorf("logged %d, want the event budget's burst of 200", logged)
	}
	if got := logged + suppressed(evs, NetConnectDenied); got != n {
		t.Errorf("logged %d + suppressed %d != %d emitted", logged, suppressed(evs, NetConnectDenied), n)
	}
	if reps := named(evs, AuditSuppressed); len(reps) > 16+1 {
		t.Errorf("%d audit.suppressed events for 16 keys and one event budget", len(reps))
	}
	if l.s.lim.lru.Len() > 16 || len(l.s.lim.keys) > 16 {
		t.Errorf("the limiter holds %d keys, cap 16", len(l.s.lim.keys))
	}
}

// At most maxReports keys are reported one by one per flush; the rest go
// into the event's count, which says how many keys it folds in.
func TestSuppressedReportsBounded(t *testing.T) {
	var buf syncBuf
	l, _ := testLogger(&buf, false, func(c *config) {
		c.maxReports = 3
		c.refusalKey = rate{burst: 1, perSec: 0.001}
		c.refusalEvent = rate{burst: 1e6, perSec: 1e6}
	})
	for range 2 {
		for p := range 10 {
			l.emit(NetConnectDenied, "ip", "203.0.113.9", "port", p, "reason", "no_matching_policy")
		}
	}
	l.Close()
	evs := parse(t, buf.String())
	var keyReps, folded int
	for _, r := range named(evs, AuditSuppressed) {
		if r[FieldScope] == "key" {
			keyReps++
		} else {
			folded = int(r[FieldKeys].(float64))
		}
	}
	if keyReps != 3 || folded != 7 || suppressed(evs, NetConnectDenied) != 10 {
		t.Errorf("reports: %d per key, %d folded, %d counted; want 3, 7, 10\n%s", keyReps, folded, suppressed(evs, NetConnectDenied), buf.String())
	}
}

func TestDNSKeyedByZone(t *testing.T) {
	var buf syncBuf
	l, _ := testLogger(&buf, false, nil)
	for i := range 100 {
		l.emit(NetDNSDenied, "name", fmt.Sprintf("x%d.Exfil.test.", i), "reason", "no_matching_policy")
	}
	l.Close()
	evs := parse(t, buf.String())
	reps := named(evs, AuditSuppressed)
	if len(named(evs, NetDNSDenied)) != 20 || len(reps) != 1 || reps[0][fieldZone] != "exfil.test" {
		t.Errorf("random subdomains are not one key:\n%s", buf.String())
	}
}

func TestLifecycleNeverSuppressed(t *testing.T) {
	var buf syncBuf
	l, _ := testLogger(&buf, false, nil)
	for _, ev := range []string{SandboxExit, PolicyReloaded, SandboxSetupError} {
		for range 500 {
			l.emit(ev, "code", 1)
		}
	}
	l.Close()
	evs := parse(t, buf.String())
	if len(evs) != 1500 || len(named(evs, AuditSuppressed)) != 0 {
		t.Errorf("want 1500 lifecycle events and no suppression, got %d events", len(evs))
	}
}

// gate is a writer that blocks until opened: a stuck disk.
type gate struct {
	open chan struct{}
	syncBuf
}

func (g *gate) Write(p []byte) (int, error) {
	<-g.open
	return g.syncBuf.Write(p)
}

// Emit returns at once while the writer is stuck; what did not fit in the
// queue is counted in audit.dropped once the writer catches up. Lifecycle
// events wait for room instead of being dropped.
func TestNonBlocking(t *testing.T) {
	g := &gate{open: make(chan struct{})}
	c := defaults()
	c.queue = 8
	c.allowedKey = rate{burst: 1e9, perSec: 1e9}
	c.allowedEvent = c.allowedKey
	l := &Logger{s: newSink(JSONLines(g, nil), c, true)}
	const n = 1000
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range n {
			l.emit(NetConnectAllowed, "ip", "203.0.113.9", "port", i)
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Emit blocked on a stuck writer")
	}
	exited := make(chan struct{})
	go func() {
		l.emit(SandboxExit, "code", 0)
		close(exited)
	}()
	time.Sleep(50 * time.Millisecond)
	close(g.open)
	<-exited
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	evs := parse(t, g.String())
	logged := len(named(evs, NetConnectAllowed))
	drops := named(evs, AuditDropped)
	if len(drops) != 1 {
		t.Fatalf("want one audit.dropped, got %d:\n%s", len(drops), g.String())
	}
	if d := int(drops[0][FieldCount].(float64)); logged+d != n || d == 0 {
		t.Errorf("logged %d + dropped %d != %d emitted", logged, d, n)
	}
	if len(named(evs, SandboxExit)) != 1 {
		t.Error("sandbox.exit was lost behind a full queue")
	}
}

// failing is a disk that refuses every write.
type failing struct{}

func (failing) Write([]byte) (int, error) { return 0, errors.New("no space left on device") }

func TestWriteErrorsDoNotCrash(t *testing.T) {
	l := &Logger{s: newSink(JSONLines(failing{}, nil), defaults(), true)}
	for range 100 {
		l.emit(SandboxExit, "code", 0)
		denied(l, "a.test", 80, "/")
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestCloseFlushes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "d", "audit.log")
	root, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	l := root.For("sb", "")
	for i := range 100 {
		denied(l, "a.test", 80, fmt.Sprint(i))
	}
	l.emit(SandboxExit, "code", 0)
	if err := root.Close(); err != nil {
		t.Fatal(err)
	}
	l.emit(SandboxExit, "code", 1) // after Close: ignored, no panic
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	evs := parse(t, string(b))
	if len(named(evs, HTTPRequest)) != 20 || suppressed(evs, HTTPRequest) != 80 || len(named(evs, SandboxExit)) != 1 {
		t.Errorf("after Close the file has %d requests, %d suppressed, %d exits; want 20, 80, 1:\n%s",
			len(named(evs, HTTPRequest)), suppressed(evs, HTTPRequest), len(named(evs, SandboxExit)), b)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Errorf("audit log mode %v, want 0600", st.Mode().Perm())
	}
}

func TestRotation(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	const max = 8192
	l, err := Open(path, WithMaxFileBytes(max), WithKeep(2))
	if err != nil {
		t.Fatal(err)
	}
	const n = 500
	for i := range n {
		l.emit(SandboxStaleSwept, "stale_sandbox_id", fmt.Sprintf("%05d", i), "pad", strings.Repeat("p", 100))
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	names, _ := filepath.Glob(path + "*")
	if len(names) != 3 {
		t.Fatalf("files %v, want audit.log, .1 and .2", names)
	}
	var last []map[string]any
	for _, name := range []string{path + ".2", path + ".1", path} {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > max {
			t.Errorf("%s is %d bytes, cap %d", name, len(b), max)
		}
		last = append(last, parse(t, string(b))...)
	}
	// The newest events survive, in order, up to the last one.
	for i, e := range last {
		if want := fmt.Sprintf("%05d", n-len(last)+i); e["stale_sandbox_id"] != want {
			t.Fatalf("event %d of the kept files is %v, want %s", i, e["stale_sandbox_id"], want)
		}
	}
	// Reopening continues the file and keeps the cap.
	l, err = Open(path, WithMaxFileBytes(max), WithKeep(2))
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		l.emit(SandboxExit, "code", 0, "pad", strings.Repeat("p", 100))
	}
	l.Close()
	if names, _ := filepath.Glob(path + "*"); len(names) != 3 {
		t.Errorf("after a reopen: files %v", names)
	}
	if _, err := Open(path, WithMaxFileBytes(10)); err == nil {
		t.Error("a 10-byte cap was accepted")
	}
}

// Another run sharing the file rotated it: this one reopens rather than
// rotating again, so the other's fresh file is not pushed out.
func TestRotationShared(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	r, err := openRotator(path, 4096, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	line := []byte(strings.Repeat("a", 1000) + "\n")
	for range 4 {
		r.Write(line)
	}
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(path, []byte("other\n"), 0o600)
	if _, err := r.Write(line); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if !bytes.HasPrefix(b, []byte("other\n")) || len(b) != 6+len(line) {
		t.Errorf("the other run's file was not continued: %d bytes", len(b))
	}
	if _, err := os.Stat(path + ".2"); err == nil {
		t.Error("rotated again over the other run's rotation")
	}
}

func BenchmarkEmit(b *testing.B) {
	l, err := Open(filepath.Join(b.TempDir(), "audit.log"))
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	l = l.For("sb", "s")
	path := "/" + strings.Repeat("a", 4096)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i++
			l.emit(HTTPRequest, "host", "api.test", "port", 443, "method", "GET", "path", path, "decision", "allow", "status", i)
		}
	})
}

// recordSink keeps the event names it is given; with err set it refuses
// them all, and with hold set it blocks until hold closes.
type recordSink struct {
	mu    sync.Mutex
	names []string
	err   error
	hold  chan struct{}
}

func (r *recordSink) Write(rec slog.Record) error {
	if r.hold != nil {
		<-r.hold
	}
	if r.err != nil {
		return r.err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.names = append(r.names, rec.Message)
	return nil
}

func (r *recordSink) Close() error { return nil }

func (r *recordSink) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.names...)
}

// TestFanOutFeedsEverySink: every sink of a fan-out gets each event, one
// that fails keeps nothing from the others, and a stuck one costs counted
// events, never the caller's time.
func TestFanOutFeedsEverySink(t *testing.T) {
	a, b, broken := &recordSink{}, &recordSink{}, &recordSink{err: errors.New("collector down")}
	l, err := NewSink(FanOut(a, broken, b))
	if err != nil {
		t.Fatal(err)
	}
	l.Log(SandboxExitEvent{Code: 0})
	l.Log(PolicyReloadedEvent{Version: 2})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*recordSink{a, b} {
		if got := s.got(); len(got) != 2 || got[0] != SandboxExit || got[1] != PolicyReloaded {
			t.Errorf("a sink of the fan-out got %q", got)
		}
	}

	stuck := &recordSink{hold: make(chan struct{})}
	l, err = NewSink(FanOut(stuck), WithQueueLen(4))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for i := range 100 {
		l.Log(NetConnectEvent{Outcome: OutcomeDenied, Host: "h.test", Port: uint16(i), Reason: "no_matching_policy"})
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("logging to a stuck sink took %v", took)
	}
	close(stuck.hold)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if got := stuck.got(); !slices.Contains(got, AuditDropped) && !slices.Contains(got, AuditSuppressed) {
		t.Errorf("events lost to a stuck sink were not counted: %q", got)
	}
}

// TestStuckSinkDoesNotHangExit: a sink that never returns costs events,
// not the sandbox's exit.
func TestStuckSinkDoesNotHangExit(t *testing.T) {
	stuck := &recordSink{hold: make(chan struct{})}
	defer close(stuck.hold)
	l, err := NewSink(stuck, WithQueueLen(1))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for range 3 {
		l.Log(SandboxExitEvent{Code: 0})
	}
	_ = l.Close()
	if took := time.Since(start); took > 3*lifecycleWait+closeWait+time.Second {
		t.Fatalf("logging and closing with a stuck sink took %v", took)
	}
}
