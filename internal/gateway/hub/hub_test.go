package hub

import (
	"slices"
	"testing"
)

func TestPublishFiltersAndCutsOffLaggards(t *testing.T) {
	h := New[int]()
	even := h.Subscribe(10, func(v int) bool { return v%2 == 0 })
	slow := h.Subscribe(1, nil)
	for i := range 4 {
		h.Publish(i)
	}
	even.Close()
	var got []int
	for v := range even.C {
		got = append(got, v)
	}
	if !slices.Equal(got, []int{0, 2}) || even.Lagged() {
		t.Fatalf("even subscriber got %v lagged=%v", got, even.Lagged())
	}
	// The slow one took 0, then was cut off at 1 instead of blocking.
	if v, ok := <-slow.C; !ok || v != 0 {
		t.Fatalf("slow first = %v, %v", v, ok)
	}
	if _, ok := <-slow.C; ok || !slow.Lagged() {
		t.Fatalf("slow subscriber not cut off: lagged=%v", slow.Lagged())
	}
	slow.Close() // after the cut-off: no double close
	if h.Len() != 0 {
		t.Fatalf("%d subscribers left", h.Len())
	}
}

func TestTailKeepsNewest(t *testing.T) {
	tl := NewTail[int](3)
	tl.Add("a", 1, 2)
	tl.Add("a", 3, 4, 5)
	tl.Add("b", 9)
	if got := tl.Get("a"); !slices.Equal(got, []int{3, 4, 5}) {
		t.Fatalf("tail a = %v", got)
	}
	tl.Drop("b")
	if got := tl.Get("b"); len(got) != 0 {
		t.Fatalf("dropped tail = %v", got)
	}
}
