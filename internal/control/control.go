// Package control is the per-sandbox control socket: a Unix socket (0600)
// in the sandbox's run directory through which `corral policy set` swaps the
// network policy of a running sandbox and `corral ps` reads its status. One
// JSON request and one JSON response per connection.
package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/corral-sandbox/corral/internal/statedir"
)

// Operations.
const (
	OpStatus    = "status"
	OpSetPolicy = "set_policy"
)

// maxRequest bounds a request; a policy is at most a few hundred KiB.
const maxRequest = 4 << 20

// Request is one command.
type Request struct {
	Op string `json:"op"`
	// Policy is the YAML of the new policy for OpSetPolicy.
	Policy string `json:"policy,omitempty"`
	// Source names where the policy came from, for the audit trail.
	Source string `json:"source,omitempty"`
}

// Status describes a running sandbox.
type Status struct {
	ID            string    `json:"id"`
	Session       string    `json:"session"`
	PID           int       `json:"pid"`
	InitPID       int       `json:"init_pid"`
	Argv          []string  `json:"argv"`
	Workdir       string    `json:"workdir"`
	PolicySHA256  string    `json:"policy_sha256"`
	PolicyVersion int       `json:"policy_version"`
	NetworkMode   string    `json:"network_mode"`
	Started       time.Time `json:"started"`
}

// Response answers a Request.
type Response struct {
	OK     bool    `json:"ok"`
	Error  string  `json:"error,omitempty"`
	Status *Status `json:"status,omitempty"`
}

// Handler is what the supervisor implements.
type Handler interface {
	Status() Status
	// SetPolicy validates and applies a new policy, or returns why not;
	// on error the running policy is unchanged.
	SetPolicy(yaml []byte, source string) error
}

// Serve listens on path until ctx is done. allow vets each client before
// its request is read; a refused client gets an error response.
func Serve(ctx context.Context, path string, h Handler, allow func(Peer) error, log *slog.Logger) error {
	_ = os.Remove(path)
	// The run directory is 0700, so nobody else can reach the socket even
	// in the moment before the chmod below.
	l, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("listen on control socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return fmt.Errorf("restrict control socket: %w", err)
	}
	go func() {
		<-ctx.Done()
		l.Close()
	}()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go handle(c, h, allow, log)
		}
	}()
	return nil
}

func handle(c net.Conn, h Handler, allow func(Peer) error, log *slog.Logger) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	peer, err := peerOf(c)
	if err == nil {
		err = allow(peer)
	}
	if err != nil {
		log.Warn("control connection refused", "err", err)
		_ = json.NewEncoder(c).Encode(Response{Error: "refused: " + err.Error()})
		return
	}
	var req Request
	if err := json.NewDecoder(io.LimitReader(c, maxRequest)).Decode(&req); err != nil {
		_ = json.NewEncoder(c).Encode(Response{Error: "bad request: " + err.Error()})
		return
	}
	var resp Response
	switch req.Op {
	case OpStatus:
		st := h.Status()
		resp = Response{OK: true, Status: &st}
	case OpSetPolicy:
		if err := h.SetPolicy([]byte(req.Policy), req.Source); err != nil {
			resp = Response{Error: err.Error()}
		} else {
			st := h.Status()
			resp = Response{OK: true, Status: &st}
		}
	default:
		resp = Response{Error: fmt.Sprintf("unknown operation %q", req.Op)}
	}
	if err := json.NewEncoder(c).Encode(resp); err != nil {
		log.Debug("control response", "err", err)
	}
}

// Call sends one request to the sandbox's control socket.
func Call(ctx context.Context, stateDir, id string, req Request) (Response, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", statedir.Control(stateDir, id))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return Response{}, fmt.Errorf("no running sandbox %q under %s (see corral ps)", id, stateDir)
		}
		return Response{}, fmt.Errorf("connect to sandbox %s: %w", id, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if err := json.NewEncoder(c).Encode(req); err != nil {
		return Response{}, err
	}
	var resp Response
	if err := json.NewDecoder(c).Decode(&resp); err != nil {
		return Response{}, fmt.Errorf("read response from sandbox %s: %w", id, err)
	}
	return resp, nil
}
