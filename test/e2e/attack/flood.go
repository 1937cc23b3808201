package main

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Attacks on the audit log: a workload decides how many refusals it causes
// and how long the names and paths in them are. Before the audit log defended
// itself, ten seconds of these wrote hundreds of megabytes synchronously on
// the proxy's path.

func init() {
	attacks["flood-connect"] = cmdFloodConnect
	attacks["flood-http"] = cmdFloodHTTP
}

// floodWorkers run each flood concurrently, as a hostile workload would.
const floodWorkers = 4

// flood runs one attempt per call of try from floodWorkers goroutines until
// d has passed, and returns how many attempts were made.
func flood(d time.Duration, try func(i int64)) int64 {
	var n atomic.Int64
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for range floodWorkers {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				try(n.Add(1))
			}
		})
	}
	wg.Wait()
	return n.Load()
}

// cmdFloodConnect: flood-connect IP PORT NPORTS SECONDS opens connections to
// IP on PORT … PORT+NPORTS-1 in turn, each refused by the sandbox, for
// SECONDS. Varying the port makes every few connections a new audit key.
func cmdFloodConnect(args []string) int {
	need(args, 4, "flood-connect IP PORT NPORTS SECONDS")
	port, _ := strconv.Atoi(args[1])
	nports, _ := strconv.Atoi(args[2])
	secs, _ := strconv.Atoi(args[3])
	var open atomic.Int64
	n := flood(time.Duration(secs)*time.Second, func(i int64) {
		addr := net.JoinHostPort(args[0], strconv.Itoa(port+int(i)%max(nports, 1)))
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			return
		}
		// Wait for the verdict, so each attempt is one decision.
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			open.Add(1)
		}
		c.Close()
	})
	fmt.Printf("FLOOD connect attempts=%d answered=%d\n", n, open.Load())
	return 0
}

// cmdFloodHTTP: flood-http URL PATHLEN SECONDS sends GETs for URL followed by
// a fresh random path of PATHLEN bytes, over keep-alive connections, for
// SECONDS, and counts the answers by status.
func cmdFloodHTTP(args []string) int {
	need(args, 3, "flood-http URL PATHLEN SECONDS")
	plen, _ := strconv.Atoi(args[1])
	secs, _ := strconv.Atoi(args[2])
	client := &http.Client{
		Transport: &http.Transport{MaxIdleConnsPerHost: floodWorkers, Proxy: http.ProxyFromEnvironment},
		Timeout:   5 * time.Second,
	}
	var mu sync.Mutex
	status := map[int]int{}
	var firstErr error
	n := flood(time.Duration(secs)*time.Second, func(int64) {
		code := 0
		resp, err := client.Get(args[0] + "/" + randomPath(plen))
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			code = resp.StatusCode
		}
		mu.Lock()
		status[code]++
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // without the URL and its long path
		}
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
	})
	fmt.Printf("FLOOD http requests=%d status403=%d status200=%d failed=%d\n", n, status[403], status[200], status[0])
	if firstErr != nil {
		fmt.Printf("FLOOD http first error: %v\n", firstErr)
	}
	return 0
}

func randomPath(n int) string {
	const alpha = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, n)
	for i := range b {
		b[i] = alpha[rand.IntN(len(alpha))]
	}
	return string(b)
}
