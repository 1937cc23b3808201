package trace

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
)

func TestNilTracerIsOff(t *testing.T) {
	var tr *Tracer
	tr.Step("x")
	tr.StepAt("y", Now())
	if c := tr.Child(); c != nil {
		t.Fatalf("a nil tracer handed out a clock: %+v", c)
	}
	if Resume(&bytes.Buffer{}, nil) != nil {
		t.Fatal("Resume without a clock must leave tracing off")
	}
}

// A child stage's lines continue the parent's timeline: its first step is
// measured from when the parent started it, its offsets from the origin.
func TestChildSharesTimeline(t *testing.T) {
	var parent, child bytes.Buffer
	tr := &Tracer{w: &parent, origin: 1_000_000, last: 1_000_000}
	tr.StepAt("first", 3_500_000)
	c := tr.Child()
	if c.Origin != 1_000_000 || c.Since < 3_500_000 {
		t.Fatalf("clock %+v", c)
	}
	c.Since = 5_000_000 // pin it for the figures below
	ct := Resume(&child, c)
	ct.StepAt("child: started", 7_250_000)
	ct.StepAt("child: next", 7_350_000)
	want := []string{
		"trace      2.5ms     +2.5ms  first",
		"trace      6.2ms     +2.2ms  child: started",
		"trace      6.3ms     +0.1ms  child: next",
	}
	got := strings.Split(strings.TrimSpace(parent.String()+child.String()), "\n")
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestStepUsesMonotonicNow(t *testing.T) {
	var b bytes.Buffer
	tr := New(&b)
	tr.Step("a")
	if !regexp.MustCompile(`^trace +[0-9.]+ms +\+[0-9.]+ms  a\n$`).MatchString(b.String()) {
		t.Fatalf("line %q", b.String())
	}
}

// A fork's steps are on the parent's timeline but count their durations
// among themselves, and leave the parent's own durations alone.
func TestForkKeepsItsOwnDurations(t *testing.T) {
	var b bytes.Buffer
	tr := &Tracer{w: &b, origin: 1_000_000, last: 1_000_000}
	f := tr.Fork()
	if f.origin != tr.origin || f.last < 1_000_000 || f.w != tr.w {
		t.Fatalf("fork %+v of %+v", f, tr)
	}
	f.last = 2_000_000 // pin it for the figures below
	f.StepAt("fork: one", 4_000_000)
	tr.StepAt("parent", 3_000_000)
	f.StepAt("fork: two", 4_500_000)
	want := "trace      3.0ms     +2.0ms  fork: one\n" +
		"trace      2.0ms     +2.0ms  parent\n" +
		"trace      3.5ms     +0.5ms  fork: two\n"
	if b.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", b.String(), want)
	}
	if (*Tracer)(nil).Fork() != nil {
		t.Fatal("a nil tracer's fork must be nil (tracing off)")
	}
}
