package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"

	"github.com/corral-sandbox/corral/internal/gateway/store"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1"
)

// Every handler here acts on the sandbox bound to the caller's credential
// (p.SandboxID); no request field can name another sandbox.
type supervisorService struct{ s *Server }

func (h *supervisorService) Join(ctx context.Context, req *connect.Request[gatewayv1.JoinRequest]) (*connect.Response[gatewayv1.JoinResponse], error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	m := req.Msg
	sb := store.Sandbox{Name: m.Name, Labels: m.Labels, Command: m.Command, Workdir: m.Workdir, Driver: DriverExternal}
	// The joiner writes its own policy: it may take from_gateway only the
	// secrets its join token grants (none when it grants none).
	secret, err := h.s.register(ctx, &sb, m.Policy, p.Name, func(name string) bool { return slices.Contains(p.Secrets, name) })
	if connect.CodeOf(err) == connect.CodeAlreadyExists {
		// Without the holder's id: a joining host learns no more of the
		// gateway's sandboxes than that the name is taken.
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("a sandbox named %q exists on the gateway; join with another name", m.Name))
	}
	if err != nil {
		return nil, err
	}
	// Spending is the one atomic step: of two joins racing with the same
	// token, one gets ErrNotFound here and its sandbox is removed.
	if err := h.s.store.SpendJoinToken(ctx, p.TokenID, sb.ID); err != nil {
		if derr := h.s.store.DeleteSandbox(context.WithoutCancel(ctx), sb.ID); derr != nil {
			h.s.log.Error("remove sandbox of a failed join", "sandbox", sb.ID, "err", derr)
		}
		if errors.Is(err, store.ErrNotFound) {
			return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("the join token is unknown or already spent"))
		}
		return nil, storeErr("spend join token", err)
	}
	h.s.log.Info("sandbox joined", "sandbox", sb.ID, "name", sb.Name, "join_token", p.Name)
	h.s.publishSandbox(ctx, sb.ID)
	return connect.NewResponse(&gatewayv1.JoinResponse{SandboxId: sb.ID, Token: secret}), nil
}

func (h *supervisorService) Subscribe(ctx context.Context, req *connect.Request[gatewayv1.SubscribeRequest], stream *connect.ServerStream[gatewayv1.Update]) error {
	p, err := principal(ctx)
	if err != nil {
		return err
	}
	id := p.SandboxID
	match := func(c change) bool { return c.routes || c.secret != "" || c.sandboxID == id }
	// Subscribe first, then read: a change between the two is then seen
	// twice, never missed.
	sub := h.s.changes.Subscribe(streamBuffer, match)
	defer func() { sub.Close() }()
	sentPolicy, sentRoutes := req.Msg.PolicyVersion, req.Msg.RoutesVersion
	first := true
	// changed is the secret whose value was just set, "" for none;
	// allSecrets asks for the values whatever changed: at first, and
	// after a cut-off that may have lost a change.
	changed, allSecrets := "", true
	for {
		u, deleted, err := h.s.update(ctx, id, sentPolicy, sentRoutes, allSecrets, changed)
		if err != nil {
			return err
		}
		allSecrets = false
		if deleted {
			return connect.NewError(connect.CodeNotFound, fmt.Errorf("sandbox %s was deleted", id))
		}
		// The first message goes out even with nothing new, so the
		// supervisor knows it is in sync.
		if first || u.Policy != nil || u.Routes != nil || len(u.Secrets) > 0 {
			if err := stream.Send(u); err != nil {
				return err
			}
			if u.Policy != nil {
				sentPolicy = u.Policy.Version
			}
			if u.Routes != nil {
				sentRoutes = u.Routes.Version
			}
			first = false
		}
		select {
		case <-ctx.Done():
			return streamEnded(ctx)
		case c, ok := <-sub.C:
			if !ok {
				// Cut off for lagging: the store has the newest state,
				// so subscribe again and re-read.
				sub = h.s.changes.Subscribe(streamBuffer, match)
				allSecrets = true
				continue
			}
			if c.deleted {
				return connect.NewError(connect.CodeNotFound, fmt.Errorf("sandbox %s was deleted", id))
			}
			changed = c.secret
		}
	}
}

