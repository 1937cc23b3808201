// Package aggregate groups a sandbox's network denials for the policy
// advisor. Each denial is folded into one entry per (host, port, binary)
// with counts, first and last time seen, the sanitised command line, the
// HTTP requests seen on the host while its traffic was only audited, and
// the addresses a one-off DNS probe found for it. The proxy calls Record*
// on every denial, so recording is one map update under a mutex; anything
// slow (the probe) runs on its own goroutine, and watchers are woken
// through channels instead of polling.
package aggregate

import (
	"cmp"
	"context"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/corral-sandbox/corral/internal/advisor/sanitize"
	"github.com/corral-sandbox/corral/internal/egress"
)

// Defaults for Config's zero values.
const (
	DefaultMaxKeys    = 1000
	DefaultMaxSamples = 50
	// DefaultMaxProbes and DefaultMaxProbesPerDomain bound the probe's
	// lookups: every probe of a name no policy allows sends that name to
	// the upstream resolver, which is the channel the sandbox's DNS server
	// closes by refusing such names. The budget keeps what a workload can
	// leak through denied names to a few hundred bytes per domain.
	DefaultMaxProbes          = 200
	DefaultMaxProbesPerDomain = 4
	// DefaultProbeTimeout bounds one lookup.
	DefaultProbeTimeout = 5 * time.Second
	// maxPath bounds a stored sample's path.
	maxPath = 512
	// probeWorkers bounds concurrent lookups.
	probeWorkers = 4
)

// Sample decisions.
const (
	SampleAllow = "allow"
	// SampleAudit is a request the rules would deny but that was forwarded
	// because its endpoint has enforcement: audit.
	SampleAudit = "audit"
	SampleDeny  = "deny"
)

// Key identifies one kind of denial. Host is a name, or a literal IP in
// canonical form; Binary is empty when the denied process is unknown (a
// DNS query, which carries no process). A DNS-only key has Port 0.
type Key struct {
	Host   string `json:"host"`
	Port   uint16 `json:"port"`
	Binary string `json:"binary,omitempty"`
}

// String formats the key as host:port (binary).
func (k Key) String() string {
	s := net.JoinHostPort(k.Host, strconv.Itoa(int(k.Port)))
	if k.Binary != "" {
		s += " (" + k.Binary + ")"
	}
	return s
}

// Sample is one distinct HTTP request seen for a key.
type Sample struct {
	Method   string `json:"method"`
	Path     string `json:"path"`
	Decision string `json:"decision"`
	Count    uint64 `json:"count"`
}

// Probe is what the DNS probe found for an entry's host.
type Probe struct {
	Done  bool         `json:"done"`
	Addrs []netip.Addr `json:"addrs,omitempty"`
	Err   string       `json:"error,omitempty"`
	// Skipped says why the host was not probed (probe budget, literal IP,
	// no probe configured).
	Skipped string `json:"skipped,omitempty"`
}

// Entry is the aggregate for one key. Entries returned by the aggregator
// are copies.
type Entry struct {
	Key
	FirstSeen time.Time `json:"first_seen"`
	LastSeen  time.Time `json:"last_seen"`
	// Count is every denial of the key, those the caller folded in
	// (Suppressed) included; DNSCount is how many of them were DNS
	// queries.
	Count      uint64 `json:"count"`
	Suppressed uint64 `json:"suppressed"`
	DNSCount   uint64 `json:"dns_count"`
	// Reason and Via are the last denial's.
	Reason string `json:"reason,omitempty"`
	Via    string `json:"via,omitempty"`
	// Proto is "tls" or "http" when the denied traffic was seen to be
	// TLS or HTTP.
	Proto string `json:"proto,omitempty"`
	// Cmdline is the first denied process's command line, credentials
	// removed.
	Cmdline string `json:"cmdline,omitempty"`
	// Requests counts the HTTP requests recorded; Samples holds up to
	// MaxSamples distinct ones, SamplesDropped those that did not fit.
	Requests       uint64   `json:"requests"`
	Samples        []Sample `json:"samples,omitempty"`
	SamplesDropped uint64   `json:"samples_dropped"`
	Probe          Probe    `json:"probe"`
	// Absorbed lists the DNS-only key this entry took over: the name was
	// refused by DNS first and then asked for by a connection.
	Absorbed []Key `json:"absorbed,omitempty"`
	// Version is the aggregator's generation at the entry's last change.
	Version uint64 `json:"version"`
}

// ProbeFunc resolves host through the supervisor's own resolver.
type ProbeFunc func(ctx context.Context, host string) ([]netip.Addr, error)

// Config configures an Aggregator; zero fields take the defaults.
type Config struct {
	MaxKeys            int
	MaxSamples         int
	MaxProbes          int
	MaxProbesPerDomain int
	ProbeTimeout       time.Duration
	// Probe, when set, is called once per new host on its own goroutine.
	Probe ProbeFunc
	Now   func() time.Time
}

