package control

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// When the test binary runs with this variable set it is a control client
// dialing the socket the variable names.
const clientEnv = "CORRAL_CONTROL_TEST_CLIENT"

func TestMain(m *testing.M) {
	if path := os.Getenv(clientEnv); path != "" {
		c, err := net.Dial("unix", path)
		if err != nil {
			os.Exit(2)
		}
		_, _ = c.Write([]byte(`{"op":"status"}` + "\n"))
		_, _ = io.Copy(io.Discard, c)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

type fakeHandler struct{}

func (fakeHandler) Status() Status                     { return Status{ID: "x"} }
func (fakeHandler) SetPolicy(_ []byte, _ string) error { return errors.New("no") }

// peerFrom serves a control socket and returns the Peer it saw when the
// test binary dialed it as a child with attr.
func peerFrom(t *testing.T, attr *syscall.SysProcAttr) Peer {
	t.Helper()
	path := filepath.Join(t.TempDir(), "control.sock")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		mu   sync.Mutex
		seen []Peer
	)
	allow := func(p Peer) error {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, p)
		return nil
	}
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = Serve(ctx, l, fakeHandler{}, allow, slog.New(slog.DiscardHandler)) }()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), clientEnv+"="+path)
	cmd.SysProcAttr = attr
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("client: %v\n%s", err, out)
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		if n > 0 {
			return seen[0]
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the server never saw the client")
	return Peer{}
}

func TestPeerPIDNamespace(t *testing.T) {
	own, err := OwnPIDNamespace()
	if err != nil {
		t.Fatal(err)
	}
	if p := peerFrom(t, nil); p.PIDNamespace != own || p.UID != os.Getuid() {
		t.Errorf("a client beside the server: got %+v, want pid namespace %+v and uid %d", p, own, os.Getuid())
	}
	// A fresh user namespace lets an unprivileged test make the pid
	// namespace a sandbox would have.
	attr := &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWPID,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
	}
	p := peerFrom(t, attr)
	if p.PIDNamespace == own || p.PIDNamespace == (Namespace{}) {
		t.Errorf("a client in its own pid namespace was seen in %+v (the server's is %+v)", p.PIDNamespace, own)
	}
	if p.UID != os.Getuid() {
		t.Errorf("the client's uid is %d, want %d", p.UID, os.Getuid())
	}
}
