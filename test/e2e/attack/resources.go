package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Attacks on resources the sandbox's limits must cover: kernel memory the
// workload makes the kernel hold for it (socket buffers), and descriptors
// and memory of the supervisor, which lives outside the sandbox's cgroup.
func init() {
	attacks["sockbuf"] = cmdSockbuf
	attacks["conns"] = cmdConns
	attacks["tmpfs-fill"] = cmdTmpfsFill
}

// raiseNofile lifts the soft descriptor limit to the hard one, as any
// program that wants many sockets does.
func raiseNofile() uint64 {
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) == nil {
		rl.Cur = rl.Max
		_ = unix.Setrlimit(unix.RLIMIT_NOFILE, &rl)
	}
	return rl.Cur
}

// cmdSockbuf makes the kernel hold data for the workload in socket buffers
// nobody reads: pairs of connected sockets (loopback TCP or a unix
// socketpair) whose sender writes until the kernel refuses more. The bytes
// written and never read are memory the sandbox holds; more than the
// memory limit is an escape from it.
func cmdSockbuf(args []string) int {
	need(args, 3, "sockbuf tcp|unix TARGET_MIB LIMIT_MIB")
	kind := args[0]
	target, _ := strconv.ParseInt(args[1], 10, 64)
	limit, _ := strconv.ParseInt(args[2], 10, 64)
	target <<= 20
	limit <<= 20
	nofile := raiseNofile()

	var ln net.Listener
	if kind == "tcp" {
		var err error
		if ln, err = net.Listen("tcp4", "127.0.0.1:0"); err != nil {
			return blocked("listen on loopback: %s", errno(err))
		}
		defer ln.Close()
	}
	chunk := make([]byte, 1<<20)
	var held int64
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	// A limit that refuses each socket's buffers but lets every new
	// socket keep a little adds up over thousands of sockets, so stalling
	// stops the attack only after many pairs in a row gained nothing.
	maxStalled := 64
	if v, err := strconv.Atoi(os.Getenv("SOCKBUF_STALLED")); err == nil {
		maxStalled = v
	}
	stalled, pairs := 0, 0
	var stop error
	for held < target && stalled < maxStalled {
		w, r, err := socketPair(kind, ln)
		if err != nil {
			stop = err
			break
		}
		fds = append(fds, w, r)
		pairs++
		var n int64
		for {
			m, err := unix.Write(w, chunk)
			if m > 0 {
				n += int64(m)
			}
			if err != nil || m <= 0 {
				break
			}
		}
		held += n
		if n == 0 {
			stalled++
		} else {
			stalled = 0
		}
	}
	fmt.Printf("held %d MiB in %d %s socket pairs (nofile %d, stopped by %v, %d stalled pairs)\n",
		held>>20, pairs, kind, nofile, stop, stalled)
	if os.Getenv("SOCKBUF_HOLD") != "" {
		// Let the test read the kernel's own account while it is held.
		fmt.Println("HOLDING")
		bufio.NewReader(os.Stdin).ReadString('\n')
	}
	if held > limit {
		return escaped("held %d MiB in unread socket buffers under a %d MiB memory limit", held>>20, limit>>20)
	}
	return blocked("held only %d MiB in socket buffers under a %d MiB memory limit", held>>20, limit>>20)
}

// socketPair returns a non-blocking writer and the reader of one
// connection, as raw descriptors so no runtime poller reads for us.
func socketPair(kind string, ln net.Listener) (int, int, error) {
	if kind == "unix" {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return -1, -1, err
		}
		return fds[0], fds[1], nil
	}
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		return -1, -1, err
	}
	s, err := ln.Accept()
	if err != nil {
		c.Close()
		return -1, -1, err
	}
	w, err := rawDup(c)
	if err != nil {
		return -1, -1, err
	}
	r, err := rawDup(s)
	if err != nil {
		unix.Close(w)
		return -1, -1, err
	}
	return w, r, nil
}

// rawDup takes the descriptor out of a net.Conn, closing the Conn.
func rawDup(c net.Conn) (int, error) {
	defer c.Close()
	f, err := c.(*net.TCPConn).File()
	if err != nil {
		return -1, err
	}
	defer f.Close()
	fd, err := unix.Dup(int(f.Fd()))
	if err != nil {
		return -1, err
	}
	return fd, unix.SetNonblock(fd, true)
}

