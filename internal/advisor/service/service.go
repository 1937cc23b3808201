// Package service is one sandbox's policy advisor as the supervisor runs
// it: it reads the sandbox's typed audit events into the aggregator, turns
// what changed into chunks (propose), validates them against the policy in
// force (check) and keeps them (drafts); a person's approval re-checks the
// chunk, reloads the running sandbox's policy and records the version it
// went live in. The control socket (corral draft) and policy.local are its
// front ends.
package service

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/corral-sandbox/corral/internal/advisor/aggregate"
	"github.com/corral-sandbox/corral/internal/advisor/check"
	"github.com/corral-sandbox/corral/internal/advisor/drafts"
	"github.com/corral-sandbox/corral/internal/advisor/propose"
	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/netclass"
	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/corral-sandbox/corral/internal/reload"
)

// TTLEnv overrides the pending chunks' time to live (a Go duration), for
// tests and short experiments.
const TTLEnv = "CORRAL_DRAFT_TTL"

// minRound spaces the advisor's rounds: a burst of denials is proposed
// for together, well within the second a new chunk may take.
const minRound = 50 * time.Millisecond

// Config is what a sandbox's advisor is built from.
type Config struct {
	// Dir holds the draft store (drafts.json).
	Dir      string
	Reloader *reload.Reloader
	Audit    *audit.Logger
	Log      *slog.Logger
	// Rules are the sandbox's --policy-rules, nil for the baked-in ones.
	Rules        []byte
	TrustedCIDRs []netip.Prefix
	// Resolver is the one the supervisor's dialer resolves allowed names
	// with (nil: the host's); the DNS probe asks it, so it sees the
	// addresses a connection would go to.
	Resolver *net.Resolver
	// Probe replaces the lookup through UpstreamDNS (tests); NoProbe
	// turns the probe off.
	Probe   aggregate.ProbeFunc
	NoProbe bool
	// TTL of pending chunks; drafts.DefaultTTL (or TTLEnv) when zero.
	TTL time.Duration
	// Analyser is the mechanistic one when nil.
	Analyser propose.Analyser
}

// Service is one sandbox's advisor. Its methods are safe for concurrent
// use.
type Service struct {
	cfg   Config
	log   *slog.Logger
	agg   *aggregate.Aggregator
	store *drafts.FileStore
	an    propose.Analyser

	// mu serialises rounds and decisions, so an approval never races a
	// round that would supersede the draft being approved.
	mu  sync.Mutex
	gen uint64
	// handled are chunk ids already offered, duplicated or refused since
	// the store last changed otherwise: a repeated round skips them
	// without a check.
	handled map[string]bool
	// before holds, per approved draft, the network_policies entry its key
	// had before the approval (nil: none), for undo.
	before map[string]*policy.NetworkPolicy
	// expired are the expired drafts already audited.
	expired map[string]bool

	// advice maps a denial key to its pending chunk, for the 403s and the
	// denial events; read on the proxy's path without a lock.
	advice atomic.Pointer[map[aggregate.Key]string]
}

