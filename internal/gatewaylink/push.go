package gatewaylink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/corral-sandbox/corral/internal/audit"
	gatewayv1 "github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1"
)

// Log entry sources and the event name of the supervisor's own warnings.
const (
	SourceAudit      = "audit"
	SourceSupervisor = "supervisor"
	EventSupervisor  = "supervisor.log"
)

// callTimeout bounds one report or one push, so a gateway that accepts a
// connection and then hangs costs a retry, not the link.
const callTimeout = 10 * time.Second

// inboxSize is the hand-off between the paths that log (the proxy's among
// them) and the pusher, which empties it every FlushEvery: room for
// tens of thousands of events a second before any is dropped.
const inboxSize = 8192

// Observe takes an audit event; give it to audit.Logger.Observe. It runs
// on the proxy's path and never blocks: an event that finds the hand-off
// full is counted as dropped and reported to the gateway as such.
func (l *Link) Observe(e audit.Event) {
	switch e.(type) {
	case audit.SandboxStartEvent, audit.SandboxStartUncagedEvent:
		l.started.Store(true)
		l.reports.phase(&gatewayv1.ReportPhaseRequest{Phase: gatewayv1.Phase_PHASE_READY})
		l.poke()
	}
	l.logs.offer(item{t: time.Now(), ev: e})
}

// Handler returns a slog.Handler that passes every record to next and
// sends warnings and errors to the gateway as well.
func (l *Link) Handler(next slog.Handler) slog.Handler {
	return &teeHandler{next: next, l: l}
}

type teeHandler struct {
	next  slog.Handler
	l     *Link
	attrs []slog.Attr
	group string
}

func (h *teeHandler) Enabled(ctx context.Context, lv slog.Level) bool {
	return lv >= slog.LevelWarn || h.next.Enabled(ctx, lv)
}

func (h *teeHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		rec := slog.NewRecord(r.Time, r.Level, r.Message, 0)
		rec.AddAttrs(h.attrs...)
		r.Attrs(func(a slog.Attr) bool {
			rec.AddAttrs(h.prefixed(a))
			return true
		})
		h.l.logs.offer(item{t: r.Time, rec: &rec})
	}
	if !h.next.Enabled(ctx, r.Level) {
		return nil
	}
	return h.next.Handle(ctx, r)
}

func (h *teeHandler) prefixed(a slog.Attr) slog.Attr {
	if h.group != "" {
		a.Key = h.group + "." + a.Key
	}
	return a
}

func (h *teeHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.next = h.next.WithAttrs(as)
	c.attrs = slices.Clone(h.attrs)
	for _, a := range as {
		c.attrs = append(c.attrs, h.prefixed(a))
	}
	return &c
}

func (h *teeHandler) WithGroup(name string) slog.Handler {
	c := *h
	c.next = h.next.WithGroup(name)
	c.group = strings.TrimPrefix(h.group+"."+name, ".")
	return &c
}

// item is one thing to log: an audit event or a supervisor record.
type item struct {
	t   time.Time
	ev  audit.Event
	rec *slog.Record
}

// logBuffer keeps entries until the gateway has them: up to max while it
// is away; beyond that entries are dropped and counted, and the count
// goes to the gateway in the next batch.
type logBuffer struct {
	in      chan item
	max     int
	dropped atomic.Int64

	mu      sync.Mutex
	entries []*gatewayv1.LogEntry
}

func newLogBuffer(max int) *logBuffer {
	return &logBuffer{in: make(chan item, inboxSize), max: max}
}

func (b *logBuffer) offer(it item) {
	select {
	case b.in <- it:
	default:
		b.dropped.Add(1)
	}
}

// collect moves what was offered into the buffer, turning it into
// entries off the logging path.
func (b *logBuffer) collect() {
	for {
		select {
		case it := <-b.in:
			e := it.entry()
			b.mu.Lock()
			if len(b.entries) >= b.max {
				b.dropped.Add(1)
			} else {
				b.entries = append(b.entries, e)
			}
			b.mu.Unlock()
		default:
			return
		}
	}
}

