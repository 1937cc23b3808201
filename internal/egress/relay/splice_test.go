package relay

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// wrapped hides a connection's type, as the gate's wrappers do, so the
// relay has to copy.
type wrapped struct{ net.Conn }

func (w wrapped) CloseWrite() error { return w.Conn.(*net.TCPConn).CloseWrite() }

// paths runs f with the relay's ends as they come (spliced) and wrapped
// (copied): both must behave the same.
func paths(t *testing.T, f func(t *testing.T, wrap func(net.Conn) net.Conn)) {
	t.Run("splice", func(t *testing.T) { f(t, func(c net.Conn) net.Conn { return c }) })
	t.Run("copy", func(t *testing.T) { f(t, func(c net.Conn) net.Conn { return wrapped{c} }) })
}

func TestSocketsOnlyBareTCP(t *testing.T) {
	a, b := tcpPair(t)
	if _, _, ok := sockets(a, b); !ok {
		t.Fatal("two TCP connections should splice")
	}
	if _, _, ok := sockets(wrapped{a}, b); ok {
		t.Fatal("a wrapped destination must be copied")
	}
	if _, _, ok := sockets(a, wrapped{b}); ok {
		t.Fatal("a wrapped source must be copied")
	}
}

// TestRelayBulk moves more than a pipe holds each way at once and checks
// every byte and both counts.
func TestRelayBulk(t *testing.T) {
	paths(t, func(t *testing.T, wrap func(net.Conn) net.Conn) {
		for _, idle := range []time.Duration{0, 5 * time.Second} {
			client, a := tcpPair(t)
			b, server := tcpPair(t)
			const up, down = 5<<20 + 17, 9<<20 + 3
			type res struct {
				sum [32]byte
				err error
			}
			src := func(n int, seed uint64) []byte {
				p := make([]byte, n)
				r := rand.New(rand.NewPCG(seed, seed))
				for i := range p {
					p[i] = byte(r.Uint32())
				}
				return p
			}
			upData, downData := src(up, 1), src(down, 2)
			recv := func(c net.Conn, ch chan res) {
				h := sha256.New()
				_, err := io.Copy(h, c)
				var r res
				copy(r.sum[:], h.Sum(nil))
				r.err = err
				ch <- r
			}
			atServer, atClient := make(chan res, 1), make(chan res, 1)
			go recv(server, atServer)
			go recv(client, atClient)
			go func() {
				server.Write(downData)
				server.(*net.TCPConn).CloseWrite()
			}()
			go func() {
				client.Write(upData)
				client.(*net.TCPConn).CloseWrite()
			}()
			ab, ba, err := Relay(wrap(a), wrap(b), idle)
			if err != nil || ab != up || ba != down {
				t.Fatalf("idle=%v: relay %d %d %v, want %d %d", idle, ab, ba, err, up, down)
			}
			if r := <-atServer; r.err != nil || r.sum != sha256.Sum256(upData) {
				t.Fatalf("idle=%v: server got different bytes (%v)", idle, r.err)
			}
			if r := <-atClient; r.err != nil || r.sum != sha256.Sum256(downData) {
				t.Fatalf("idle=%v: client got different bytes (%v)", idle, r.err)
			}
		}
	})
}

// TestRelayIdleBothPaths: an idle tunnel ends with ErrIdle on either path
// and a tunnel that is only quiet one way does not.
func TestRelayIdleBothPaths(t *testing.T) {
	paths(t, func(t *testing.T, wrap func(net.Conn) net.Conn) {
		client, a := tcpPair(t)
		b, server := tcpPair(t)
		// Gaps well below the idle timeout, so a loaded machine's
		// stalls do not make the busy phase look idle.
		const writes, gap, idle = 10, 30 * time.Millisecond, 400 * time.Millisecond
		go func() {
			for range writes {
				if _, err := io.WriteString(server, "x"); err != nil {
					return
				}
				time.Sleep(gap)
			}
		}()
		start := time.Now()
		done := make(chan error, 1)
		go func() {
			_, _, err := Relay(wrap(a), wrap(b), idle)
			done <- err
		}()
		if _, err := io.ReadFull(client, make([]byte, writes)); err != nil {
			t.Fatalf("busy relay cut short: %v", err)
		}
		select {
		case err := <-done:
			if !errors.Is(err, ErrIdle) {
				t.Fatalf("err = %v, want ErrIdle", err)
			}
			if time.Since(start) < (writes-1)*gap+idle {
				t.Fatal("ended while still busy")
			}
		case <-time.After(5 * time.Second):
			t.Fatal("idle relay never ended")
		}
	})
}