// New opens the store and the aggregator. Observe must be registered with
// the sandbox's audit logger (New does it) and Run started.
func New(cfg Config) (*Service, error) {
	if cfg.Reloader == nil {
		return nil, errors.New("advisor: no policy reloader")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.TTL == 0 {
		if v := os.Getenv(TTLEnv); v != "" {
			ttl, err := time.ParseDuration(v)
			if err != nil || ttl <= 0 {
				return nil, fmt.Errorf("advisor: %s=%q: want a positive duration", TTLEnv, v)
			}
			cfg.TTL = ttl
		}
	}
	store, err := drafts.Open(cfg.Dir, drafts.Options{TTL: cfg.TTL})
	if err != nil {
		return nil, fmt.Errorf("advisor: %w", err)
	}
	probe := cfg.Probe
	if probe == nil && !cfg.NoProbe {
		probe = lookup(cfg.Resolver)
	}
	s := &Service{
		cfg: cfg, log: cfg.Log, store: store, an: cfg.Analyser,
		agg:     aggregate.New(aggregate.Config{Probe: probe}),
		handled: map[string]bool{},
		before:  map[string]*policy.NetworkPolicy{},
		expired: map[string]bool{},
	}
	if s.an == nil {
		s.an = &propose.Mechanistic{TrustedCIDRs: cfg.TrustedCIDRs}
	}
	// One read of the store gives the advice for denials and the drafts
	// that expired under an earlier supervisor, which audited them.
	list, err := store.List()
	if err != nil {
		return nil, fmt.Errorf("advisor: %w", err)
	}
	s.setAdvice(list)
	for _, d := range list {
		if d.State == drafts.Expired {
			s.expired[d.ID] = true
		}
	}
	if cfg.Audit != nil {
		cfg.Audit.Observe(s.Observe)
	}
	return s, nil
}

func lookup(res *net.Resolver) aggregate.ProbeFunc {
	if res == nil {
		res = net.DefaultResolver
	}
	return func(ctx context.Context, host string) ([]netip.Addr, error) {
		// Rooted, so search domains cannot turn the name into another.
		return res.LookupNetIP(ctx, "ip", strings.TrimSuffix(host, ".")+".")
	}
}

// Store is the sandbox's draft store.
func (s *Service) Store() drafts.Store { return s.store }

// Aggregator is the sandbox's denial aggregator.
func (s *Service) Aggregator() *aggregate.Aggregator { return s.agg }

// Close stops the probes.
func (s *Service) Close() { s.agg.Close() }

// Observe folds one audit event into the aggregator. It runs on the
// proxy's path (audit.Logger.Observe): a few map operations, no I/O but
// one read of /proc for a key not seen before.
func (s *Service) Observe(e audit.Event) {
	switch ev := e.(type) {
	case audit.NetConnectEvent:
		learned := ev.Outcome == audit.OutcomeAllowed && ev.Decision == audit.DecisionLearn
		if ev.Outcome != audit.OutcomeDenied && !learned {
			return
		}
		r := connectRequest(ev)
		reason := ev.Reason
		if learned {
			reason = egress.ReasonNoPolicy
		}
		pid := ev.PID
		s.agg.RecordConnect(r, egress.Decision{Reason: reason, Detail: ev.Detail}, func() []string { return cmdline(pid) }, 0)
	case audit.NetDNSDeniedEvent:
		if ev.Reason == "not_allowed" {
			s.agg.RecordDNS(ev.Name, 1, 0)
		}
	case audit.HTTPRequestEvent:
		if !ev.WouldDeny && !s.audited(ev.Policy) {
			return
		}
		r := egress.Request{Host: ev.Host, Port: ev.Port, Via: ev.Via, Identity: egress.Identity{Binary: ev.Binary, PID: ev.PID}}
		if ip, err := netip.ParseAddr(ev.Host); err == nil {
			r.Host, r.IP = "", ip
		}
		d := egress.HTTPDecision{Allow: ev.Decision == "allow", Audit: ev.WouldDeny, Policy: ev.Policy, Reason: ev.Reason}
		s.agg.RecordHTTP(r, egress.HTTPRequest{Method: ev.Method, Path: ev.Path}, d)
	}
}

// audited reports whether the network policy named has an endpoint in
// enforcement: audit, whose requests are the samples of a refined chunk.
func (s *Service) audited(name string) bool {
	if name == "" {
		return false
	}
	np, ok := s.cfg.Reloader.Current().Policy.Policy.NetworkPolicies[name]
	return ok && slices.ContainsFunc(np.Endpoints, func(ep policy.Endpoint) bool {
		return ep.Enforcement == policy.EnforcementAudit
	})
}

func connectRequest(ev audit.NetConnectEvent) egress.Request {
	r := egress.Request{Host: ev.Host, Port: ev.Port, Via: ev.Via,
		Identity: egress.Identity{Binary: ev.Binary, PID: ev.PID}}
	if r.Host == "" {
		r.IP, _ = netip.ParseAddr(ev.IP)
	}
	return r
}

// cmdline reads a process's command line; nothing if it has gone.
func cmdline(pid int) []string {
	if pid <= 0 {
		return nil
	}
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(string(bytes.TrimRight(b, "\x00")), "\x00")
}

// Run proposes chunks as denials change and expires pending ones, until
// ctx ends.
func (s *Service) Run(ctx context.Context) {
	wake, cancel := s.agg.Subscribe()
	defer cancel()
	tick := time.NewTicker(s.expireEvery())
	defer tick.Stop()
	// Denials recorded before the subscription woke nobody.
	s.round(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-wake:
			s.round(ctx)
			// Denials arriving meanwhile are taken together next round.
			select {
			case <-ctx.Done():
				return
			case <-time.After(minRound):
			}
		case <-tick.C:
			s.Expire()
		}
	}
}

