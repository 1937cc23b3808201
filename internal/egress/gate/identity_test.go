package gate

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/corral-sandbox/corral/internal/egress"
)

func TestIdentityRefusal(t *testing.T) {
	changed := &egress.IntegrityError{Path: "/usr/bin/python3", Want: "aa", Got: "bb"}
	for _, tc := range []struct {
		err    error
		want   string
		detail string
	}{
		{fmt.Errorf("no process holds the socket: %w", egress.ErrProcessExited), egress.ReasonIdentityExited, ""},
		{fmt.Errorf("pidfd_open: %w", syscall.ESRCH), egress.ReasonIdentityExited, ""},
		{errors.New("pid 7 does not descend from the sandbox init"), egress.ReasonIdentity, ""},
		// The detail is the file's account alone, as the audit events
		// have always shown it, not the identifier's wrapping.
		{fmt.Errorf("procident: client 10.0.0.2:4000: %w", changed), egress.ReasonIntegrity, changed.Error()},
	} {
		d := identityRefusal(tc.err)
		if d.Allow || d.Reason != tc.want {
			t.Errorf("identityRefusal(%v) = %+v, want a %s refusal", tc.err, d, tc.want)
		}
		if tc.detail != "" && d.Detail != tc.detail {
			t.Errorf("identityRefusal(%v).Detail = %q, want %q", tc.err, d.Detail, tc.detail)
		}
	}
}