// TestRelayWriteStall: a destination that stops reading ends the tunnel
// after the idle timeout, with the bytes it took counted.
func TestRelayWriteStall(t *testing.T) {
	paths(t, func(t *testing.T, wrap func(net.Conn) net.Conn) {
		client, a := tcpPair(t)
		b, _ := tcpPair(t) // the server never reads
		go func() {
			chunk := bytes.Repeat([]byte("y"), 64<<10)
			for {
				if _, err := client.Write(chunk); err != nil {
					return
				}
			}
		}()
		done := make(chan error, 1)
		var ab int64
		go func() {
			var err error
			ab, _, err = Relay(wrap(a), wrap(b), 200*time.Millisecond)
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, ErrIdle) {
				t.Fatalf("err = %v, want ErrIdle", err)
			}
			if ab == 0 {
				t.Fatal("no bytes counted before the stall")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("stalled relay never ended")
		}
	})
}

// TestSpliceHoldsNoPipes: a spliced tunnel holds a pipe only while bytes
// are in flight, so an idle one costs its two sockets and an ended one
// nothing.
func TestSpliceHoldsNoPipes(t *testing.T) {
	base := countFDs(t)
	madeBefore := pipesMade.Load()
	const tunnels = 20
	// One bulk transfer each way, so each direction has had a pipe.
	end := openTunnels(t, tunnels, func(client, server net.Conn) {
		bulk(t, client, server)
		bulk(t, server, client)
	})
	if made := pipesMade.Load() - madeBefore; made < 2*tunnels {
		t.Fatalf("%d pipes made for %d tunnels' bulk transfers, want one a direction at least", made, tunnels)
	}
	// Each tunnel holds four sockets here (both pairs are in this
	// process); the pipes go once the tunnels have been quiet a moment.
	want := base + tunnels*4 + 2
	for deadline := time.Now().Add(2 * time.Second); countFDs(t) > want && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if held := countFDs(t) - base; held > tunnels*4+2 {
		t.Errorf("%d idle tunnels hold %d descriptors, want at most %d", tunnels, held, tunnels*4+2)
	}
	end()
	if after := countFDs(t); after > base+2 {
		t.Errorf("descriptors: %d before, %d after the tunnels ended", base, after)
	}
}

// bulk writes 1 MiB to from and reads it whole at to.
func bulk(t *testing.T, from, to net.Conn) {
	t.Helper()
	data := make([]byte, 1<<20)
	go from.Write(data)
	if _, err := io.ReadFull(to, data); err != nil {
		t.Fatal(err)
	}
}

// TestSmallExchangesMakeNoPipe: request and response of a few hundred
// bytes each go through user space, where a read and a write cost less
// than a pipe; the first read that fills the buffer turns its direction to
// splice.
func TestSmallExchangesMakeNoPipe(t *testing.T) {
	end := openTunnels(t, 1, func(client, server net.Conn) {
		before := pipesMade.Load()
		req, resp := bytes.Repeat([]byte("q"), 300), bytes.Repeat([]byte("r"), 900)
		for range 50 {
			client.Write(req)
			if _, err := io.ReadFull(server, make([]byte, len(req))); err != nil {
				t.Fatal(err)
			}
			server.Write(resp)
			if _, err := io.ReadFull(client, make([]byte, len(resp))); err != nil {
				t.Fatal(err)
			}
		}
		if made := pipesMade.Load() - before; made != 0 {
			t.Fatalf("50 small exchanges made %d pipes, want none", made)
		}
		bulk(t, server, client)
		if pipesMade.Load() == before {
			t.Fatal("a 1 MiB download made no pipe: it was copied through user space")
		}
	})
	end()
}

func countFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd:", err)
	}
	return len(ents)
}

