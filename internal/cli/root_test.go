package cli

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// TestErrorPrintedEscaped: the error a command ends with is printed through
// termsafe, as it may quote a sandbox's or a gateway's answer; here the
// name of a file that does not exist stands in for one.
func TestErrorPrintedEscaped(t *testing.T) {
	var out, errOut bytes.Buffer
	p := filepath.Join(t.TempDir(), "p\x1b]52;c;eA==\x07.yaml")
	if code := execute(context.Background(), []string{"policy", "check", p}, strings.NewReader(""), &out, &errOut); code == 0 {
		t.Fatalf("policy check of a missing file succeeded: %s", out.String())
	}
	if s := errOut.String(); strings.ContainsAny(s, "\x1b\x07") || !strings.Contains(s, `p\x1b]52;c;eA==\a.yaml`) {
		t.Errorf("stderr %q, want the file name escaped", s)
	}
}