// update is what a supervisor that runs policy version pv and routes
// version rv lacks: the newest of each when newer, and the values of the
// secrets its newest policy takes from_gateway, all of them, when asked
// for (all), with a new policy, and when changed is one of them. It sends
// no other secret.
func (s *Server) update(ctx context.Context, id string, pv, rv int64, all bool, changed string) (*gatewayv1.Update, bool, error) {
	u := &gatewayv1.Update{}
	newest, err := s.store.Policy(ctx, id, 0)
	switch {
	case errors.Is(err, store.ErrNotFound):
		if _, gerr := s.store.GetSandbox(ctx, id); errors.Is(gerr, store.ErrNotFound) {
			return nil, true, nil
		}
	case err != nil:
		return nil, false, storeErr("policy of "+id, err)
	default:
		if newest.Version > pv {
			u.Policy = policyProto(newest)
		}
		names, err := gatewaySecretNames(newest)
		if err != nil {
			return nil, false, err
		}
		if all || u.Policy != nil || slices.Contains(names, changed) {
			if u.Secrets, err = s.secretValues(ctx, id, names); err != nil {
				return nil, false, err
			}
		}
	}
	routes, err := s.store.CurrentRoutes(ctx)
	switch {
	case errors.Is(err, store.ErrNotFound):
	case err != nil:
		return nil, false, storeErr("routes", err)
	case routes.Version > rv:
		u.Routes = routesProto(routes)
	}
	return u, false, nil
}

func (h *supervisorService) ReportPolicyStatus(ctx context.Context, req *connect.Request[gatewayv1.ReportPolicyStatusRequest]) (*connect.Response[gatewayv1.ReportPolicyStatusResponse], error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	var st store.PolicyStatus
	switch req.Msg.Status {
	case gatewayv1.PolicyStatus_POLICY_STATUS_LOADED:
		st = store.PolicyLoaded
	case gatewayv1.PolicyStatus_POLICY_STATUS_FAILED:
		st = store.PolicyFailed
	default:
		return nil, invalid("status: report LOADED or FAILED")
	}
	if err := h.s.store.SetPolicyStatus(ctx, p.SandboxID, req.Msg.Version, st, req.Msg.Error); err != nil {
		return nil, storeErr(fmt.Sprintf("policy v%d of %s", req.Msg.Version, p.SandboxID), err)
	}
	if st == store.PolicyFailed {
		h.s.metrics.policyLoadFailures.Inc()
		h.s.log.Warn("policy load failed in sandbox", "sandbox", p.SandboxID, "version", req.Msg.Version, "error", req.Msg.Error)
	}
	h.s.publishSandbox(ctx, p.SandboxID)
	return connect.NewResponse(&gatewayv1.ReportPolicyStatusResponse{}), nil
}

func (h *supervisorService) ReportPhase(ctx context.Context, req *connect.Request[gatewayv1.ReportPhaseRequest]) (*connect.Response[gatewayv1.ReportPhaseResponse], error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	var phase store.Phase
	switch req.Msg.Phase {
	case gatewayv1.Phase_PHASE_READY:
		phase = store.PhaseReady
	case gatewayv1.Phase_PHASE_EXITED:
		phase = store.PhaseExited
	case gatewayv1.Phase_PHASE_FAILED:
		phase = store.PhaseFailed
	default:
		return nil, invalid("phase: report READY, EXITED or FAILED")
	}
	sb, err := h.s.store.GetSandbox(ctx, p.SandboxID)
	if err != nil {
		return nil, storeErr("sandbox "+p.SandboxID, err)
	}
	if sb.Phase.Ended() {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("sandbox %s has already %s", sb.ID, sb.Phase))
	}
	var code *int
	if req.Msg.ExitCode != nil {
		c := int(*req.Msg.ExitCode)
		code = &c
	}
	h.s.setPhase(ctx, p.SandboxID, phase, code, req.Msg.Reason)
	return connect.NewResponse(&gatewayv1.ReportPhaseResponse{}), nil
}

// Sources a supervisor may push as; anything else (notably "gateway",
// which would pass a sandbox's words off as the gateway's) becomes
// "supervisor".
var pushSources = map[string]bool{"audit": true, "supervisor": true}

var levels = map[string]int{"debug": 0, "info": 1, "warn": 2, "error": 3}