func (s *Service) expireEvery() time.Duration {
	ttl := cmp.Or(s.cfg.TTL, drafts.DefaultTTL)
	return min(max(ttl/10, 100*time.Millisecond), 5*time.Second)
}

// round proposes for every key changed since the last round.
func (s *Service) round(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var changed []aggregate.Entry
	changed, s.gen = s.agg.Changes(s.gen)
	if len(changed) == 0 {
		return
	}
	obs := make([]propose.Observation, len(changed))
	for i, e := range changed {
		obs[i] = propose.Observation{Entry: e}
	}
	s.offer(ctx, obs)
}

// offer proposes for obs and stores what validates. Called with mu held.
func (s *Service) offer(ctx context.Context, obs []propose.Observation) []drafts.Draft {
	chunks, err := s.an.Propose(ctx, obs)
	if err != nil {
		s.log.Warn("policy advisor: proposing failed", "err", err)
	}
	var out []drafts.Draft
	cur := s.cfg.Reloader.Current().Policy.Policy
	for _, c := range chunks {
		if s.handled[c.ID] {
			continue
		}
		s.handled[c.ID] = true
		res := check.Chunk(ctx, cur, c, check.Options{Rules: s.cfg.Rules, Replace: s.replaceable(cur, c.Name)})
		if res.Verdict == check.Invalid {
			s.log.Info("policy advisor: chunk not offered", "policy", c.Name, "reason", res.Reason)
			s.event(audit.PolicyProposalRefusedEvent{Author: c.Author, Policy: c.Name, Reason: res.Reason})
			continue
		}
		d, err := s.store.Add(c, res, drafts.System)
		switch {
		case err == nil:
			out = append(out, d)
			s.event(draftEvent(audit.DraftProposed, d, drafts.System, ""))
			s.log.Info("policy advisor: new draft; review with corral draft show "+d.ID, "draft", d.ID, "allows", res.Summary.String(), "verdict", res.Verdict)
		case errors.Is(err, drafts.ErrDuplicate), errors.Is(err, drafts.ErrRejected), errors.Is(err, drafts.ErrBackoff):
			s.log.Debug("policy advisor: chunk not stored", "policy", c.Name, "err", err)
		default:
			// Too many pending, or the store failed: try again later.
			delete(s.handled, c.ID)
			s.log.Warn("policy advisor: chunk not stored", "policy", c.Name, "err", err)
		}
	}
	if len(out) > 0 {
		s.refreshAll()
	}
	return out
}

// replaceable lists name when the policy in force has it from an advisor
// draft approved before: a refined chunk replaces it.
func (s *Service) replaceable(cur *policy.Policy, name string) []string {
	if _, ok := cur.NetworkPolicies[name]; ok && strings.HasPrefix(name, propose.NamePrefix) {
		return []string{name}
	}
	return nil
}

// Expire expires pending drafts past their time and audits each expiry
// once, whichever call to the store (this one, a listing) expired it.
func (s *Service) Expire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	list, err := s.store.List()
	if err != nil {
		s.log.Warn("policy advisor: expire drafts", "err", err)
		return
	}
	n := 0
	for _, d := range list {
		if d.State == drafts.Expired && !s.expired[d.ID] {
			s.expired[d.ID] = true
			s.event(draftEvent(audit.DraftExpired, d, drafts.System, "not decided in time"))
			n++
		}
	}
	if n > 0 {
		s.forget()
		s.refreshAll()
	}
}

// forget lets chunks already handled be offered again: the store has
// changed in a way (expiry, rejection, retry, undo) that may make room for
// them. Called with mu held.
func (s *Service) forget() { clear(s.handled) }

func (s *Service) refreshAll() {
	if err := s.refreshAdvice(); err != nil {
		s.log.Warn("policy advisor: read drafts", "err", err)
	}
}

// refreshAdvice rebuilds the denial → pending chunk map.
func (s *Service) refreshAdvice() error {
	list, err := s.store.List()
	if err != nil {
		return err
	}
	s.setAdvice(list)
	return nil
}

