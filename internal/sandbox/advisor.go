package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os/user"
	"path/filepath"
	"strconv"
	"time"

	"github.com/corral-sandbox/corral/internal/advisor/drafts"
	"github.com/corral-sandbox/corral/internal/advisor/policylocal"
	"github.com/corral-sandbox/corral/internal/advisor/service"
	"github.com/corral-sandbox/corral/internal/control"
	"github.com/corral-sandbox/corral/internal/egress"
)

// DraftsDir is where a session's drafts are kept: under the state
// directory, by session, so they outlive one supervisor.
func DraftsDir(stateDir, session string) string {
	return filepath.Join(stateDir, "sessions", session, "drafts")
}

// startAdvisor starts the sandbox's policy advisor, which reads its audit
// events, until ctx ends, and has the egress answer policy.local with it
// and name its drafts in refusals; call it before the egress starts. A
// sandbox without one still runs; only drafts are lost.
func (s *supervisor) startAdvisor(ctx context.Context) {
	// The DNS probe asks the upstream resolver about names no policy
	// allows, which the sandbox's own DNS server never does so that DNS
	// cannot carry data out; only in learn mode, where those names are
	// resolved upstream for the connections anyway, does it leak nothing
	// new. Elsewhere it takes --advisor-probe.
	probe := s.Policy.Current().Policy.Policy.Network.Learn || s.AdvisorProbe
	svc, err := service.New(service.Config{
		Dir: DraftsDir(s.StateDir, s.Session), Reloader: s.Policy, Audit: s.Audit, Log: s.Log,
		Rules: s.egress.Rules(), TrustedCIDRs: s.TrustedCIDRs, Resolver: s.egress.Resolver(), NoProbe: !probe,
	})
	if err != nil {
		s.Log.Warn("policy advisor unavailable: denials will not become drafts", "err", err)
		return
	}
	s.adv.Store(svc)
	s.egress.SetAdvice(svc)
	s.egress.AddService(policylocal.Host, &policylocal.Handler{Advisor: svc, Policy: s.Policy, Identify: egress.RequestFrom})
	go func() {
		svc.Run(ctx)
		s.adv.Store(nil)
		svc.Close()
	}()
}

func (s *supervisor) advisor() (*service.Service, error) {
	svc := s.adv.Load()
	if svc == nil {
		return nil, errors.New("this sandbox has no policy advisor (it runs without proxy networking, or the advisor failed to start: see its log)")
	}
	return svc, nil
}

// Draft implements control.DraftHandler.
func (s *supervisor) Draft(ctx context.Context, op string, a control.DraftArgs, by control.Peer) (any, error) {
	svc, err := s.advisor()
	if err != nil {
		return nil, err
	}
	who := actor(by)
	store := svc.Store()
	switch op {
	case control.OpDraftList:
		return details(svc)
	case control.OpDraftShow:
		if len(a.IDs) != 1 {
			return nil, errors.New("show takes one draft id")
		}
		d, err := store.Get(a.IDs[0])
		if err != nil {
			return nil, err
		}
		return DraftDetail{Draft: d, History: d.History, Entries: entries(svc, d)}, nil
	case control.OpDraftApprove:
		if a.All {
			return svc.ApproveAll(ctx, a.IncludeFlagged, who)
		}
		var out []service.ApproveResult
		for _, id := range a.IDs {
			d, err := svc.Approve(ctx, id, who, a.Reason)
			r := service.ApproveResult{Draft: d}
			if err != nil {
				r.Error = err.Error()
			}
			out = append(out, r)
		}
		return out, nil
	case control.OpDraftReject:
		if len(a.IDs) != 1 {
			return nil, errors.New("reject takes one draft id")
		}
		return svc.Reject(a.IDs[0], who, a.Reason, a.Guidance)
	case control.OpDraftUndo:
		if len(a.IDs) != 1 {
			return nil, errors.New("undo takes one draft id")
		}
		return svc.Undo(ctx, a.IDs[0], who, a.Reason)
	case control.OpDraftHistory:
		return store.History()
	case control.OpDraftRetry:
		return svc.Retry(ctx, a.Host, a.Port, who)
	case control.OpDraftRefine:
		if len(a.IDs) != 1 {
			return nil, errors.New("refine takes one draft id")
		}
		return svc.Refine(ctx, a.IDs[0])
	case control.OpDraftWatch:
		ch, cancel := store.Subscribe()
		defer cancel()
		wait := min(time.Duration(a.WaitMS)*time.Millisecond, control.MaxWatch)
		select {
		case <-ch:
		case <-time.After(wait):
		case <-ctx.Done():
		}
		return details(svc)
	}
	return nil, fmt.Errorf("unknown operation %q", op)
}

// DraftDetail is what draft.show answers: the draft and the denials it
// answers as the aggregator holds them.
type DraftDetail struct {
	drafts.Draft
	History []drafts.Transition  `json:"history"`
	Entries []policylocal.Denial `json:"denials_seen"`
}

func details(svc *service.Service) ([]DraftDetail, error) {
	list, err := svc.Store().List()
	if err != nil {
		return nil, err
	}
	out := make([]DraftDetail, len(list))
	for i, d := range list {
		out[i] = DraftDetail{Draft: d, History: d.History, Entries: entries(svc, d)}
	}
	return out, nil
}

func entries(svc *service.Service, d drafts.Draft) []policylocal.Denial {
	var out []policylocal.Denial
	for _, k := range d.Chunk.Denials {
		if e, ok := svc.Aggregator().Get(k); ok {
			out = append(out, policylocal.DenialOf(e))
		}
	}
	return out
}

// actor names the control client for the drafts' history.
func actor(p control.Peer) drafts.Actor {
	a := drafts.Actor{UID: p.UID, User: strconv.Itoa(p.UID)}
	if u, err := user.LookupId(strconv.Itoa(p.UID)); err == nil {
		a.User = u.Username
	}
	return a
}