// head returns up to n of the oldest entries.
func (b *logBuffer) head(n int) []*gatewayv1.LogEntry {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.entries[:min(n, len(b.entries))])
}

// ack forgets the n oldest entries and d drops: the gateway has them.
func (b *logBuffer) ack(n int, d int64) {
	b.mu.Lock()
	b.entries = slices.Delete(b.entries, 0, n)
	b.mu.Unlock()
	b.dropped.Add(-d)
}

func (b *logBuffer) pending() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.entries) + len(b.in)
}

func (it item) entry() *gatewayv1.LogEntry {
	e := &gatewayv1.LogEntry{Time: timestamppb.New(it.t)}
	if it.ev != nil {
		e.Source, e.Event, e.Level = SourceAudit, it.ev.EventName(), auditLevel(it.ev.EventName())
		fields, err := json.Marshal(it.ev)
		if err != nil {
			fields, _ = json.Marshal(map[string]string{"error": "encode event: " + err.Error()})
		}
		e.Fields = fields
		return e
	}
	e.Source, e.Event, e.Message, e.Level = SourceSupervisor, EventSupervisor, it.rec.Message, "warn"
	if it.rec.Level >= slog.LevelError {
		e.Level = "error"
	}
	fields := map[string]any{}
	it.rec.Attrs(func(a slog.Attr) bool {
		fields[a.Key] = attrValue(a.Value.Resolve())
		return true
	})
	e.Fields, _ = json.Marshal(fields)
	return e
}

func attrValue(v slog.Value) any {
	switch v.Kind() {
	case slog.KindString, slog.KindInt64, slog.KindUint64, slog.KindFloat64, slog.KindBool, slog.KindTime:
		return v.Any()
	}
	// Errors and durations would encode as {} or nanoseconds.
	return v.String()
}

// auditLevel ranks audit events for `corral logs --level warn`: refusals,
// failures and kills are warnings, the rest is the record of what ran.
func auditLevel(event string) string {
	for _, w := range []string{"denied", "failed", "error", "killed", "degraded", "refused", "revoked", "not_enforced"} {
		if strings.HasSuffix(event, w) {
			return "warn"
		}
	}
	return "info"
}

// reports holds the reports not yet delivered: policy statuses, oldest
// first, and the newest phase (a later phase makes an earlier one moot).
type reports struct {
	mu       sync.Mutex
	statuses []*gatewayv1.ReportPolicyStatusRequest
	ph       *gatewayv1.ReportPhaseRequest
}

// maxStatuses bounds the undelivered statuses; older ones are of versions
// long replaced.
const maxStatuses = 32

func (r *reports) policy(v int64, st gatewayv1.PolicyStatus, msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.statuses = append(r.statuses, &gatewayv1.ReportPolicyStatusRequest{Version: v, Status: st, Error: msg})
	if len(r.statuses) > maxStatuses {
		r.statuses = slices.Delete(r.statuses, 0, len(r.statuses)-maxStatuses)
	}
}

func (r *reports) phase(p *gatewayv1.ReportPhaseRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ph != nil && isFinal(r.ph.GetPhase()) && !isFinal(p.GetPhase()) {
		return
	}
	r.ph = p
}

func isFinal(p gatewayv1.Phase) bool {
	return p == gatewayv1.Phase_PHASE_EXITED || p == gatewayv1.Phase_PHASE_FAILED
}

func (r *reports) empty() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.statuses) == 0 && r.ph == nil
}

