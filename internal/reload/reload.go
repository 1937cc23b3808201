// Package reload owns a running sandbox's policy: its version, the rule
// that a reload leaves the sections fixed at start alone, last-known-good,
// and the snapshot (compiled policy, decider, secrets) that every
// connection and every request loads once. The control socket, and later
// the gateway and the advisor, are front ends that call Set.
package reload

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/l7/secrets"
	"github.com/corral-sandbox/corral/internal/policy"
)

// Decider decides connections and the requests of inspected ones.
type Decider interface {
	egress.Decider
	egress.HTTPDecider
}

// Snapshot is one version of the policy in force. It is immutable: a
// request decided with its Decider has its secrets swapped and scrubbed
// with its Secrets, so no reload can land between the two.
type Snapshot struct {
	// Version is 1 for the policy the sandbox started with.
	Version int
	Policy  *policy.Compiled
	// Decider is nil when the sandbox has no egress (block or allow
	// mode); Secrets is nil when the policy has none.
	Decider Decider
	Secrets *secrets.Set
}

// Build makes the decider and secrets for c. prev is the snapshot in
// force, nil for the first: secrets keep their values and surrogates
// across versions, and only their scopes move.
type Build func(c *policy.Compiled, prev *Snapshot) (Decider, *secrets.Set, error)

// Reloader holds the snapshot in force and makes the next one.
type Reloader struct {
	build Build
	audit *audit.Logger
	log   *slog.Logger

	// mu serialises reloads; readers never take it.
	mu  sync.Mutex
	cur atomic.Pointer[Snapshot]
	// swapped run after each reload, in order (e.g. re-deciding open
	// tunnels under the new snapshot).
	swapped []func(context.Context)
}

// New puts c in force as version 1. build may be nil for a sandbox
// without egress; the snapshot then has only the policy.
func New(c *policy.Compiled, build Build, aud *audit.Logger, log *slog.Logger) (*Reloader, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Reloader{build: build, audit: aud, log: log}
	snap, err := r.next(c, nil)
	if err != nil {
		return nil, err
	}
	r.cur.Store(snap)
	return r, nil
}

// OnSwap registers f to run after every successful reload.
func (r *Reloader) OnSwap(f func(context.Context)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.swapped = append(r.swapped, f)
}

// Current returns the snapshot in force.
func (r *Reloader) Current() *Snapshot { return r.cur.Load() }

// Set parses yaml onto the running policy (sections the file leaves out
// stay as they run, unless it says extends: none) and puts it in force.
// A policy that fails validation, changes a section fixed at start, or
// fails to build never replaces the one in force; the failure is audited
// and returned.
func (r *Reloader) Set(yaml []byte, source string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	prev := r.cur.Load()
	p, err := policy.ParseOnto(yaml, source, prev.Policy.Policy)
	if err != nil {
		return r.failed(prev, source, err)
	}
	return r.apply(prev, p, source)
}

// Apply puts p, a whole policy, in force under the same rules as Set.
func (r *Reloader) Apply(p *policy.Policy, source string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.apply(r.cur.Load(), p, source)
}

func (r *Reloader) apply(prev *Snapshot, p *policy.Policy, source string) error {
	if err := prev.Policy.Policy.CheckReload(p); err != nil {
		return r.failed(prev, source, err)
	}
	c, err := p.Compile()
	if err != nil {
		return r.failed(prev, source, err)
	}
	snap, err := r.next(c, prev)
	if err != nil {
		return r.failed(prev, source, fmt.Errorf("compile network policy: %w", err))
	}
	r.cur.Store(snap)
	for _, f := range r.swapped {
		f(context.Background())
	}
	r.event(audit.PolicyReloadedEvent{Source: source, Version: snap.Version, PolicySHA256: c.SHA256})
	r.log.Info("policy reloaded", "version", snap.Version, "sha256", c.SHA256)
	return nil
}

func (r *Reloader) next(c *policy.Compiled, prev *Snapshot) (*Snapshot, error) {
	if c == nil {
		return nil, errors.New("no policy")
	}
	snap := &Snapshot{Version: 1, Policy: c}
	if prev != nil {
		snap.Version = prev.Version + 1
	}
	if r.build != nil {
		var err error
		if snap.Decider, snap.Secrets, err = r.build(c, prev); err != nil {
			return nil, err
		}
	}
	return snap, nil
}

func (r *Reloader) failed(prev *Snapshot, source string, err error) error {
	r.event(audit.PolicyReloadFailedEvent{Source: source, Version: prev.Version + 1, Error: err.Error()})
	r.log.Warn("policy reload rejected; the running policy stays in force", "err", err)
	return err
}

func (r *Reloader) event(e audit.Event) {
	if r.audit != nil {
		r.audit.Log(e)
	}
}

// Decide implements egress.Decider with the snapshot in force.
func (r *Reloader) Decide(ctx context.Context, req egress.Request) egress.Decision {
	d := r.cur.Load().Decider
	if d == nil {
		return egress.Decision{Reason: egress.ReasonEngine, Detail: "the sandbox has no egress policy"}
	}
	return d.Decide(ctx, req)
}

// DecideHTTP implements egress.HTTPDecider with the snapshot in force.
func (r *Reloader) DecideHTTP(ctx context.Context, req egress.Request, h egress.HTTPRequest) egress.HTTPDecision {
	d := r.cur.Load().Decider
	if d == nil {
		return egress.HTTPDecision{Reason: egress.ReasonEngine, Detail: "the sandbox has no egress policy"}
	}
	return d.DecideHTTP(ctx, req, h)
}

// NameAllowed implements egress.Decider with the snapshot in force.
func (r *Reloader) NameAllowed(host string) bool {
	d := r.cur.Load().Decider
	return d != nil && d.NameAllowed(host)
}
