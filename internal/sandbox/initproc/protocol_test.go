package initproc

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"reflect"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fill sets every field v reaches to a value other than its zero, each
// number a different one, so a field the codec drops or confuses with
// another shows up in a comparison.
func fill(v reflect.Value, n *int) {
	*n++
	switch v.Kind() {
	case reflect.String:
		v.SetString("s" + string(rune('a'+*n%26)) + string(rune('A'+*n/26%26)))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(*n))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(*n))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(float64(*n) + 0.5)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), n)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		fill(v.Index(0), n)
		fill(v.Index(1), n)
	case reflect.Array:
		for i := range v.Len() {
			fill(v.Index(i), n)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), n)
			}
		}
	default:
		panic("fill: no value for " + v.Type().String())
	}
}

// The codec is generated from the types: a field added to the plan or the
// config without `go generate` would silently not reach the init.
func TestEveryFieldReachesTheInit(t *testing.T) {
	var sent Message
	n := 0
	fill(reflect.ValueOf(&sent).Elem(), &n)
	var buf bytes.Buffer
	if err := Send(&buf, sent); err != nil {
		t.Fatal(err)
	}
	got, err := decode(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, sent) {
		t.Fatalf("a field did not survive the trip (run go generate ./internal/...):\nsent %+v\ngot  %+v", sent, got)
	}
}

func TestDecodeRefusesWhatIsNotOneMessage(t *testing.T) {
	b, err := (&Message{Type: MsgExited, Code: 3}).MarshalMsg(nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, in := range map[string][]byte{
		"cut":        b[:len(b)-1],
		"extra":      append(append([]byte(nil), b...), 0xc0),
		"not msgp":   []byte(`{"type":"exited"}` + "\n"),
		"wrong type": {0x92, 0x01, 0x02},
	} {
		if _, err := decode(in); !errors.Is(err, ErrUndecodable) {
			t.Errorf("%s: err %v, want ErrUndecodable", name, err)
		}
	}
}

// Recv takes a message of any size whole, and reports the peer's end.
func TestRecvSizesItsBuffer(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	a, b := os.NewFile(uintptr(fds[0]), "a"), os.NewFile(uintptr(fds[1]), "b")
	defer b.Close()
	long := Message{Type: MsgError, Step: "build root filesystem", Error: string(bytes.Repeat([]byte("x"), 100<<10)), Code: 125}
	for _, m := range []Message{long, {Type: MsgExited, Code: 7}} {
		if err := Send(a, m); err != nil {
			t.Fatal(err)
		}
	}
	a.Close()
	for _, want := range []Message{long, {Type: MsgExited, Code: 7}} {
		got, err := Recv(b)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("Recv: %v, %q/%d (%d bytes of error); want %q/%d (%d bytes)", err, got.Type, got.Code, len(got.Error), want.Type, want.Code, len(want.Error))
		}
	}
	if _, err := Recv(b); err != io.EOF {
		t.Fatalf("after the peer closed: %v, want io.EOF", err)
	}
}

// The init program run as root leaves the network set-up out: given a
// sandbox whose network it would have to make, it refuses before anything
// else instead of starting the workload with no network made. The test
// binary plays that init (InitMain(nil)) in a child process.
func TestInitWithoutNetworkRefusesToMakeIt(t *testing.T) {
	if os.Getenv("CORRAL_TEST_INIT_NO_NETWORK") != "" {
		os.Exit(InitMain(nil))
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	sup, child := os.NewFile(uintptr(fds[0]), "sup"), os.NewFile(uintptr(fds[1]), "init")
	defer sup.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestInitWithoutNetworkRefusesToMakeIt$")
	cmd.Env = append(os.Environ(), "CORRAL_TEST_INIT_NO_NETWORK=1")
	cmd.ExtraFiles = []*os.File{child}
	// Should the refusal go, the init would go on to mount and name the
	// host: namespaces of its own keep that off this machine.
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
	}
	if err := cmd.Start(); err != nil {
		if os.Getenv("CORRAL_NO_SKIP") != "" {
			t.Fatalf("no user namespace for the init to run in (%v); CORRAL_NO_SKIP is set", err)
		}
		t.Skipf("no user namespace for the init to run in: %v", err)
	}
	child.Close()
	cfg := &Config{Argv: []string{"true"}}
	cfg.Plan.Namespaces = []string{"mount", "pid", "net"}
	if err := Send(sup, Message{Type: MsgConfig, Config: cfg}); err != nil {
		t.Fatal(err)
	}
	m, err := Recv(sup)
	werr := cmd.Wait()
	if err != nil || m.Type != MsgError || m.Step != "set up the network" || m.Code != 125 {
		t.Fatalf("the init answered %+v (%v); want a refusal at \"set up the network\"", m, err)
	}
	if ee, ok := werr.(*exec.ExitError); !ok || ee.ExitCode() != 125 {
		t.Fatalf("the init exited with %v, want 125", werr)
	}
	if !MakesNetwork(&cfg.Plan, false) || MakesNetwork(&cfg.Plan, true) {
		t.Error("MakesNetwork does not follow the network namespace and NetworkReady")
	}
}

// On a socket in non-blocking mode Recv waits in the poller for a message
// still to come.
func TestRecvWaitsOnNonBlockingSocket(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	a, b := os.NewFile(uintptr(fds[0]), "a"), os.NewFile(uintptr(fds[1]), "b")
	defer a.Close()
	defer b.Close()
	go func() {
		time.Sleep(50 * time.Millisecond)
		_ = Send(a, Message{Type: MsgSignal, Signal: 15})
	}()
	m, err := Recv(b)
	if err != nil || m.Type != MsgSignal || m.Signal != 15 {
		t.Fatalf("Recv = %+v, %v; want the signal message", m, err)
	}
}

// The init passes on only the signals of its list, whatever a message asks:
// not SIGKILL or SIGSTOP (the supervisor kills the init itself), not a
// number out of range, not a signal riding on another message.
func TestInitForwardsOnlyItsSignals(t *testing.T) {
	for _, sig := range forwarded {
		if got, ok := forwardable(Message{Type: MsgSignal, Signal: int(sig)}); !ok || got != sig {
			t.Errorf("%v is not forwarded", sig)
		}
	}
	for _, m := range []Message{
		{Type: MsgSignal, Signal: int(unix.SIGKILL)},
		{Type: MsgSignal, Signal: int(unix.SIGSTOP)},
		{Type: MsgSignal, Signal: int(unix.SIGSYS)},
		{Type: MsgSignal, Signal: 0},
		{Type: MsgSignal, Signal: -1},
		{Type: MsgSignal, Signal: 65},
		{Type: MsgExited, Signal: int(unix.SIGTERM)},
		{Type: MsgSignal},
	} {
		if _, ok := forwardable(m); ok {
			t.Errorf("%+v is forwarded", m)
		}
	}
}
