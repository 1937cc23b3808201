package ca

import (
	"io"
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

// BenchmarkTrustStore is the Java trust store of every proxy-mode start
// with this host's roots: "made" decodes them (a first start, or new
// roots), "kept" starts from the store an earlier start kept.
func BenchmarkTrustStore(b *testing.B) {
	_, roots, err := SystemBundle()
	if err != nil || len(roots) == 0 {
		b.Skipf("no system CA bundle (%v)", err)
	}
	own := pemOf(b, "own")
	b.Run("made", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := TrustStore(io.Discard, "changeit", b.TempDir(), roots, own); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("kept", func(b *testing.B) {
		dir := b.TempDir()
		if err := TrustStore(io.Discard, "changeit", dir, roots, own); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if err := TrustStore(io.Discard, "changeit", dir, roots, own); err != nil {
				b.Fatal(err)
			}
		}
	})
}
