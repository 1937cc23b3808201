package sandbox

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"testing"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/plan"
)

// Running ends the CLI's paused collection; a run that never called it
// would collect nothing until the heap reached the set-up backstop.
func TestRunningCalledUncaged(t *testing.T) {
	var buf bytes.Buffer
	calls := 0
	code, err := Run(context.Background(), Options{
		ID: "sb", Argv: []string{"true"}, Plan: &plan.Plan{Workdir: t.TempDir()},
		UncagedReason: "test", Audit: audit.New(&buf).For("sb", "default"), Log: slog.New(slog.DiscardHandler),
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		Running: func() { calls++ },
	})
	if err != nil || code != 0 {
		t.Fatalf("Run = %d, %v", code, err)
	}
	if calls != 1 {
		t.Errorf("Running called %d times, want 1", calls)
	}
}
