// Package fullbin carries corral's full program inside the lean one that
// users run. The lean corral leaves out what only some commands need and
// every start would pay to initialise (OPA, for --policy-rules; the gateway
// client's protobuf and Connect code); the full program is the same corral
// with them linked in (cmd/corral built with the corral_full tag). A
// command that needs it re-executes as the full program, which the first
// such command writes to the state directory.
package fullbin

//go:generate go generate ../sandbox/initbin
//go:generate go run ../carried/build -tags corral_full corral-full- ./cmd/corral

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"

	"github.com/corral-sandbox/corral/internal/carried"
)

var program = carried.Program{FS: embedded, Prefix: "corral-full-"}

// ErrNotCarried means this corral was built without its full program.
var ErrNotCarried = errors.New("this corral was built without its full program: build it after `go generate ./internal/fullbin`, or with `go build -tags corral_full`")

// envLean carries the lean corral's own path to the full program it
// execs, which runs from the state directory: "next to corral" (where
// corral gateway finds corral-gateway) means next to the corral the user
// ran.
const envLean = "CORRAL_LEAN_EXECUTABLE"

// leanExecutable is envLean as the full program found it; it is removed
// from the environment so that no workload inherits it.
var leanExecutable string

// Exec replaces this process with the full program, run with argv (argv[0]
// included), and returns only on failure.
func Exec(stateDir string, argv []string) error {
	path, err := Path(stateDir)
	if err != nil {
		return err
	}
	// Any value already there is replaced: the first of two would win.
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, envLean+"=") })
	if self, err := os.Executable(); err == nil {
		env = append(env, envLean+"="+self)
	}
	if err := syscall.Exec(path, argv, env); err != nil {
		return fmt.Errorf("exec the full program %s: %w", path, err)
	}
	return nil
}

// Executable is the path of the corral the user ran: the lean corral that
// started this full program, or this program itself.
func Executable() (string, error) {
	if leanExecutable != "" {
		return leanExecutable, nil
	}
	return os.Executable()
}
