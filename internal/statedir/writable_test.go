package statedir

import (
	"fmt"
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

// Past maxWritable directories the record keeps the newest.
func TestRecordWritableBounded(t *testing.T) {
	state := t.TempDir()
	var dirs []string
	for i := range maxWritable + 10 {
		dirs = append(dirs, fmt.Sprintf("/w/%d", i))
	}
	if err := RecordWritable(state, dirs[:maxWritable]); err != nil {
		t.Fatal(err)
	}
	if err := RecordWritable(state, dirs[maxWritable:]); err != nil {
		t.Fatal(err)
	}
	got := WritableBefore(state)
	if len(got) != maxWritable || got[0] != dirs[10] || got[len(got)-1] != dirs[len(dirs)-1] {
		t.Fatalf("kept %d, from %s to %s; want the newest %d", len(got), got[0], got[len(got)-1], maxWritable)
	}
}