// setAdvice maps each denial to the pending chunk, of list (newest
// first), that would allow it.
func (s *Service) setAdvice(list []drafts.Draft) {
	m := map[aggregate.Key]string{}
	for _, d := range slices.Backward(list) { // oldest first: newer ones win
		if d.State != drafts.Pending {
			continue
		}
		for _, k := range d.Chunk.Denials {
			m[k] = d.ID
		}
		for _, w := range d.Chunk.Wants {
			m[aggregate.Key{Host: w.Host, Port: w.Port, Binary: w.Binary}] = d.ID
		}
	}
	s.advice.Store(&m)
}

// For implements egress.Advice.
func (s *Service) For(r egress.Request) (string, []string) {
	k := aggregate.Key{Host: r.Host, Port: r.Port, Binary: r.Identity.Binary}
	if k.Host == "" {
		k.Host = r.IP.Unmap().String()
	}
	id := (*s.advice.Load())[k]
	if id == "" {
		if r.Host == "" {
			if class, internal := netclass.Classify(r.IP); internal && netclass.NeverAllowed(class) {
				return "", []string{"no policy can open " + r.IP.String() + ": " + netclass.Reason(class)}
			}
		}
		return "", []string{
			"where a policy chunk can allow this, corral proposes one within a second: GET http://policy.local/v1/drafts lists it",
			"or POST a narrower one to http://policy.local/v1/proposals (see GET http://policy.local/v1/skill)",
			"a person approves it with corral draft approve",
		}
	}
	return id, []string{
		"pending policy chunk " + id + " would allow this: GET http://policy.local/v1/drafts shows it",
		"ask a person to run: corral draft approve " + id,
		"or POST a narrower proposal to http://policy.local/v1/proposals and wait on it",
	}
}

var _ egress.Advice = (*Service)(nil)

// ErrFlagged: approve --all leaves chunks with security notes to a
// person's explicit choice.
var ErrFlagged = errors.New("the chunk has security notes: approve it by id, or pass --include-flagged")

// Approve re-checks a pending draft against the policy in force, reloads
// the sandbox with it and records the version it went live in. A reload
// that fails leaves the draft pending and says why.
func (s *Service) Approve(ctx context.Context, id string, by drafts.Actor, reason string) (drafts.Draft, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.approve(ctx, id, by, reason)
}

func (s *Service) approve(ctx context.Context, id string, by drafts.Actor, reason string) (drafts.Draft, error) {
	d, err := s.store.Get(id)
	if err != nil {
		return d, err
	}
	if d.State != drafts.Pending {
		return d, fmt.Errorf("%w: %s is %s", drafts.ErrState, id, d.State)
	}
	cur := s.cfg.Reloader.Current().Policy.Policy
	var replace []string
	if d.Replaces != "" {
		replace = s.replaceable(cur, d.Chunk.Name)
	}
	res := check.Chunk(ctx, cur, d.Chunk, check.Options{Rules: s.cfg.Rules, Replace: replace})
	if res.Verdict == check.Invalid {
		return d, fmt.Errorf("draft %s no longer fits the policy in force and stays pending: %s", id, res.Reason)
	}
	var prev *policy.NetworkPolicy
	if np, ok := cur.NetworkPolicies[d.Chunk.Name]; ok {
		prev = &np
	}
	if err := s.cfg.Reloader.Apply(res.Merged, "draft:"+id); err != nil {
		return d, fmt.Errorf("draft %s stays pending: the reload failed: %w", id, err)
	}
	snap := s.cfg.Reloader.Current()
	if d, err = s.store.Approve(id, by, reason); err != nil {
		return d, err
	}
	s.before[id] = prev
	if d, err = s.store.MarkLoaded(id, snap.Version, snap.Policy.SHA256); err != nil {
		return d, err
	}
	ev := draftEvent(audit.DraftApproved, d, by, reason)
	ev.Version, ev.PolicySHA256 = snap.Version, snap.Policy.SHA256
	s.event(ev)
	s.refreshAll()
	return d, nil
}

// ApproveResult is one draft's outcome in ApproveAll.
type ApproveResult struct {
	Draft drafts.Draft `json:"draft"`
	Error string       `json:"error,omitempty"`
}