// Aggregator folds denials into entries. It is safe for concurrent use.
type Aggregator struct {
	cfg    Config
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	sem    chan struct{}

	mu       sync.Mutex
	entries  map[Key]*Entry
	byHost   map[string]Key // latest connection key per host, for DNS denials
	probes   map[string]*Probe
	perZone  map[string]int
	probed   int
	overflow uint64
	gen      uint64
	subs     map[chan struct{}]struct{}
	closed   bool
}

// New returns an aggregator. Close stops its probes.
func New(cfg Config) *Aggregator {
	cfg.MaxKeys = cmp.Or(cfg.MaxKeys, DefaultMaxKeys)
	cfg.MaxSamples = cmp.Or(cfg.MaxSamples, DefaultMaxSamples)
	cfg.MaxProbes = cmp.Or(cfg.MaxProbes, DefaultMaxProbes)
	cfg.MaxProbesPerDomain = cmp.Or(cfg.MaxProbesPerDomain, DefaultMaxProbesPerDomain)
	cfg.ProbeTimeout = cmp.Or(cfg.ProbeTimeout, DefaultProbeTimeout)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Aggregator{
		cfg: cfg, ctx: ctx, cancel: cancel,
		sem:     make(chan struct{}, probeWorkers),
		entries: map[Key]*Entry{},
		byHost:  map[string]Key{},
		probes:  map[string]*Probe{},
		perZone: map[string]int{},
		subs:    map[chan struct{}]struct{}{},
	}
}

// Close cancels running probes and waits for them; later records are
// still counted but start no probe.
func (a *Aggregator) Close() {
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	a.cancel()
	a.wg.Wait()
}

// RecordConnect folds in one denied connection. cmdline, which may be
// nil, returns the denied process's command line (from
// /proc/PID/cmdline); it is called, under the aggregator's lock, only
// for a new key, so a flood of repeated denials costs no reads, and what
// it returns is sanitised before it is stored. suppressed is how many
// further identical denials the caller folded into this call.
func (a *Aggregator) RecordConnect(r egress.Request, d egress.Decision, cmdline func() []string, suppressed uint64) {
	k := Key{Host: r.Host, Port: r.Port, Binary: r.Identity.Binary}
	if k.Host == "" {
		k.Host = r.IP.Unmap().String()
	}
	now := a.cfg.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.entries[k]
	if e == nil {
		// The DNS-only key for the host, if any, becomes this one: the
		// refused lookup and the connection that follows are one need.
		dk := Key{Host: k.Host}
		dns := a.entries[dk]
		if dns != nil && dk != k {
			delete(a.entries, dk)
		}
		if e = a.create(k, now); e == nil {
			return
		}
		if cmdline != nil {
			e.Cmdline = sanitize.Line(cmdline())
		}
		if dns != nil && dk != k {
			e.FirstSeen = dns.FirstSeen
			e.Count, e.Suppressed, e.DNSCount = dns.Count, dns.Suppressed, dns.DNSCount
			e.Absorbed = append(e.Absorbed, dk)
		}
	}
	a.byHost[k.Host] = k
	e.Count += 1 + suppressed
	e.Suppressed += suppressed
	e.LastSeen = now
	e.Reason, e.Via = d.Reason, r.Via
	switch {
	case r.SniffedKind == "tls_sni":
		e.Proto = "tls"
	case r.SniffedKind == "http_host", r.Via == egress.ViaHTTPForward:
		e.Proto = "http"
	}
	a.touch(e)
}

// RecordDNS folds in one refused DNS query for name (count queries, of
// which suppressed were folded by the caller's rate limit). A name that a
// connection was already denied for counts towards that connection's key;
// otherwise it gets a DNS-only key that the first such connection absorbs.
func (a *Aggregator) RecordDNS(name string, count, suppressed uint64) {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	count = max(count, 1)
	now := a.cfg.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	k, ok := a.byHost[name]
	if !ok {
		k = Key{Host: name}
	}
	e := a.entries[k]
	if e == nil {
		if e = a.create(k, now); e == nil {
			return
		}
	}
	e.Count += count
	e.DNSCount += count
	e.Suppressed += suppressed
	e.LastSeen = now
	a.touch(e)
}

// RecordHTTP folds in one request seen on an inspected connection,
// normally one whose endpoint is in enforcement: audit.
func (a *Aggregator) RecordHTTP(r egress.Request, h egress.HTTPRequest, d egress.HTTPDecision) {
	k := Key{Host: r.Host, Port: r.Port, Binary: r.Identity.Binary}
	if k.Host == "" {
		k.Host = r.IP.Unmap().String()
	}
	decision := SampleDeny
	switch {
	case d.Allow:
		decision = SampleAllow
	case d.Audit:
		decision = SampleAudit
	}
	now := a.cfg.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.entries[k]
	if e == nil {
		if e = a.create(k, now); e == nil {
			return
		}
		a.byHost[k.Host] = k
	}
	e.Requests++
	e.LastSeen = now
	e.Proto = cmp.Or(e.Proto, "http")
	i := slices.IndexFunc(e.Samples, func(s Sample) bool {
		return s.Method == h.Method && s.Decision == decision && s.Path == h.Path
	})
	switch {
	case i >= 0:
		e.Samples[i].Count++
	case len(e.Samples) < a.cfg.MaxSamples:
		p := h.Path
		if len(p) > maxPath {
			p = p[:maxPath]
		}
		e.Samples = append(e.Samples, Sample{Method: h.Method, Path: sanitize.String(p), Decision: decision, Count: 1})
	default:
		e.SamplesDropped++
	}
	a.touch(e)
}