// push delivers reports and logs: at once when woken (a report, a
// reconnect, Finish), else every FlushEvery; after a failure it waits
// its backoff unless woken.
func (l *Link) push() {
	defer l.pusher.Done()
	tick := time.NewTicker(l.cfg.FlushEvery)
	defer tick.Stop()
	bo := l.backoff()
	var retryAt time.Time
	finishing := l.finishing
	for {
		select {
		case <-l.ctx.Done():
			return
		case <-finishing:
			finishing = nil
			retryAt = time.Time{}
		case <-l.wake:
			retryAt = time.Time{}
		case <-tick.C:
		}
		l.logs.collect()
		if time.Now().Before(retryAt) {
			continue
		}
		if err := l.deliver(); err != nil {
			d := bo.next()
			retryAt = time.Now().Add(d)
			l.log.Debug("gateway link: cannot deliver reports and logs; kept for later", "err", err, "retry_in", d)
			continue
		}
		bo = l.backoff()
		if finishing == nil && l.logs.pending() == 0 && l.reports.empty() {
			close(l.flushed)
			<-l.ctx.Done()
			return
		}
	}
}

func (l *Link) deliver() error {
	if err := l.sendReports(); err != nil {
		return err
	}
	return l.sendLogs()
}

func (l *Link) sendReports() error {
	for {
		l.reports.mu.Lock()
		var st *gatewayv1.ReportPolicyStatusRequest
		if len(l.reports.statuses) > 0 {
			st = l.reports.statuses[0]
		}
		l.reports.mu.Unlock()
		if st == nil {
			break
		}
		ctx, cancel := context.WithTimeout(l.ctx, callTimeout)
		_, err := l.client.ReportPolicyStatus(ctx, connect.NewRequest(st))
		cancel()
		if err != nil && !l.refused(err, "policy status") {
			return fmt.Errorf("report policy status: %w", err)
		}
		l.reports.mu.Lock()
		if len(l.reports.statuses) > 0 && l.reports.statuses[0] == st {
			l.reports.statuses = l.reports.statuses[1:]
		}
		l.reports.mu.Unlock()
	}
	l.reports.mu.Lock()
	ph := l.reports.ph
	l.reports.mu.Unlock()
	if ph == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(l.ctx, callTimeout)
	_, err := l.client.ReportPhase(ctx, connect.NewRequest(ph))
	cancel()
	if err != nil && !l.refused(err, "phase") {
		return fmt.Errorf("report phase: %w", err)
	}
	l.reports.mu.Lock()
	if l.reports.ph == ph {
		l.reports.ph = nil
	}
	l.reports.mu.Unlock()
	return nil
}

// refused tells a report the gateway will never take (the sandbox has
// ended there already, or is unknown) from one worth sending again; the
// first is dropped with a warning.
func (l *Link) refused(err error, what string) bool {
	switch connect.CodeOf(err) {
	case connect.CodeFailedPrecondition, connect.CodeInvalidArgument, connect.CodeNotFound, connect.CodeUnimplemented:
		l.log.Warn("the gateway refused a report; not sending it again", "report", what, "err", err)
		return true
	}
	return false
}

// sendLogs sends what is buffered, one batch per PushLogs call: entries
// leave the buffer only once the call's response says the gateway took
// them, so a gateway killed mid-call costs a resend of that batch, never
// entries.
func (l *Link) sendLogs() error {
	for {
		entries := l.logs.head(l.cfg.Batch)
		dropped := l.logs.dropped.Load()
		if len(entries) == 0 && dropped == 0 {
			return nil
		}
		if err := l.pushLogs(entries, dropped); err != nil {
			return err
		}
		l.logs.ack(len(entries), dropped)
	}
}

func (l *Link) pushLogs(entries []*gatewayv1.LogEntry, dropped int64) error {
	ctx, cancel := context.WithTimeout(l.ctx, callTimeout)
	defer cancel()
	stream := l.client.PushLogs(ctx)
	// io.EOF means the gateway ended the call: its reason is in the
	// response.
	if err := stream.Send(&gatewayv1.LogBatch{Entries: entries, Dropped: dropped}); err != nil && !errors.Is(err, io.EOF) {
		_, _ = stream.CloseAndReceive()
		return fmt.Errorf("push logs: %w", err)
	}
	if _, err := stream.CloseAndReceive(); err != nil {
		return fmt.Errorf("push logs: %w", err)
	}
	return nil
}