// ApproveAll approves every pending draft, those with security notes
// only when includeFlagged is set.
func (s *Service) ApproveAll(ctx context.Context, includeFlagged bool, by drafts.Actor) ([]ApproveResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	list, err := s.store.List()
	if err != nil {
		return nil, err
	}
	var out []ApproveResult
	for _, d := range slices.Backward(list) {
		if d.State != drafts.Pending {
			continue
		}
		if !includeFlagged && flagged(d) {
			out = append(out, ApproveResult{Draft: d, Error: ErrFlagged.Error()})
			continue
		}
		got, err := s.approve(ctx, d.ID, by, "approve --all")
		r := ApproveResult{Draft: got}
		if err != nil {
			r.Error = err.Error()
		}
		out = append(out, r)
	}
	return out, nil
}

func flagged(d drafts.Draft) bool {
	return len(d.Chunk.SecurityNotes) > 0 || len(d.Check.Flags) > 0
}

// Reject rejects a pending draft; guidance goes back to an agent waiting
// on it.
func (s *Service) Reject(id string, by drafts.Actor, reason, guidance string) (drafts.Draft, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, err := s.store.Reject(id, by, reason, guidance)
	if err != nil {
		return d, err
	}
	s.event(draftEvent(audit.DraftRejected, d, by, reason))
	s.forget()
	s.refreshAll()
	return d, nil
}

// Undo takes an approved draft's addition out of the policy in force (its
// network_policies entry goes back to what it was before the approval),
// which closes the connections it allowed, and marks it undone.
func (s *Service) Undo(ctx context.Context, id string, by drafts.Actor, reason string) (drafts.Draft, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, err := s.store.Get(id)
	if err != nil {
		return d, err
	}
	if d.State != drafts.Approved {
		return d, fmt.Errorf("%w: %s is %s", drafts.ErrState, id, d.State)
	}
	prev, ok := s.before[id]
	if !ok {
		return d, fmt.Errorf("draft %s was approved before this supervisor started; remove network_policies.%s with corral policy set", id, d.Chunk.Name)
	}
	next, err := without(s.cfg.Reloader.Current().Policy.Policy, d.Chunk.Name, prev)
	if err != nil {
		return d, fmt.Errorf("undo draft %s: %w", id, err)
	}
	if err := s.cfg.Reloader.Apply(next, "undo:"+id); err != nil {
		return d, fmt.Errorf("undo draft %s: the reload failed, the policy is unchanged: %w", id, err)
	}
	snap := s.cfg.Reloader.Current()
	if d, err = s.store.Undo(id, by, cmp.Or(reason, fmt.Sprintf("restored as policy version %d", snap.Version))); err != nil {
		return d, err
	}
	delete(s.before, id)
	ev := draftEvent(audit.DraftUndone, d, by, reason)
	ev.Version, ev.PolicySHA256 = snap.Version, snap.Policy.SHA256
	s.event(ev)
	s.forget()
	s.refreshAll()
	return d, nil
}

// without returns p with network_policies[name] set back to prev, or
// removed when prev is nil.
func without(p *policy.Policy, name string, prev *policy.NetworkPolicy) (*policy.Policy, error) {
	base, err := yaml.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("encode the policy: %w", err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(base, &doc); err != nil {
		return nil, fmt.Errorf("decode the policy: %w", err)
	}
	nps, _ := doc["network_policies"].(map[string]any)
	if prev != nil {
		nps[name] = *prev
	} else {
		delete(nps, name)
	}
	data, err := yaml.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("encode the policy: %w", err)
	}
	return policy.ParseOnto(data, "undo", nil)
}

// Retry lifts the rejection backoff for host:port and proposes for its
// denials again.
func (s *Service) Retry(ctx context.Context, host string, port uint16, by drafts.Actor) ([]drafts.Draft, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.store.Retry(host, port, by); err != nil {
		return nil, err
	}
	s.forget()
	var obs []propose.Observation
	for _, e := range s.agg.Snapshot() {
		if e.Host == host && (e.Port == port || e.Port == 0) {
			obs = append(obs, propose.Observation{Entry: e})
		}
	}
	return s.offer(ctx, obs), nil
}

// Refine proposes a refined chunk for the denials a draft answers from
// the requests seen so far, however few.
func (s *Service) Refine(ctx context.Context, id string) ([]drafts.Draft, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, err := s.store.Get(id)
	if err != nil {
		return nil, err
	}
	var obs []propose.Observation
	for _, k := range d.Chunk.Denials {
		if e, ok := s.agg.Get(k); ok && len(e.Samples) > 0 {
			obs = append(obs, propose.Observation{Entry: e, Refine: true})
		}
	}
	if len(obs) == 0 {
		return nil, fmt.Errorf("draft %s: no HTTP requests seen yet to refine it from (approve it first: its audit mode records them)", id)
	}
	out := s.offer(ctx, obs)
	if len(out) == 0 {
		return nil, fmt.Errorf("draft %s: the refined chunk is the same as one already proposed, or not valid (see corral draft)", id)
	}
	return out, nil
}

