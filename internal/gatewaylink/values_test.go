package gatewaylink

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestSecretsAndRoutesHandedOver: the first update's secret values and
// routes come with the start policy, later ones reach the handlers, and
// no value is ever written under the state directory.
func TestSecretsAndRoutesHandedOver(t *testing.T) {
	const first, second = "ghp_firstVALUE0123456789", "ghp_secondVALUE012345678"
	g := newFakeGateway(netPolicy("one.example"))
	g.secrets = map[string]string{"gh-token": first}
	g.routes = []string{"routes: []\n"}
	s := startServer(t, g)
	state := t.TempDir()
	l, pol, err := Start(context.Background(), testConfig(t, s, writeToken(t, testSandboxToken), state))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Finish(0, nil)
	if string(pol.Secrets["gh-token"]) != first || len(pol.Secrets) != 1 {
		t.Fatalf("start secrets = %q", pol.Secrets)
	}
	if pol.Routes == nil || pol.Routes.Version != 1 {
		t.Fatalf("start routes = %+v", pol.Routes)
	}

	var mu sync.Mutex
	var values []string
	var routes []int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Serve(ctx, Handlers{
			Policy:  func(int64, []byte) error { return nil },
			Secrets: func(v map[string][]byte) { mu.Lock(); values = append(values, string(v["gh-token"])); mu.Unlock() },
			Routes:  func(v int64, _ []byte) error { mu.Lock(); routes = append(routes, v); mu.Unlock(); return nil },
		})
	}()
	// Finish, not only cancel: the stream Start opened lives on the
	// link's own context.
	defer func() { l.Finish(0, nil); cancel(); <-done }()

	g.change(func() { g.secrets["gh-token"] = second; g.secretsGen++ })
	g.change(func() { g.routes = append(g.routes, "routes: []\nenv: false\n") })
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		ok := len(values) > 0 && values[len(values)-1] == second && len(routes) > 0 && routes[len(routes)-1] == 2
		got, gotRoutes := append([]string(nil), values...), append([]int64(nil), routes...)
		mu.Unlock()
		if ok {
			// Version 1 came with the start and is not handed over again.
			if gotRoutes[0] != 2 {
				t.Errorf("routes handed over: %v, want only version 2", gotRoutes)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("handlers got secrets %q, routes %v", got, gotRoutes)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The start policy was cached (the link reports it loaded): the
	// cache, and anything else under the state directory, holds no value.
	g.waitFor(t, "policy v1 reported", func() bool { return len(g.statuses) > 0 })
	found := 0
	err = filepath.WalkDir(state, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		found++
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, v := range []string{first, second} {
			// JSON writes bytes as base64.
			for _, form := range []string{v, base64.StdEncoding.EncodeToString([]byte(v)), hex.EncodeToString([]byte(v))} {
				if bytes.Contains(data, []byte(form)) {
					t.Errorf("%s holds a secret value", path)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found == 0 {
		t.Fatal("no state file written: the check above proved nothing")
	}
}