// create adds an entry for k, or counts an overflow and returns nil when
// the aggregator is full. Called with mu held.
func (a *Aggregator) create(k Key, now time.Time) *Entry {
	if len(a.entries) >= a.cfg.MaxKeys {
		a.overflow++
		return nil
	}
	e := &Entry{Key: k, FirstSeen: now}
	a.entries[k] = e
	if p := a.probes[k.Host]; p != nil {
		e.Probe = *p
	} else {
		a.startProbe(e)
	}
	return e
}

// startProbe looks up e's host once per host, within the budget. Called
// with mu held.
func (a *Aggregator) startProbe(e *Entry) {
	host := e.Host
	p := &Probe{}
	a.probes[host] = p
	zone := domain(host)
	switch {
	case a.cfg.Probe == nil:
		p.Skipped = "no probe configured"
	case isIP(host):
		p.Done, p.Skipped = true, "literal IP"
		if ip, err := netip.ParseAddr(host); err == nil {
			p.Addrs = []netip.Addr{ip}
		}
	case a.closed:
		p.Skipped = "aggregator closed"
	case a.probed >= a.cfg.MaxProbes:
		p.Skipped = "probe budget spent"
	case a.perZone[zone] >= a.cfg.MaxProbesPerDomain:
		p.Skipped = "probe budget for " + zone + " spent"
	default:
		a.probed++
		a.perZone[zone]++
		a.wg.Add(1)
		go a.probe(host)
	}
	e.Probe = *p
}

func (a *Aggregator) probe(host string) {
	defer a.wg.Done()
	select {
	case a.sem <- struct{}{}:
	case <-a.ctx.Done():
		return
	}
	ctx, cancel := context.WithTimeout(a.ctx, a.cfg.ProbeTimeout)
	addrs, err := a.cfg.Probe(ctx, host)
	cancel()
	<-a.sem
	res := Probe{Done: true}
	if err != nil {
		res.Err = err.Error()
	}
	for _, ip := range addrs {
		res.Addrs = append(res.Addrs, ip.Unmap())
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	*a.probes[host] = res
	for _, e := range a.entries {
		if e.Host == host {
			e.Probe = res
			e.Probe.Addrs = slices.Clone(res.Addrs)
			a.touch(e)
		}
	}
}

// touch marks e changed and wakes the subscribers. Called with mu held.
func (a *Aggregator) touch(e *Entry) {
	a.gen++
	e.Version = a.gen
	for ch := range a.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Subscribe returns a channel that receives a value whenever entries
// change (wake-ups coalesce: one value may stand for many changes; read
// them with Changes) and a function that ends the subscription.
func (a *Aggregator) Subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	a.mu.Lock()
	a.subs[ch] = struct{}{}
	a.mu.Unlock()
	return ch, func() {
		a.mu.Lock()
		delete(a.subs, ch)
		a.mu.Unlock()
	}
}

// Changes returns the entries changed after generation since, oldest
// change first, and the current generation to pass next time.
func (a *Aggregator) Changes(since uint64) ([]Entry, uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []Entry
	for _, e := range a.entries {
		if e.Version > since {
			out = append(out, e.clone())
		}
	}
	slices.SortFunc(out, func(x, y Entry) int { return cmp.Compare(x.Version, y.Version) })
	return out, a.gen
}

// Snapshot returns every entry, most recently seen first.
func (a *Aggregator) Snapshot() []Entry {
	out, _ := a.Changes(0)
	slices.SortStableFunc(out, func(x, y Entry) int { return y.LastSeen.Compare(x.LastSeen) })
	return out
}

// Get returns the entry for k.
func (a *Aggregator) Get(k Key) (Entry, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	e, ok := a.entries[k]
	if !ok {
		return Entry{}, false
	}
	return e.clone(), true
}

// Stats reports how many keys are held and how many new keys were
// dropped because the aggregator was full.
func (a *Aggregator) Stats() (keys int, overflow uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.entries), a.overflow
}

func (e *Entry) clone() Entry {
	c := *e
	c.Samples = slices.Clone(e.Samples)
	c.Absorbed = slices.Clone(e.Absorbed)
	c.Probe.Addrs = slices.Clone(e.Probe.Addrs)
	return c
}

func isIP(h string) bool {
	_, err := netip.ParseAddr(h)
	return err == nil
}

// domain returns the last two labels of host, the unit of the probe
// budget: coarser than a registrable domain for names under co.uk and
// the like, which only makes the budget stricter.
func domain(host string) string {
	labels := strings.Split(host, ".")
	if len(labels) <= 2 {
		return host
	}
	return strings.Join(labels[len(labels)-2:], ".")
}
