package egress

import (
	"context"
	"errors"
	"net"
	"syscall"
)

// ErrProcessExited is what an Identifier's error wraps when the process
// that opened a connection was gone (exited, or had closed the socket)
// before it could be identified. The connection is still refused, since
// nothing can vouch for it, but with its own reason: it is a race with a
// short-lived client, not an unknown binary.
var ErrProcessExited = errors.New("the process that opened the connection exited before it could be identified")

// UpstreamFailure reports whether reason says that the policy allowed a
// connection but its destination could not be reached: the remedy is on
// the network, not in the policy.
func UpstreamFailure(reason string) bool {
	switch reason {
	case ReasonResolve, ReasonUpstream, ReasonUpstreamTimeout:
		return true
	}
	return false
}

// UpstreamReason returns ReasonUpstreamTimeout when err (from resolving or
// dialling an allowed destination) is a timeout, else otherwise.
func UpstreamReason(err error, otherwise string) string {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, syscall.ETIMEDOUT) || (errors.As(err, &ne) && ne.Timeout()) {
		return ReasonUpstreamTimeout
	}
	return otherwise
}

// identityReason is the refusal reason for an Identifier's error. An
// ESRCH from a pidfd means the process it names has exited.
func identityReason(err error) string {
	if errors.Is(err, ErrProcessExited) || errors.Is(err, syscall.ESRCH) {
		return ReasonIdentityExited
	}
	return ReasonIdentity
}
