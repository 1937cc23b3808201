// Package control is the per-sandbox control socket: a Unix socket (0600)
// in the sandbox's run directory through which `corral policy set` swaps the
// network policy of a running sandbox and `corral ps` reads its status. One
// JSON request and one JSON response per connection.
//
// The protocol is versioned by the "v" field of both messages; this package
// speaks Version. A request without "v" comes from a corral built before the
// field existed, whose requests are exactly version 1, so it is served as
// version 1. A request naming any other version is answered with an error
// that names both versions, and nothing is done: a newer client may mean
// something by fields this sandbox does not know. Requests are decoded
// strictly (an unknown field is an error) for the same reason. Likewise a
// response without "v" comes from a sandbox started by such an older corral
// and reads as version 1, and Call refuses a response of a newer version.
package control

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/corral-sandbox/corral/internal/statedir"
)

// Version is the control protocol version this package speaks.
const Version = 1

// Operations.
const (
	OpStatus    = "status"
	OpSetPolicy = "set_policy"
)

// Operations on the policy advisor's drafts (corral draft), answered by a
// Handler that is also a DraftHandler. Their results are in
// Response.Draft.
const (
	OpDraftList    = "draft.list"
	OpDraftShow    = "draft.show"
	OpDraftApprove = "draft.approve"
	OpDraftReject  = "draft.reject"
	OpDraftUndo    = "draft.undo"
	OpDraftHistory = "draft.history"
	OpDraftRetry   = "draft.retry"
	OpDraftRefine  = "draft.refine"
	// OpDraftWatch answers once the drafts change or DraftArgs.WaitMS
	// passes, with the list: a client polls it to follow new chunks.
	OpDraftWatch = "draft.watch"
)

// MaxWatch bounds a draft.watch, inside the connection's deadline.
const MaxWatch = 20 * time.Second

// DraftArgs are the arguments of the draft operations.
type DraftArgs struct {
	IDs            []string `json:"ids,omitempty"`
	All            bool     `json:"all,omitempty"`
	IncludeFlagged bool     `json:"include_flagged,omitempty"`
	Reason         string   `json:"reason,omitempty"`
	Guidance       string   `json:"guidance,omitempty"`
	Host           string   `json:"host,omitempty"`
	Port           uint16   `json:"port,omitempty"`
	WaitMS         int64    `json:"wait_ms,omitempty"`
}

// DraftHandler is what a supervisor with a policy advisor implements. by
// is the client, from the kernel's credentials. The result is encoded as
// Response.Draft.
type DraftHandler interface {
	Draft(ctx context.Context, op string, args DraftArgs, by Peer) (any, error)
}

// maxRequest bounds a request; a policy is at most a few hundred KiB.
const maxRequest = 4 << 20

// connDeadline bounds a whole exchange, so a client that connects and
// says nothing does not hold a goroutine of the supervisor.
const connDeadline = 30 * time.Second

// Request is one command.
type Request struct {
	// V is the protocol version; Call fills it in.
	V  int    `json:"v,omitempty"`
	Op string `json:"op"`
	// Policy is the YAML of the new policy for OpSetPolicy.
	Policy string `json:"policy,omitempty"`
	// Source names where the policy came from, for the audit trail.
	Source string `json:"source,omitempty"`
	// Draft holds the arguments of the draft.* operations.
	Draft *DraftArgs `json:"draft,omitempty"`
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
	V      int     `json:"v"`
	OK     bool    `json:"ok"`
	Error  string  `json:"error,omitempty"`
	Status *Status `json:"status,omitempty"`
	// Draft is the result of a draft.* operation.
	Draft json.RawMessage `json:"draft,omitempty"`
}

// Handler is what the supervisor implements.
type Handler interface {
	Status() Status
	// SetPolicy validates and applies a new policy, or returns why not;
	// on error the running policy is unchanged.
	SetPolicy(yaml []byte, source string) error
}

// Listen creates the control socket at path, readable and writable by its
// owner only, replacing a stale one left by a crashed sandbox.
func Listen(path string) (net.Listener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale control socket: %w", err)
	}
	// The run directory is 0700, so nobody else can reach the socket even
	// in the moment before the chmod below.
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on control socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("restrict control socket: %w", err)
	}
	return l, nil
}

