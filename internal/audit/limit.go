package audit

import (
	"container/list"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// keyFields name, per event, the fields that make two events "the same
// thing" for the rate limit, besides sandbox_id and session. They leave out
// what a workload varies at no cost to flood the log: paths, queries,
// source ports, pids. An event not listed here is keyed by its name alone.
var keyFields = map[string][]string{
	NetConnectDenied:   {"binary", "host", "ip", "port", "reason"},
	NetConnectFailed:   {"binary", "host", "ip", "port", "reason"},
	NetConnectAllowed:  {"binary", "host", "ip", "port"},
	HTTPRequest:        {"host", "port", "method", "decision", "rule", "reason"},
	TLSHandshakeFailed: {"binary", "host", "port", "cause"},
	NetDNSDenied:       {"reason", fieldZone},
}

// fieldZone keys net.dns.denied by the last two labels of the name, so that
// random subdomains of one zone share a key.
const fieldZone = "zone"

const (
	classRefusal = "refusal"
	classAllowed = "allowed"
)

// bucket is a token bucket; its zero value is full.
type bucket struct {
	tokens float64
	last   time.Time
}

func (b *bucket) take(r rate, now time.Time) bool {
	if b.last.IsZero() {
		b.tokens = r.burst
	} else if d := now.Sub(b.last); d > 0 {
		b.tokens = min(r.burst, b.tokens+d.Seconds()*r.perSec)
	}
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// entry is one key's (or one event name's) bucket and what it has left out
// since its last report.
type entry struct {
	bucket
	event  string
	class  string
	fields []slog.Attr // what audit.suppressed says about the key
	count  int64
	keys   int // keys evicted or not reported individually, folded in here
	since  time.Time
	parent *entry // the event-scope entry; nil for one
	elem   *list.Element
}

func (e *entry) suppress(n int64, since time.Time) {
	if e.count == 0 || since.Before(e.since) {
		e.since = since
	}
	e.count += n
}

// fold moves e's count into its event-scope entry.
func (e *entry) fold() {
	if e.count == 0 {
		return
	}
	e.parent.suppress(e.count, e.since)
	e.parent.keys++
	e.count = 0
}

func (e *entry) report(now time.Time, scope string) slog.Record {
	r := slog.NewRecord(now, slog.LevelInfo, AuditSuppressed, 0)
	r.AddAttrs(e.fields...)
	r.AddAttrs(slog.String(FieldSuppressedEvent, e.event), slog.String(FieldScope, scope), slog.String(FieldClass, e.class),
		slog.Int64(FieldCount, e.count), slog.Time(FieldWindowStart, e.since), slog.Time(FieldWindowEnd, now))
	if e.keys > 0 {
		r.AddAttrs(slog.Int(FieldKeys, e.keys))
	}
	e.count, e.keys = 0, 0
	return r
}

// limiter holds at most maxKeys key entries, evicting the least recently
// used (its count folds into its event entry), so that a workload inventing
// keys cannot grow it. Event entries are keyed by sandbox, session, event
// name and class, which the code, not the workload, chooses.
type limiter struct {
	cfg       *config
	mu        sync.Mutex
	keys      map[string]*entry
	lru       *list.List
	events    map[string]*entry
	lastFlush time.Time
}

func newLimiter(cfg *config) *limiter {
	return &limiter{cfg: cfg, keys: map[string]*entry{}, lru: list.New(), events: map[string]*entry{}}
}

// allow takes a token from the event's key and from its event entry; an
// event refused by either is counted for the next audit.suppressed.
func (l *limiter) allow(event string, attrs []slog.Attr, now time.Time) bool {
	class, keyRate, eventRate := classRefusal, l.cfg.refusalKey, l.cfg.refusalEvent
	if event == NetConnectAllowed || event == HTTPRequest && field(attrs, "decision") == "allow" {
		class, keyRate, eventRate = classAllowed, l.cfg.allowedKey, l.cfg.allowedEvent
	}
	who := []slog.Attr{}
	for _, name := range []string{FieldSandboxID, FieldSession} {
		if v, ok := lookup(attrs, name); ok {
			who = append(who, slog.Attr{Key: name, Value: v})
		}
	}
	fields := append([]slog.Attr{}, who...)
	for _, name := range keyFields[event] {
		if name == fieldZone {
			fields = append(fields, slog.String(fieldZone, zone(field(attrs, "name"))))
			continue
		}
		if v, ok := lookup(attrs, name); ok {
			fields = append(fields, slog.Attr{Key: name, Value: v})
		}
	}
	evKey := keyOf(event, class, who)
	key := keyOf(event, class, fields)

	l.mu.Lock()
	defer l.mu.Unlock()
	ev := l.events[evKey]
	if ev == nil {
		ev = &entry{event: event, class: class, fields: who}
		l.events[evKey] = ev
	}
	e := l.keys[key]
	if e == nil {
		if l.lru.Len() >= l.cfg.maxKeys {
			old := l.lru.Remove(l.lru.Back()).(string)
			l.keys[old].fold()
			delete(l.keys, old)
		}
		e = &entry{event: event, class: class, fields: fields, parent: ev}
		e.elem = l.lru.PushFront(key)
		l.keys[key] = e
	} else {
		l.lru.MoveToFront(e.elem)
	}
	if !e.take(keyRate, now) {
		e.suppress(1, now)
		return false
	}
	if !ev.take(eventRate, now) {
		ev.suppress(1, now)
		return false
	}
	return true
}

// flush returns the audit.suppressed events due: at most one per key per
// reportEvery and at most maxReports of them, the rest folded into their
// event's count. final reports everything regardless of time (at Close).
func (l *limiter) flush(now time.Time, final bool) []slog.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !final && now.Sub(l.lastFlush) < l.cfg.reportEvery {
		return nil
	}
	l.lastFlush = now
	var out []slog.Record
	for _, e := range l.keys {
		switch {
		case e.count == 0:
		case len(out) < l.cfg.maxReports:
			out = append(out, e.report(now, "key"))
		default:
			e.fold()
		}
	}
	for _, ev := range l.events {
		if ev.count > 0 {
			out = append(out, ev.report(now, "event"))
		}
	}
	return out
}

func keyOf(event, class string, fields []slog.Attr) string {
	var b strings.Builder
	b.WriteString(event)
	b.WriteByte(0)
	b.WriteString(class)
	for _, a := range fields {
		b.WriteByte(0)
		b.WriteString(a.Key)
		b.WriteByte('=')
		b.WriteString(a.Value.String())
	}
	return b.String()
}

// lookup finds the last attribute named name, as a JSON reader would.
func lookup(attrs []slog.Attr, name string) (slog.Value, bool) {
	for i := len(attrs) - 1; i >= 0; i-- {
		if attrs[i].Key == name {
			return attrs[i].Value, true
		}
	}
	return slog.Value{}, false
}

func field(attrs []slog.Attr, name string) string {
	v, _ := lookup(attrs, name)
	if v.Kind() != slog.KindString {
		return ""
	}
	return v.String()
}

// zone is the last two labels of a DNS name: a cheap stand-in for the
// registrable domain that needs no public-suffix list.
func zone(name string) string {
	labels := strings.Split(strings.TrimSuffix(strings.ToLower(name), "."), ".")
	if len(labels) > 2 {
		labels = labels[len(labels)-2:]
	}
	return strings.Join(labels, ".")
}
