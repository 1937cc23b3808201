package ca

import (
	"strconv"
	"testing"
)

// BenchmarkLeafCacheHit measures the per-handshake cost once a host's leaf is
// cached, under contention from parallel handshakes to the same host.
func BenchmarkLeafCacheHit(b *testing.B) {
	c := newCA(b, 0)
	if _, err := c.Leaf("api.example.com"); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.Leaf("api.example.com"); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkLeafMint measures the first handshake to a host: key generation
// and signing. The cache is large enough that eviction never happens.
func BenchmarkLeafMint(b *testing.B) {
	c := newCA(b, 1<<20)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := c.Leaf("h" + strconv.Itoa(i) + ".example.com"); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
