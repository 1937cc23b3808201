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
	"syscall"

	"github.com/corral-sandbox/corral/internal/carried"
)

var program = carried.Program{FS: embedded, Prefix: "corral-full-"}

// ErrNotCarried means this corral was built without its full program.
var ErrNotCarried = errors.New("this corral was built without its full program: build it after `go generate ./internal/fullbin`, or with `go build -tags corral_full`")

// Exec replaces this process with the full program, run with argv (argv[0]
// included), and returns only on failure.
func Exec(stateDir string, argv []string) error {
	path, err := program.Path(stateDir)
	if err != nil {
		return fmt.Errorf("full program: %w", err)
	}
	if path == "" {
		return ErrNotCarried
	}
	if err := syscall.Exec(path, argv, os.Environ()); err != nil {
		return fmt.Errorf("exec the full program %s: %w", path, err)
	}
	return nil
}