// BenchmarkRelay moves 256 MiB one way over loopback through the relay:
// spliced, copied, and with io.Copy's own ReadFrom splice for comparison.
// cpu_ms/GiB is the whole process's, sender and receiver included, which
// cost the same in every mode.
func BenchmarkRelay(b *testing.B) {
	const size = 256 << 20
	for _, mode := range []string{"splice", "copy", "readfrom"} {
		b.Run(mode, func(b *testing.B) {
			b.SetBytes(size)
			before := cpuTime(b)
			b.Cleanup(func() {
				if b.N > 0 {
					b.ReportMetric(float64((cpuTime(b)-before).Milliseconds())/(float64(b.N)*size/(1<<30)), "cpu_ms/GiB")
				}
			})
			for range b.N {
				client, a := tcpPair(b)
				up, server := tcpPair(b)
				go func() {
					buf := make([]byte, 256<<10)
					for sent := 0; sent < size; sent += len(buf) {
						server.Write(buf)
					}
					server.Close()
				}()
				go func() {
					switch mode {
					case "splice":
						Relay(a, up, 0)
					case "copy":
						Relay(wrapped{a}, wrapped{up}, 0)
					case "readfrom":
						io.Copy(a, up)
						a.Close()
						up.Close()
					}
				}()
				if n, _ := io.Copy(io.Discard, client); n != size {
					b.Fatalf("got %d bytes", n)
				}
			}
		})
	}
}

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestSpliceWithoutDescriptors: with no descriptor free for a pipe the
// tunnel still carries every byte, through user space.
func TestSpliceWithoutDescriptors(t *testing.T) {
	client, a := tcpPair(t)
	b, server := tcpPair(t)
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	// The lowest free descriptor becomes the limit, so no new one can be
	// made until the limit is restored.
	f, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	lowest := f.Fd()
	f.Close()
	tight := rl
	tight.Cur = uint64(lowest)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &tight); err != nil {
		t.Skip("cannot lower RLIMIT_NOFILE:", err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl)
		}
	}
	defer restore()
	if _, err := os.Open("/dev/null"); err == nil {
		restore()
		t.Fatal("the tight limit still lets a descriptor be made")
	}

	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16)
	go func() {
		client.Write(data)
		client.(*net.TCPConn).CloseWrite()
	}()
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(server)
		server.Write([]byte("done"))
		server.(*net.TCPConn).CloseWrite()
		got <- b
	}()
	ab, ba, err := Relay(a, b, 0)
	restore()
	if err != nil || ab != int64(len(data)) || ba != 4 {
		t.Fatalf("relay %d %d %v", ab, ba, err)
	}
	if !bytes.Equal(<-got, data) {
		t.Fatal("server got different bytes")
	}
	if reply, _ := io.ReadAll(client); string(reply) != "done" {
		t.Fatalf("client got %q", reply)
	}
}

// TestQuietTunnelsHoldNoBuffers: a direction waiting for bytes holds no
// copy buffer, as it holds no pipe, so a thousand open, quiet tunnels cost
// their sockets and goroutines, not 64 KiB each.
func TestQuietTunnelsHoldNoBuffers(t *testing.T) {
	const tunnels = 200
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse
	}
	before := heap()
	// One small exchange, so each direction has copied once.
	end := openTunnels(t, tunnels, func(client, server net.Conn) {
		io.WriteString(client, "ping")
		if _, err := io.ReadFull(server, make([]byte, 4)); err != nil {
			t.Fatal(err)
		}
		io.WriteString(server, "pong")
		if _, err := io.ReadFull(client, make([]byte, 4)); err != nil {
			t.Fatal(err)
		}
	})
	// Held buffers would be 2×32 KiB a tunnel, 12.5 MiB in all; sockets
	// and goroutines' bookkeeping come to a small part of that.
	if grown := int64(heap()) - int64(before); grown > tunnels*16<<10 {
		t.Errorf("%d quiet tunnels grew the heap by %d KiB, want under %d KiB: buffers held while waiting", tunnels, grown>>10, tunnels*16)
	}
	end()
}

// openTunnels relays n client-server pairs, runs exchange on each, and
// returns a func that closes both ends of every tunnel and waits for its
// relay to end.
func openTunnels(t *testing.T, n int, exchange func(client, server net.Conn)) (end func()) {
	t.Helper()
	var ends []net.Conn
	done := make(chan error, n)
	for range n {
		client, a := tcpPair(t)
		b, server := tcpPair(t)
		ends = append(ends, client, server)
		go func() {
			_, _, err := Relay(a, b, 0)
			done <- err
		}()
		exchange(client, server)
	}
	return func() {
		for _, c := range ends {
			c.Close()
		}
		for range n {
			<-done
		}
	}
}
