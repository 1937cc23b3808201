// Package initproc is the code that runs inside the sandbox's namespaces:
// the init (PID 1), a re-exec of the corral binary entered from main before
// anything else runs. It builds the root, confines itself with what the
// workload inherits, forks the workload (no Go code runs between that fork
// and its exec) and reaps.
package initproc

//go:generate go tool msgp -file protocol.go -o protocol_msgp.go -tests=false -io=false -d "tag json" -d "ignore StepError"

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/plan"
	"github.com/corral-sandbox/corral/internal/trace"
)

// Hidden sub-commands that main dispatches before the CLI is parsed.
const (
	InitArg = "__corral_init"
)

// Message types exchanged over the supervisor↔init socket.
const (
	MsgConfig  = "config"  // supervisor → init
	MsgProceed = "proceed" // supervisor → init: its side is ready; start the workload
	MsgStarted = "started" // init → supervisor: the workload's execve succeeded; carries the seccomp listener, if any
	MsgError   = "error"   // a set-up step failed; the workload never ran
	MsgExited  = "exited"  // init → supervisor: the workload's wait status
	MsgSignal  = "signal"  // supervisor → init: signal the workload's process group (Signal)
	MsgPTY     = "pty"     // init → supervisor: carries the pty master fd
	MsgNetwork = "network" // init → supervisor: carries the egress listeners
)

// Config is what the init needs beyond the plan.
type Config struct {
	Plan plan.Plan `json:"plan"`
	Argv []string  `json:"argv"`
	Env  []string  `json:"env"`
	// Terminal marks the workload's fds 0–2 that are the slave of a pty
	// from the sandbox's devpts: those where the user has a terminal. With
	// any set, that pty is the workload's controlling terminal; the other
	// fds are the init's own, which the supervisor keeps as the user
	// redirected them.
	Terminal [3]bool `json:"terminal"`
	// RootDir is an empty host directory the init mounts the new root on
	// inside its private mount namespace.
	RootDir string `json:"root_dir"`
	// Seccomp is the filter for the plan's profile, assembled by the
	// supervisor (seccomp.Program): the init only loads it, so it links
	// no syscall tables.
	Seccomp []byte `json:"seccomp"`
	// SeccompListener asks for the filter's listener, which the init
	// hands to the supervisor with MsgStarted: the filter passes some
	// calls to it (seccomp.Notifies).
	SeccompListener bool `json:"seccomp_listener,omitempty"`
	// PidsMax says fd 4 is the sandbox cgroup's pids.max, which the init
	// writes Plan.Limits.Pids to just before it starts the workload: the
	// limit counts the init's own threads, and set sooner it could starve
	// the init of one, which a Go program does not survive.
	PidsMax bool `json:"pids_max,omitempty"`
	// NetworkReady says the init was cloned into a network namespace the
	// supervisor has already set up (loopback, and in proxy mode the
	// capture, whose listeners it holds): the init does neither.
	NetworkReady bool `json:"network_ready,omitempty"`
	// Trace, set when corral run --trace, puts each stage's start-up
	// steps on the supervisor's timeline.
	Trace *trace.Clock `json:"trace,omitempty"`
	// TimerSlack is the slack the workload is forked with: the one corral
	// was started with, where the init runs with a wider one (timerslack).
	// 0 leaves it the init's.
	TimerSlack uint64 `json:"timer_slack,omitempty"`
}

// Message is one message of the sync protocol: one SEQPACKET datagram
// holding it in MessagePack (protocol_msgp.go).
type Message struct {
	Type   string  `json:"type"`
	Config *Config `json:"config,omitempty"`
	// Step names the set-up step that failed, Error its cause.
	Step  string `json:"step,omitempty"`
	Error string `json:"error,omitempty"`
	// Code is the exit status corral should report: 125 for set-up failures,
	// 126/127 for a workload that cannot be executed or found, or the
	// workload's own exit code.
	Code   int `json:"code"`
	Signal int `json:"signal,omitempty"`
	PID    int `json:"pid,omitempty"`
}