// Serve answers requests on l until ctx is done, then closes l and returns
// nil once the requests in progress are answered. allow vets each client
// before its request is read; a refused client gets an error response.
// Connections must be Unix socket connections: the client's credentials
// come from the kernel.
func Serve(ctx context.Context, l net.Listener, h Handler, allow func(Peer) error, log *slog.Logger) error {
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	backoff := 5 * time.Millisecond
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("control socket closed: %w", err)
			}
			// Out of descriptors, most likely: the socket stays up and is
			// retried, as losing it would lose ps and policy set for the
			// sandbox's whole life.
			log.Warn("accept control connection", "err", err)
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
				return nil
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		wg.Add(1)
		go func() {
			defer wg.Done()
			handle(c, h, allow, log)
		}()
	}
}

func handle(c net.Conn, h Handler, allow func(Peer) error, log *slog.Logger) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(connDeadline))
	peer, err := peerOf(c)
	if err == nil {
		err = allow(peer)
	}
	var resp Response
	if err != nil {
		log.Warn("control connection refused", "err", err)
		resp = fail("refused: " + err.Error())
	} else {
		resp = answer(c, h, peer)
	}
	if err := json.NewEncoder(c).Encode(resp); err != nil {
		log.Debug("control response", "err", err)
	}
}

func fail(msg string) Response { return Response{V: Version, Error: msg} }

// answer reads one request from r and carries it out.
func answer(r io.Reader, h Handler, peer Peer) Response {
	req, err := readRequest(r)
	if err != nil {
		return fail(err.Error())
	}
	if strings.HasPrefix(req.Op, "draft.") {
		return answerDraft(req, h, peer)
	}
	switch req.Op {
	case OpStatus:
	case OpSetPolicy:
		if err := h.SetPolicy([]byte(req.Policy), req.Source); err != nil {
			return fail(err.Error())
		}
	default:
		return fail(fmt.Sprintf("unknown operation %q", req.Op))
	}
	st := h.Status()
	return Response{V: Version, OK: true, Status: &st}
}

func answerDraft(req Request, h Handler, peer Peer) Response {
	dh, ok := h.(DraftHandler)
	if !ok {
		return fail("this sandbox has no policy advisor (it runs without proxy networking)")
	}
	var args DraftArgs
	if req.Draft != nil {
		args = *req.Draft
	}
	// Inside the connection's deadline, with room to answer.
	ctx, cancel := context.WithTimeout(context.Background(), connDeadline-5*time.Second)
	defer cancel()
	out, err := dh.Draft(ctx, req.Op, args, peer)
	if err != nil {
		return fail(err.Error())
	}
	js, err := json.Marshal(out)
	if err != nil {
		return fail(fmt.Sprintf("encode %s result: %v", req.Op, err))
	}
	return Response{V: Version, OK: true, Draft: js}
}

var errTooLarge = fmt.Errorf("request larger than %d bytes", maxRequest)

// readRequest decodes one request. The version is checked before the rest
// of the request is interpreted, so a client speaking another version is
// told so rather than what its fields mean here.
func readRequest(r io.Reader) (Request, error) {
	var raw json.RawMessage
	if err := json.NewDecoder(&capReader{r: r, n: maxRequest}).Decode(&raw); err != nil {
		return Request{}, fmt.Errorf("bad request: %w", err)
	}
	var v struct {
		V *int `json:"v"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return Request{}, fmt.Errorf("bad request: %w", err)
	}
	if v.V != nil && *v.V != Version {
		return Request{}, fmt.Errorf("control protocol version %d is not supported: this sandbox speaks version %d (its corral is older or newer than the client's)", *v.V, Version)
	}
	var req Request
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return Request{}, fmt.Errorf("bad request: %w", err)
	}
	return req, nil
}

// capReader fails with errTooLarge once more than n bytes are asked of it,
// where an io.LimitReader would end the request in a misleading EOF.
type capReader struct {
	r io.Reader
	n int64
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.n <= 0 {
		return 0, errTooLarge
	}
	if int64(len(p)) > c.n {
		p = p[:c.n]
	}
	n, err := c.r.Read(p)
	c.n -= int64(n)
	return n, err
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
	if req.V == 0 {
		req.V = Version
	}
	// A sandbox that refuses the request (a refused client, a request too
	// large) answers before it has read all of it and hangs up, so a
	// failed write still leaves its reason to read.
	werr := json.NewEncoder(c).Encode(req)
	var resp Response
	if err := json.NewDecoder(c).Decode(&resp); err != nil {
		if werr != nil {
			return Response{}, fmt.Errorf("send request to sandbox %s: %w", id, werr)
		}
		return Response{}, fmt.Errorf("read response from sandbox %s: %w", id, err)
	}
	if resp.V > Version {
		return Response{}, fmt.Errorf("sandbox %s answered in control protocol version %d; this corral speaks version %d", id, resp.V, Version)
	}
	return resp, nil
}
