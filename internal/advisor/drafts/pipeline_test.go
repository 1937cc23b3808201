package drafts

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/advisor/aggregate"
	"github.com/corral-sandbox/corral/internal/advisor/check"
	"github.com/corral-sandbox/corral/internal/advisor/propose"
	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/egress/decide"
	"github.com/corral-sandbox/corral/internal/policy"
)

// The whole advisor as the supervisor wires it: denials → aggregator →
// mechanistic chunks → check → store → approval → the merged policy is
// what the engine enforces; then audited requests → refined chunk that
// replaces the approved one and refuses a write.
func TestPipeline(t *testing.T) {
	ctx := context.Background()
	cur, err := policy.Parse([]byte("version: 1\nnetwork_policies:\n  git:\n    endpoints: [{host: github.com, port: 443}]\n    binaries: [{path: /usr/bin/git}]\n"), "test")
	if err != nil {
		t.Fatal(err)
	}
	agg := aggregate.New(aggregate.Config{Probe: func(context.Context, string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("203.0.113.10")}, nil
	}})
	defer agg.Close()
	store, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	adv := &propose.Mechanistic{}
	curl := egress.Request{Host: "api.example.com", Port: 443, Identity: egress.Identity{Binary: "/usr/bin/curl"}, SniffedKind: "tls_sni"}

	// offer runs one round of the advisor over what changed.
	var gen uint64
	offer := func(refine bool) []Draft {
		t.Helper()
		var changed []aggregate.Entry
		changed, gen = agg.Changes(gen)
		var obs []propose.Observation
		for _, e := range changed {
			obs = append(obs, propose.Observation{Entry: e, Refine: refine})
		}
		chunks, err := adv.Propose(ctx, obs)
		if err != nil {
			t.Fatal(err)
		}
		var out []Draft
		for _, c := range chunks {
			var replace []string
			if _, ok := cur.NetworkPolicies[c.Name]; ok {
				replace = []string{c.Name}
			}
			res := check.Chunk(ctx, cur, c, check.Options{Replace: replace})
			if res.Verdict == check.Invalid {
				t.Fatalf("advisor chunk invalid: %s", res.Reason)
			}
			d, err := store.Add(c, res, System)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, d)
		}
		return out
	}
	approve := func(d Draft) *decide.Engine {
		t.Helper()
		var replace []string
		if d.Replaces != "" {
			replace = []string{d.Chunk.Name}
		}
		res := check.Chunk(ctx, cur, d.Chunk, check.Options{Replace: replace})
		if res.Merged == nil {
			t.Fatalf("recheck at approval: %s", res.Reason)
		}
		comp, err := res.Merged.Compile()
		if err != nil {
			t.Fatal(err)
		}
		eng, err := decide.New(comp, nil)
		if err != nil {
			t.Fatal(err)
		}
		cur = res.Merged
		if _, err := store.Approve(d.ID, alice, ""); err != nil {
			t.Fatal(err)
		}
		if _, err := store.MarkLoaded(d.ID, 2, comp.SHA256); err != nil {
			t.Fatal(err)
		}
		return eng
	}

	agg.RecordConnect(curl, egress.Decision{Reason: egress.ReasonNoPolicy}, func() []string { return []string{"curl", "https://api.example.com/v1/items"} }, 0)
	deadline := time.Now().Add(5 * time.Second)
	for e, _ := agg.Get(aggregate.Key{Host: "api.example.com", Port: 443, Binary: "/usr/bin/curl"}); !e.Probe.Done; e, _ = agg.Get(e.Key) {
		if time.Now().After(deadline) {
			t.Fatal("probe did not finish")
		}
		time.Sleep(time.Millisecond)
	}
	first := offer(false)
	if len(first) != 1 || first[0].Chunk.Stage != propose.StageInitial || first[0].Check.Verdict != check.Broad {
		t.Fatalf("first round: %+v", first)
	}
	eng := approve(first[0])
	if d := eng.Decide(ctx, curl); !d.Allow || !d.Inspect {
		t.Fatalf("after stage 1 approval: %+v", d)
	}

	// Audited traffic: reads only.
	for _, p := range []string{"/v1/items", "/v1/items/1", "/v1/items/2", "/v1/items/3", "/v1/items/4"} {
		h := egress.HTTPRequest{Method: "GET", Path: p}
		agg.RecordHTTP(curl, h, eng.DecideHTTP(ctx, curl, h))
	}
	second := offer(false)
	if len(second) != 1 || second[0].Chunk.Stage != propose.StageRefined || second[0].Replaces != first[0].ID || second[0].Check.Verdict != check.Narrow {
		t.Fatalf("second round: %+v", second)
	}
	eng = approve(second[0])
	if got, _ := store.Get(first[0].ID); got.State != Superseded {
		t.Errorf("stage 1 draft is %s, want superseded", got.State)
	}
	if d := eng.DecideHTTP(ctx, curl, egress.HTTPRequest{Method: "GET", Path: "/v1/items/9"}); !d.Allow {
		t.Errorf("read after refinement: %+v", d)
	}
	if d := eng.DecideHTTP(ctx, curl, egress.HTTPRequest{Method: "POST", Path: "/v1/items"}); d.Allow || d.Audit {
		t.Errorf("write after refinement: %+v, want refused", d)
	}
	if _, ok := cur.NetworkPolicies["git"]; !ok || len(cur.NetworkPolicies) != 2 {
		t.Errorf("policy after two approvals: %v", cur.NetworkPolicies)
	}
}