func (h *supervisorService) PushLogs(ctx context.Context, stream *connect.ClientStream[gatewayv1.LogBatch]) (*connect.Response[gatewayv1.PushLogsResponse], error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	var accepted int64
	for stream.Receive() {
		b := stream.Msg()
		// A negative count would take real drops off what users are
		// shown, and the dropped-lines counter cannot go down.
		if b.Dropped < 0 {
			return nil, invalid("dropped %d: the number of log lines dropped cannot be negative", b.Dropped)
		}
		entries := make([]store.LogEntry, 0, len(b.Entries))
		for _, e := range b.Entries {
			entries = append(entries, pushedEntry(p.SandboxID, e))
		}
		if err := h.s.appendLogs(ctx, p.SandboxID, entries, b.Dropped); err != nil {
			return nil, err
		}
		accepted += int64(len(entries))
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&gatewayv1.PushLogsResponse{Accepted: accepted}), nil
}

// Bounds on one pushed entry: the gateway keeps the last thousand entries
// of every sandbox in memory and hands each to every follower, so one
// credential must not be able to pin megabytes per line. Real lines
// (audit events, the supervisor's log) are far smaller.
const (
	maxEventBytes    = 128
	maxLogLineBytes  = 4 << 10
	maxLogFieldBytes = 12 << 10
)

// pushedEntry is what the gateway stores of an entry a supervisor pushed:
// its own sandbox id and an allowed source, whatever the entry said, and
// no part over its bound (a message cut, fields replaced by their size).
func pushedEntry(sandboxID string, e *gatewayv1.LogEntry) store.LogEntry {
	out := store.LogEntry{
		SandboxID: sandboxID,
		Level:     strings.ToLower(e.Level),
		Source:    e.Source,
		Event:     strings.ToValidUTF8(cut(e.Event, maxEventBytes), ""),
		Message:   e.Message,
		Fields:    e.Fields,
	}
	if len(out.Message) > maxLogLineBytes {
		out.Message = strings.ToValidUTF8(cut(out.Message, maxLogLineBytes), "") + fmt.Sprintf(" … (%d bytes cut)", len(e.Message)-maxLogLineBytes)
	}
	if len(out.Fields) > maxLogFieldBytes {
		out.Fields, _ = json.Marshal(map[string]int{"fields_cut_bytes": len(e.Fields)})
	}
	if !pushSources[out.Source] {
		out.Source = "supervisor"
	}
	if _, ok := levels[out.Level]; !ok {
		out.Level = "info"
	}
	if e.Time != nil && e.Time.IsValid() {
		out.Time = e.Time.AsTime()
	} else {
		out.Time = time.Now()
	}
	if len(out.Fields) > 0 && !json.Valid(out.Fields) {
		out.Fields = nil
	}
	return out
}

// cut is s's first n bytes at most, not splitting a UTF-8 sequence.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// appendLogs stores entries of one sandbox and hands them to followers,
// and accounts for lines the supervisor dropped before sending.
func (s *Server) appendLogs(ctx context.Context, sandboxID string, entries []store.LogEntry, dropped int64) error {
	received := len(entries)
	if dropped > 0 {
		fields, _ := json.Marshal(map[string]int64{"dropped": dropped})
		entries = append(entries, store.LogEntry{
			SandboxID: sandboxID,
			Time:      time.Now(),
			Level:     "warn",
			Source:    "gateway",
			Event:     "logs.dropped",
			Message:   fmt.Sprintf("the supervisor dropped %d log lines before they reached the gateway", dropped),
			Fields:    fields,
		})
	}
	if len(entries) == 0 {
		return nil
	}
	s.ingest.Lock()
	defer s.ingest.Unlock()
	if err := s.store.AppendLogs(ctx, entries); err != nil {
		return storeErr("store logs", err)
	}
	s.dropped[sandboxID] += dropped
	s.metrics.logsReceived.Add(float64(received))
	s.metrics.logsDropped.Add(float64(dropped))
	s.metrics.observeAudit(entries[:received])
	s.tail.Add(sandboxID, entries...)
	for _, e := range entries {
		s.logs.Publish(e)
	}
	return nil
}

// streamEnded is the error a server stream ends with when its context
// does: the refusal of a credential revoked meanwhile (the auth
// interceptor's cause), else Unavailable: the client left, or the gateway
// is stopping and the client should reconnect.
func streamEnded(ctx context.Context) error {
	cause := context.Cause(ctx)
	var ce *connect.Error
	if errors.As(cause, &ce) {
		return ce
	}
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf("stream ended: %w", cause))
}