// Send writes one message.
func Send(w io.Writer, m Message) error {
	b, err := m.MarshalMsg(nil)
	if err != nil {
		return fmt.Errorf("encode %s message: %w", m.Type, err)
	}
	_, err = w.Write(b)
	return err
}

// ErrUndecodable marks a message that arrived whole but did not decode.
var ErrUndecodable = errors.New("undecodable message")

// decode reads the one message b holds.
func decode(b []byte) (Message, error) {
	var m Message
	rest, err := m.UnmarshalMsg(b)
	if err == nil && len(rest) > 0 {
		err = fmt.Errorf("%d bytes after the %s message", len(rest), m.Type)
	}
	if err != nil {
		return Message{}, fmt.Errorf("%w: %w", ErrUndecodable, err)
	}
	return m, nil
}

// Recv reads one message of any size: the datagram's length is asked
// first (a peek with MSG_TRUNC returns it), since a read into a smaller
// buffer would silently cut it, and a buffer for the largest message
// allowed would cost every read its page faults. Descriptors sent with it
// are dropped; RecvFDs takes them. The end of the peer is io.EOF.
func Recv(sock *os.File) (Message, error) {
	raw, err := sock.SyscallConn()
	if err != nil {
		return Message{}, err
	}
	var n int
	var perr error
	if err := raw.Read(func(fd uintptr) bool {
		// A socket in blocking mode (the init's, or one whose Fd was
		// taken) cannot wait in the poller: only EAGAIN may send it there.
		for {
			n, _, perr = unix.Recvfrom(int(fd), nil, unix.MSG_PEEK|unix.MSG_TRUNC)
			if perr != unix.EINTR {
				return perr != unix.EAGAIN
			}
		}
	}); err != nil {
		return Message{}, err
	}
	if perr != nil {
		return Message{}, perr
	}
	if n == 0 {
		return Message{}, io.EOF
	}
	buf := make([]byte, n)
	if n, err = sock.Read(buf); err != nil {
		return Message{}, err
	}
	return decode(buf[:n])
}

// maxFDs bounds the descriptors one message may carry.
const maxFDs = 16

// SendFDs writes one message carrying file descriptors. The socket must be
// SOCK_SEQPACKET so the descriptors stay attached to this message.
func SendFDs(sock *os.File, m Message, fds ...int) error {
	b, err := m.MarshalMsg(nil)
	if err != nil {
		return fmt.Errorf("encode %s message: %w", m.Type, err)
	}
	return unix.Sendmsg(int(sock.Fd()), b, unix.UnixRights(fds...), nil, 0)
}

// RecvFDs reads one message and the descriptors it carries, if any.
func RecvFDs(sock *os.File) (Message, []*os.File, error) {
	var m Message
	// Messages with descriptors are a few hundred bytes; one too long
	// for this arrives cut and fails to decode, as it should.
	buf := make([]byte, 16<<10)
	oob := make([]byte, unix.CmsgSpace(4*maxFDs))
	n, oobn, _, _, err := unix.Recvmsg(int(sock.Fd()), buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return m, nil, err
	}
	if n == 0 {
		return m, nil, io.EOF
	}
	var files []*os.File
	cmsgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
	for i := range cmsgs {
		fds, err := unix.ParseUnixRights(&cmsgs[i])
		if err != nil {
			continue
		}
		for _, fd := range fds {
			files = append(files, os.NewFile(uintptr(fd), "received"))
		}
	}
	m, err = decode(buf[:n])
	if err != nil {
		for _, f := range files {
			f.Close()
		}
		return m, nil, err
	}
	return m, files, nil
}

// StepError is a failed set-up step with the exit code it maps to.
type StepError struct {
	Step string
	Code int
	Err  error
}

func (e *StepError) Error() string { return e.Step + ": " + e.Err.Error() }
func (e *StepError) Unwrap() error { return e.Err }

func stepErr(step string, err error) *StepError {
	return &StepError{Step: step, Code: 125, Err: err}
}
