// Package initproc is the code that runs inside the sandbox's namespaces:
// the init (PID 1), which builds the root and reaps, and the exec stage,
// which drops every privilege and becomes the workload. Both are re-execs of
// the corral binary entered from main before anything else runs, so no Go
// code ever runs between a fork and an exec.
package initproc

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/corral-sandbox/corral/internal/plan"
)

// Hidden sub-commands that main dispatches before the CLI is parsed.
const (
	InitArg = "__corral_init"
	ExecArg = "__corral_exec"
)

// Message types exchanged over the supervisor↔init and init↔exec sockets.
const (
	MsgConfig  = "config"  // supervisor → init, init → exec stage
	MsgStarted = "started" // init → supervisor: the workload's execve succeeded
	MsgError   = "error"   // a set-up step failed; the workload never ran
	MsgExited  = "exited"  // init → supervisor: the workload's wait status
)

// Config is what the init needs beyond the plan.
type Config struct {
	Plan plan.Plan `json:"plan"`
	Argv []string  `json:"argv"`
	Env  []string  `json:"env"`
	// TTY means stdin is a pseudo-terminal the workload must own as its
	// controlling terminal.
	TTY bool `json:"tty"`
	// RootDir is an empty host directory the init mounts the new root on
	// inside its private mount namespace.
	RootDir string `json:"root_dir"`
}

// Message is one line of the sync protocol.
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
	b, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode %s message: %w", m.Type, err)
	}
	_, err = w.Write(append(b, '\n'))
	return err
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
