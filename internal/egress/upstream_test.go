package egress

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
)

func TestFailureReasons(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("dial: %w", context.DeadlineExceeded), ReasonUpstreamTimeout},
		{fmt.Errorf("connect: %w", syscall.ETIMEDOUT), ReasonUpstreamTimeout},
		{fmt.Errorf("connect: %w", syscall.ECONNREFUSED), ReasonUpstream},
		{errors.New("no such host"), ReasonUpstream},
	} {
		if got := UpstreamReason(tc.err, ReasonUpstream); got != tc.want {
			t.Errorf("UpstreamReason(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
}
