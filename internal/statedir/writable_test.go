package statedir

import (
	"slices"
	"testing"
)

// The record keeps each directory once, in the order first given, and
// survives between runs.
func TestRecordWritable(t *testing.T) {
	state := t.TempDir()
	if got := WritableBefore(state); got != nil {
		t.Fatalf("fresh state: %v", got)
	}
	if err := RecordWritable(state, []string{"/home/ada/proj", "/home/ada/.cache"}); err != nil {
		t.Fatal(err)
	}
	if err := RecordWritable(state, []string{"/home/ada/proj", "/srv/w", "relative", "/bad\nline"}); err != nil {
		t.Fatal(err)
	}
	want := []string{"/home/ada/proj", "/home/ada/.cache", "/srv/w"}
	if got := WritableBefore(state); !slices.Equal(got, want) {
		t.Fatalf("recorded %q, want %q", got, want)
	}
}
