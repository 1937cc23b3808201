package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
)

// ErrProcessExited is what an Identifier's error wraps when the process
// that opened a connection was gone (exited, or had closed the socket)
// before it could be identified. The connection is still refused, since
// nothing can vouch for it, but with its own reason: it is a race with a
// short-lived client, not an unknown binary.
var ErrProcessExited = errors.New("the process that opened the connection closed it or exited before it could be identified")

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

// IntegrityError is what an Identifier's error wraps when a file the
// process runs (its executable, a script on its command line) is not the
// one first seen at its path in this sandbox. The identifier reports the
// fact; the gate refuses the connection with ReasonIntegrity.
type IntegrityError struct {
	Path string
	// Want is the hex SHA-256 first seen at Path; Got is the one now.
	Want, Got string
}

func (e *IntegrityError) Error() string {
	return fmt.Sprintf("%s changed since first use in this sandbox (sha256 %s, now %s)", e.Path, short(e.Want), short(e.Got))
}

// short is enough of a hash for a person to tell two apart.
func short(sum string) string {
	if len(sum) > 16 {
		return sum[:16]
	}
	return sum
}