// cmdConns opens N connections to HOST:PORT (an echo service), each
// echoing one line, and holds them. Still holding them it reports whether
// a name resolves and what the explicit proxies answer to one more
// connection; then it waits for the file $W/go, closes them all and
// reports whether a fresh connection works. It is not an attack by
// itself; the test judges what the supervisor did.
func cmdConns(args []string) int {
	need(args, 3, "conns HOST:PORT[,HOST:PORT...] N NAME-TO-RESOLVE")
	targets := strings.Split(args[0], ",")
	n, _ := strconv.Atoi(args[1])
	nofile := raiseNofile()
	// A few dialers at once, so thousands of connections open in seconds,
	// well inside the echo servers' idle timeout.
	var mu sync.Mutex
	var conns []net.Conn
	ok, refused := 0, 0
	var firstErr error
	start := time.Now()
	next := make(chan int)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				c, err := echo(targets[i%len(targets)], i)
				mu.Lock()
				if err != nil {
					refused++
					if firstErr == nil {
						firstErr = err
					}
				} else {
					ok++
					conns = append(conns, c)
				}
				mu.Unlock()
			}
		}()
	}
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	fmt.Printf("CONNS ok=%d refused=%d nofile=%d in %v first_error=%v\n", ok, refused, nofile, time.Since(start).Round(time.Millisecond), firstErr)
	addrs, err := net.LookupHost(args[2])
	fmt.Printf("DNS %s -> %v err=%v\n", args[2], addrs, err)
	if proxy := os.Getenv("HTTP_PROXY_ADDR"); proxy != "" {
		fmt.Printf("PROXY %s\n", connectVia(proxy, targets[0]))
	}
	if proxy := os.Getenv("SOCKS_PROXY_ADDR"); proxy != "" {
		fmt.Printf("SOCKS %s\n", socksVia(proxy, targets[0]))
	}
	fmt.Println("HOLDING")
	for end := time.Now().Add(60 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(os.Getenv("W") + "/go"); err == nil {
			break
		}
	}
	for _, c := range conns {
		c.Close()
	}
	time.Sleep(300 * time.Millisecond)
	c, err := echo(targets[0], -1)
	fmt.Printf("FRESH err=%v\n", err)
	if c != nil {
		c.Close()
	}
	return 0
}

// connectVia asks the HTTP proxy for a tunnel and returns its status line
// and body on one line.
func connectVia(proxy, target string) string {
	c, err := net.DialTimeout("tcp", proxy, 5*time.Second)
	if err != nil {
		return "dial: " + errno(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	b, err := io.ReadAll(io.LimitReader(c, 4096))
	if len(b) == 0 {
		return "read: " + errno(err)
	}
	return strings.ReplaceAll(strings.ReplaceAll(string(b), "\r", ""), "\n", " ")
}

// socksVia asks the SOCKS5 proxy for a connection and returns the reply
// code.
func socksVia(proxy, target string) string {
	host, port, _ := net.SplitHostPort(target)
	p, _ := strconv.Atoi(port)
	c, err := net.DialTimeout("tcp", proxy, 5*time.Second)
	if err != nil {
		return "dial: " + errno(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	req := append([]byte{5, 1, 0, 5, 1, 0, 3, byte(len(host))}, host...)
	req = append(req, byte(p>>8), byte(p))
	c.Write(req)
	var rep [12]byte
	n, err := io.ReadFull(c, rep[:])
	if n < 4 {
		return fmt.Sprintf("read %d bytes: %s", n, errno(err))
	}
	return fmt.Sprintf("method=%d rep=%d", rep[1], rep[3])
}

func echo(addr string, i int) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	want := fmt.Sprintf("conn %d\n", i)
	if _, err := c.Write([]byte(want)); err != nil {
		c.Close()
		return nil, err
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err == nil && got != want {
		err = fmt.Errorf("echo answered %q", got)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

// cmdTmpfsFill writes to a file in DIR until the filesystem refuses, and
// reports how much it took. Without a size on the tmpfs the kernel's
// default is half of the host's RAM, outside any limit when no cgroup
// charges it.
func cmdTmpfsFill(args []string) int {
	need(args, 2, "tmpfs-fill DIR LIMIT_MIB")
	limit, _ := strconv.ParseInt(args[1], 10, 64)
	f, err := os.CreateTemp(args[0], "fill")
	if err != nil {
		return blocked("create in %s: %s", args[0], errno(err))
	}
	defer os.Remove(f.Name())
	defer f.Close()
	chunk := make([]byte, 1<<20)
	var n int64
	for n <= limit<<20 {
		m, err := f.Write(chunk)
		n += int64(m)
		if err != nil {
			if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EFBIG) {
				return blocked("wrote %d MiB to %s, then %s", n>>20, args[0], errno(err))
			}
			return blocked("write after %d MiB: %s", n>>20, errno(err))
		}
	}
	return escaped("wrote %d MiB to %s, more than the %d MiB memory limit", n>>20, args[0], limit)
}