// Check validates an addition against the policy in force as an agent's
// proposal would be, without storing anything.
func (s *Service) Check(ctx context.Context, add map[string]policy.NetworkPolicy, binary string) check.Result {
	cur := s.cfg.Reloader.Current().Policy.Policy
	return check.Addition(ctx, cur, add, s.wants(add, binary), check.Options{Rules: s.cfg.Rules})
}

// Propose stores an agent's chunk as a pending draft when it validates
// like the advisor's own; it never changes the policy. The requests it
// must answer are the denials seen for its endpoints (for binary, when
// the caller is known).
func (s *Service) Propose(ctx context.Context, add map[string]policy.NetworkPolicy, intent, binary string) (drafts.Draft, check.Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(add) != 1 {
		return drafts.Draft{}, check.Result{}, fmt.Errorf("a proposal adds exactly one network_policies entry, not %d", len(add))
	}
	var name string
	var np policy.NetworkPolicy
	for name, np = range add {
	}
	wants := s.wants(add, binary)
	cur := s.cfg.Reloader.Current().Policy.Policy
	res := check.Addition(ctx, cur, add, wants, check.Options{Rules: s.cfg.Rules})
	if res.Verdict == check.Invalid {
		s.event(audit.PolicyProposalRefusedEvent{Author: propose.AuthorAgent, Policy: name, Reason: res.Reason, Binary: binary})
		return drafts.Draft{}, res, fmt.Errorf("proposal refused: %s", res.Reason)
	}
	c := propose.Chunk{
		ID: propose.Fingerprint(name, np, propose.StageInitial, propose.AuthorAgent), Name: name, Policy: np,
		Rationale: "proposed by the agent: " + cmp.Or(intent, "(no intent given)"), SecurityNotes: res.Flags,
		Confidence: 0.5, Wants: wants, Stage: propose.StageInitial, Author: propose.AuthorAgent, Intent: intent,
	}
	for _, w := range wants {
		k := aggregate.Key{Host: w.Host, Port: w.Port, Binary: w.Binary}
		if !slices.Contains(c.Denials, k) {
			c.Denials = append(c.Denials, k)
		}
	}
	d, err := s.store.Add(c, res, drafts.Actor{UID: -1, User: "agent"})
	if err != nil {
		return d, res, err
	}
	s.event(draftEvent(audit.DraftProposed, d, drafts.Actor{UID: -1, User: "agent"}, intent))
	s.refreshAll()
	return d, res, nil
}

// wants are the denied connections an agent's addition answers: those
// seen for its endpoints' hosts and ports, from binary when given.
func (s *Service) wants(add map[string]policy.NetworkPolicy, binary string) []propose.Want {
	var out []propose.Want
	for _, e := range s.agg.Snapshot() {
		if e.Port == 0 || binary != "" && e.Binary != binary {
			continue
		}
		for _, np := range add {
			for _, ep := range np.Endpoints {
				if strings.EqualFold(ep.Host, e.Host) && slices.Contains(ep.PortList(), int(e.Port)) {
					out = append(out, propose.Want{Host: e.Host, Port: e.Port, Binary: e.Binary})
				}
			}
		}
	}
	return out
}

// Denials returns the last n aggregated denials, most recent first.
func (s *Service) Denials(n int) []aggregate.Entry {
	all := s.agg.Snapshot()
	if n > 0 && len(all) > n {
		all = all[:n]
	}
	return all
}

func (s *Service) event(e audit.Event) {
	if s.cfg.Audit != nil {
		s.cfg.Audit.Log(e)
	}
}

func draftEvent(name string, d drafts.Draft, by drafts.Actor, reason string) audit.DraftEvent {
	return audit.DraftEvent{
		Name: name, Draft: d.ID, Policy: d.Chunk.Name, Author: d.Chunk.Author, Stage: int(d.Chunk.Stage),
		Verdict: string(d.Check.Verdict), Summary: d.Check.Summary.String(), Actor: by.User, Reason: reason,
	}
}
