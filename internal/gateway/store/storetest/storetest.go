// Package storetest is the conformance suite every store.Store backend must
// pass: the SQLite and PostgreSQL tests run the same functions against a
// real database.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/gateway/store"
)

// Run runs every behaviour of store.Store against stores made by open;
// each call of open must return a fresh, empty, migrated store that stays
// open until the test ends.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s store.Store)
	}{
		{"Sandboxes", testSandboxes},
		{"SandboxNamesUnique", testSandboxNames},
		{"ListSelector", testListSelector},
		{"Phases", testPhases},
		{"Policies", testPolicies},
		{"PolicyVersionsConcurrent", testPolicyVersionsConcurrent},
		{"Logs", testLogs},
		{"LogFilters", testLogFilters},
		{"LogDefaultLimit", testLogDefaultLimit},
		{"LogSeqNeverReused", testLogSeqNeverReused},
		{"LogFollowerMissesNothing", testLogFollower},
		{"LogOddText", testLogOddText},
		{"PruneLogs", testPruneLogs},
		{"DeleteCascades", testDeleteCascades},
		{"Tokens", testTokens},
		{"JoinTokens", testJoinTokens},
		{"JoinTokenSpentOnce", testJoinTokenSpentOnce},
		{"ClientCerts", testClientCerts},
		{"Secrets", testSecrets},
		{"Routes", testRoutes},
		{"TimesRoundTrip", testTimes},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, open(t))
		})
	}
}

// Migrations describes how to reach one backend's databases below the
// Store interface, for the upgrade tests.
type Migrations struct {
	// Latest is the newest schema version the binary knows.
	Latest int
	// New returns the location of a fresh, empty database.
	New func(t *testing.T) string
	// OpenAt opens loc, migrating it up to version (0 = every migration).
	OpenAt func(t *testing.T, loc string, version int) (store.Store, error)
	// Version reads the schema version recorded in loc.
	Version func(t *testing.T, loc string) int
	// MarkApplied records version as applied, as a newer binary would.
	MarkApplied func(t *testing.T, loc string, version int)
}

// RunMigrations checks migrating from an empty database, from every
// earlier version with rows in it, and refusing a newer one.
func RunMigrations(t *testing.T, m Migrations) {
	t.Run("FromEmpty", func(t *testing.T) {
		loc := m.New(t)
		s := openAt(t, m, loc, 0)
		fill(t, s)
		mustClose(t, s)
		if got := m.Version(t, loc); got != m.Latest {
			t.Fatalf("schema version after migrating: %d, want %d", got, m.Latest)
		}
		// Opening again applies nothing and keeps the rows.
		s = openAt(t, m, loc, 0)
		defer mustClose(t, s)
		checkFilled(t, s)
		if got := m.Version(t, loc); got != m.Latest {
			t.Fatalf("schema version after reopening: %d, want %d", got, m.Latest)
		}
	})
	for v := 1; v < m.Latest; v++ {
		t.Run(fmt.Sprintf("FromVersion%d", v), func(t *testing.T) {
			loc := m.New(t)
			s := openAt(t, m, loc, v)
			fill(t, s)
			mustClose(t, s)
			if got := m.Version(t, loc); got != v {
				t.Fatalf("schema version of the old database: %d, want %d", got, v)
			}
			s = openAt(t, m, loc, 0)
			defer mustClose(t, s)
			if got := m.Version(t, loc); got != m.Latest {
				t.Fatalf("schema version after upgrading: %d, want %d", got, m.Latest)
			}
			checkFilled(t, s)
		})
	}
	t.Run("NewerRefused", func(t *testing.T) {
		loc := m.New(t)
		mustClose(t, openAt(t, m, loc, 0))
		m.MarkApplied(t, loc, m.Latest+1)
		s, err := m.OpenAt(t, loc, 0)
		if err == nil {
			s.Close()
			t.Fatal("opened a database whose schema is newer than the binary")
		}
		if !strings.Contains(err.Error(), "newer") {
			t.Fatalf("error does not say the database is newer: %v", err)
		}
	})
}

func openAt(t *testing.T, m Migrations, loc string, version int) store.Store {
	t.Helper()
	s, err := m.OpenAt(t, loc, version)
	if err != nil {
		t.Fatalf("open at version %d: %v", version, err)
	}
	return s
}

func mustClose(t *testing.T, s store.Store) {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
}

// fill writes one row of every kind, checked by checkFilled.
func fill(t *testing.T, s store.Store) {
	t.Helper()
	ctx := context.Background()
	must(t, s.CreateSandbox(ctx, store.Sandbox{ID: "sb-old", Name: "old", Labels: map[string]string{"team": "a"}, Command: []string{"true"}}))
	if _, err := s.AddPolicy(ctx, "sb-old", []byte("version: 1\n"), "sha-1", "alice"); err != nil {
		t.Fatal(err)
	}
	must(t, s.AppendLogs(ctx, []store.LogEntry{{SandboxID: "sb-old", Level: "info", Source: "audit", Message: "old line"}}))
	must(t, s.AddToken(ctx, store.Token{ID: "tok-old", Name: "ci", Kind: store.TokenUser, Hash: "hash-old"}))
	must(t, s.AddToken(ctx, store.Token{ID: "join-old", Name: "host-b", Kind: store.TokenJoin, Hash: "hash-join-old"}))
	must(t, s.PutSecret(ctx, store.Secret{Name: "key-old", Sealed: []byte{1, 2, 3}}))
	if _, err := s.AddRoutes(ctx, []byte("routes: []\n"), "alice"); err != nil {
		t.Fatal(err)
	}
}

// checkFilled checks fill's rows survived and the tables still take writes.
func checkFilled(t *testing.T, s store.Store) {
	t.Helper()
	ctx := context.Background()
	sb, err := s.GetSandbox(ctx, "sb-old")
	if err != nil || sb.Labels["team"] != "a" {
		t.Fatalf("old sandbox: %+v, %v", sb, err)
	}
	p, err := s.Policy(ctx, "sb-old", 0)
	if err != nil || p.Version != 1 || string(p.YAML) != "version: 1\n" {
		t.Fatalf("old policy: %+v, %v", p, err)
	}
	if p2, err := s.AddPolicy(ctx, "sb-old", []byte("version: 2\n"), "sha-2", "bob"); err != nil || p2.Version != 2 {
		t.Fatalf("next policy after upgrade: %+v, %v", p2, err)
	}
	logs, err := s.QueryLogs(ctx, store.LogQuery{SandboxID: "sb-old"})
	if err != nil || len(logs) != 1 || logs[0].Message != "old line" {
		t.Fatalf("old logs: %+v, %v", logs, err)
	}
	next := []store.LogEntry{{SandboxID: "sb-old", Level: "info", Message: "new line"}}
	must(t, s.AppendLogs(ctx, next))
	if next[0].Seq <= logs[0].Seq {
		t.Fatalf("seq after upgrade %d not above the old %d", next[0].Seq, logs[0].Seq)
	}
	if tok, err := s.TokenByHash(ctx, "hash-old"); err != nil || tok.ID != "tok-old" {
		t.Fatalf("old token: %+v, %v", tok, err)
	}
	// A join token from before grants were recorded grants no secret.
	if tok, err := s.TokenByHash(ctx, "hash-join-old"); err != nil || tok.ID != "join-old" || len(tok.Secrets) != 0 {
		t.Fatalf("old join token: %+v, %v", tok, err)
	}
	must(t, s.AddToken(ctx, store.Token{ID: "join-new", Kind: store.TokenJoin, Hash: "hash-join-new", Secrets: []string{"key-old"}}))
	if tok, err := s.TokenByHash(ctx, "hash-join-new"); err != nil || !slices.Equal(tok.Secrets, []string{"key-old"}) {
		t.Fatalf("join token granting a secret after upgrade: %+v, %v", tok, err)
	}
	if sec, err := s.GetSecret(ctx, "key-old"); err != nil || !bytes.Equal(sec.Sealed, []byte{1, 2, 3}) {
		t.Fatalf("old secret: %+v, %v", sec, err)
	}
	if r, err := s.CurrentRoutes(ctx); err != nil || r.Version != 1 {
		t.Fatalf("old routes: %+v, %v", r, err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func wantErr(t *testing.T, err, target error, what string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: got %v, want an error wrapping %q", what, err, target)
	}
}

// A name is one sandbox's, also when creates race; empty names repeat,
// and a deleted sandbox's name is free again.
func testSandboxNames(t *testing.T, s store.Store) {
	ctx := context.Background()
	must(t, s.CreateSandbox(ctx, store.Sandbox{ID: "sb-a", Name: "agent"}))
	err := s.CreateSandbox(ctx, store.Sandbox{ID: "sb-b", Name: "agent"})
	wantErr(t, err, store.ErrExists, "a second sandbox named agent")
	if !strings.Contains(err.Error(), "sb-a") {
		t.Errorf("the refusal does not name the sandbox holding the name: %v", err)
	}
	must(t, s.CreateSandbox(ctx, store.Sandbox{ID: "sb-c"}))
	must(t, s.CreateSandbox(ctx, store.Sandbox{ID: "sb-d"}))
	must(t, s.DeleteSandbox(ctx, "sb-a"))
	must(t, s.CreateSandbox(ctx, store.Sandbox{ID: "sb-b", Name: "agent"}))

	var wg sync.WaitGroup
	var won atomic.Int32
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := s.CreateSandbox(ctx, store.Sandbox{ID: fmt.Sprintf("sb-race-%d", i), Name: "racer"})
			switch {
			case err == nil:
				won.Add(1)
			case !errors.Is(err, store.ErrExists):
				t.Errorf("racing create: %v", err)
			}
		}()
	}
	wg.Wait()
	if n := won.Load(); n != 1 {
		t.Errorf("%d racing creates of the name racer succeeded, want 1", n)
	}
}

func mkSandbox(t *testing.T, s store.Store, id string, labels map[string]string) {
	t.Helper()
	must(t, s.CreateSandbox(context.Background(), store.Sandbox{ID: id, Name: id, Labels: labels, Driver: "local"}))
}

// micro is how precisely the stores keep times.
func micro(tm time.Time) time.Time { return tm.Truncate(time.Microsecond) }

func testSandboxes(t *testing.T, s store.Store) {
	ctx := context.Background()
	created := time.Date(2026, 3, 4, 5, 6, 7, 891234567, time.FixedZone("X", 3600))
	in := store.Sandbox{
		ID:        "sb-1",
		Name:      "first",
		Labels:    map[string]string{"team": "infra", "env": "dev"},
		Command:   []string{"python3", "-c", "print('hi')"},
		Workdir:   "/work",
		Env:       []string{"A=1", "B=two words"},
		Driver:    "local",
		DriverRef: "pid=42",
		CreatedAt: created,
	}
	must(t, s.CreateSandbox(ctx, in))
	got, err := s.GetSandbox(ctx, "sb-1")
	must(t, err)
	if got.Phase != store.PhaseProvisioning {
		t.Errorf("new sandbox phase %q, want provisioning", got.Phase)
	}
	if got.ExitCode != nil {
		t.Errorf("new sandbox exit code %d, want none", *got.ExitCode)
	}
	if !got.CreatedAt.Equal(micro(created)) || !got.UpdatedAt.Equal(micro(created)) {
		t.Errorf("times %v / %v, want %v", got.CreatedAt, got.UpdatedAt, micro(created))
	}
	want := in
	want.Phase, want.CreatedAt, want.UpdatedAt = store.PhaseProvisioning, got.CreatedAt, got.UpdatedAt
	if !reflect.DeepEqual(got, want) {
		t.Errorf("round trip:\n got %+v\nwant %+v", got, want)
	}

	wantErr(t, s.CreateSandbox(ctx, store.Sandbox{ID: "sb-1"}), store.ErrExists, "duplicate id")
	_, err = s.GetSandbox(ctx, "nope")
	wantErr(t, err, store.ErrNotFound, "get unknown")
	if err := s.CreateSandbox(ctx, store.Sandbox{}); err == nil {
		t.Error("created a sandbox without an id")
	}
	if err := s.CreateSandbox(ctx, store.Sandbox{ID: "sb-bad", Phase: "running"}); err == nil {
		t.Error("created a sandbox in an unknown phase")
	}

	must(t, s.SetDriverRef(ctx, "sb-1", "pid=43"))
	got, err = s.GetSandbox(ctx, "sb-1")
	must(t, err)
	if got.DriverRef != "pid=43" {
		t.Errorf("driver ref %q", got.DriverRef)
	}
	wantErr(t, s.SetDriverRef(ctx, "nope", "x"), store.ErrNotFound, "driver ref of unknown")

	must(t, s.DeleteSandbox(ctx, "sb-1"))
	_, err = s.GetSandbox(ctx, "sb-1")
	wantErr(t, err, store.ErrNotFound, "get deleted")
	wantErr(t, s.DeleteSandbox(ctx, "sb-1"), store.ErrNotFound, "delete twice")
}

func testListSelector(t *testing.T, s store.Store) {
	ctx := context.Background()
	base := time.Now().Add(-time.Hour)
	for i, sb := range []store.Sandbox{
		{ID: "c", Labels: map[string]string{"team": "a", "env": "prod"}},
		{ID: "a", Labels: map[string]string{"team": "a", "env": "dev"}},
		{ID: "b", Labels: map[string]string{"team": "b"}},
		{ID: "d"},
	} {
		sb.CreatedAt = base.Add(time.Duration(i) * time.Second)
		must(t, s.CreateSandbox(ctx, sb))
	}
	for _, tc := range []struct {
		sel  map[string]string
		want []string
	}{
		{nil, []string{"c", "a", "b", "d"}},
		{map[string]string{"team": "a"}, []string{"c", "a"}},
		{map[string]string{"team": "a", "env": "dev"}, []string{"a"}},
		{map[string]string{"env": ""}, nil},
		{map[string]string{"team": "z"}, nil},
	} {
		list, err := s.ListSandboxes(ctx, tc.sel)
		must(t, err)
		var ids []string
		for _, sb := range list {
			ids = append(ids, sb.ID)
		}
		if !slices.Equal(ids, tc.want) {
			t.Errorf("selector %v: got %v, want %v (oldest first)", tc.sel, ids, tc.want)
		}
	}
}

func testPhases(t *testing.T, s store.Store) {
	ctx := context.Background()
	mkSandbox(t, s, "sb", nil)
	before, err := s.GetSandbox(ctx, "sb")
	must(t, err)
	must(t, s.SetPhase(ctx, "sb", store.PhaseReady, nil, ""))
	code := 3
	must(t, s.SetPhase(ctx, "sb", store.PhaseExited, &code, "workload exited"))
	got, err := s.GetSandbox(ctx, "sb")
	must(t, err)
	if got.Phase != store.PhaseExited || got.ExitCode == nil || *got.ExitCode != 3 || got.Reason != "workload exited" {
		t.Errorf("after exit: phase %q code %v reason %q", got.Phase, got.ExitCode, got.Reason)
	}
	if got.UpdatedAt.Before(before.UpdatedAt) {
		t.Errorf("updated_at went back: %v < %v", got.UpdatedAt, before.UpdatedAt)
	}
	zero := 0
	must(t, s.SetPhase(ctx, "sb", store.PhaseFailed, &zero, ""))
	got, err = s.GetSandbox(ctx, "sb")
	must(t, err)
	if got.ExitCode == nil || *got.ExitCode != 0 || got.Reason != "" {
		t.Errorf("exit code 0 must be kept apart from none: %v %q", got.ExitCode, got.Reason)
	}
	wantErr(t, s.SetPhase(ctx, "nope", store.PhaseReady, nil, ""), store.ErrNotFound, "phase of unknown")
	if err := s.SetPhase(ctx, "sb", "running", nil, ""); err == nil {
		t.Error("set an unknown phase")
	}
}

func testPolicies(t *testing.T, s store.Store) {
	ctx := context.Background()
	mkSandbox(t, s, "sb", nil)
	mkSandbox(t, s, "other", nil)
	hist, err := s.PolicyHistory(ctx, "sb")
	must(t, err)
	if len(hist) != 0 {
		t.Fatalf("history of a new sandbox: %d versions", len(hist))
	}
	_, err = s.Policy(ctx, "sb", 0)
	wantErr(t, err, store.ErrNotFound, "newest policy of a sandbox without one")

	p1, err := s.AddPolicy(ctx, "sb", []byte("a: 1\n"), "sha-a", "alice")
	must(t, err)
	p2, err := s.AddPolicy(ctx, "sb", []byte("a: 2\n"), "sha-b", "bob")
	must(t, err)
	o1, err := s.AddPolicy(ctx, "other", nil, "sha-c", "carol")
	must(t, err)
	if p1.Version != 1 || p2.Version != 2 || o1.Version != 1 {
		t.Fatalf("versions %d, %d and (other sandbox) %d; want 1, 2, 1", p1.Version, p2.Version, o1.Version)
	}
	if p1.Status != store.PolicyPending || !p1.StatusAt.IsZero() {
		t.Errorf("new policy status %q at %v, want pending and no time", p1.Status, p1.StatusAt)
	}

	newest, err := s.Policy(ctx, "sb", 0)
	must(t, err)
	if !reflect.DeepEqual(newest, p2) {
		t.Errorf("newest:\n got %+v\nwant %+v", newest, p2)
	}
	first, err := s.Policy(ctx, "sb", 1)
	must(t, err)
	if !reflect.DeepEqual(first, p1) {
		t.Errorf("version 1:\n got %+v\nwant %+v", first, p1)
	}
	_, err = s.Policy(ctx, "sb", 3)
	wantErr(t, err, store.ErrNotFound, "unknown version")

	hist, err = s.PolicyHistory(ctx, "sb")
	must(t, err)
	if len(hist) != 2 || hist[0].Version != 2 || hist[1].Version != 1 {
		t.Errorf("history not newest first: %+v", hist)
	}

	must(t, s.SetPolicyStatus(ctx, "sb", 2, store.PolicyFailed, "line 3: unknown key"))
	must(t, s.SetPolicyStatus(ctx, "sb", 1, store.PolicyLoaded, ""))
	got, err := s.Policy(ctx, "sb", 2)
	must(t, err)
	if got.Status != store.PolicyFailed || got.Error != "line 3: unknown key" || got.StatusAt.IsZero() {
		t.Errorf("failed status: %q %q %v", got.Status, got.Error, got.StatusAt)
	}
	got, err = s.Policy(ctx, "sb", 1)
	must(t, err)
	if got.Status != store.PolicyLoaded || got.Error != "" || got.StatusAt.IsZero() {
		t.Errorf("loaded status: %q %q %v", got.Status, got.Error, got.StatusAt)
	}
	wantErr(t, s.SetPolicyStatus(ctx, "sb", 9, store.PolicyLoaded, ""), store.ErrNotFound, "status of unknown version")
	if err := s.SetPolicyStatus(ctx, "sb", 1, "ok", ""); err == nil {
		t.Error("set an unknown policy status")
	}

	_, err = s.AddPolicy(ctx, "nope", []byte("x"), "sha", "eve")
	wantErr(t, err, store.ErrNotFound, "policy for unknown sandbox")
	_, err = s.PolicyHistory(ctx, "nope")
	wantErr(t, err, store.ErrNotFound, "history of unknown sandbox")
}

// testPolicyVersionsConcurrent: 20 writers per sandbox, released together,
// each adding 3 versions, get 1..60 between them with no gap or duplicate.
func testPolicyVersionsConcurrent(t *testing.T, s store.Store) {
	ctx := context.Background()
	mkSandbox(t, s, "a", nil)
	mkSandbox(t, s, "b", nil)
	const writers, each = 20, 3
	var wg sync.WaitGroup
	start := make(chan struct{})
	versions := map[string][]int64{}
	var mu sync.Mutex
	errs := make(chan error, 2*writers*each)
	for i := 0; i < writers; i++ {
		for _, id := range []string{"a", "b"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for j := 0; j < each; j++ {
					p, err := s.AddPolicy(ctx, id, []byte(fmt.Sprintf("n: %d\n", i)), "sha", "w")
					if err != nil {
						errs <- err
						continue
					}
					mu.Lock()
					versions[id] = append(versions[id], p.Version)
					mu.Unlock()
				}
			}()
		}
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("concurrent AddPolicy: %v", err)
	}
	const n = writers * each
	for _, id := range []string{"a", "b"} {
		got := versions[id]
		slices.Sort(got)
		for i, v := range got {
			if v != int64(i+1) {
				t.Fatalf("sandbox %s versions %v: want 1..%d without gaps or duplicates", id, got, n)
			}
		}
		if len(got) != n {
			t.Fatalf("sandbox %s: %d versions, want %d", id, len(got), n)
		}
		hist, err := s.PolicyHistory(ctx, id)
		must(t, err)
		if len(hist) != n || hist[0].Version != n {
			t.Fatalf("sandbox %s history: %d versions, newest %d", id, len(hist), hist[0].Version)
		}
	}
}

func testLogs(t *testing.T, s store.Store) {
	ctx := context.Background()
	mkSandbox(t, s, "a", nil)
	mkSandbox(t, s, "b", nil)
	tm := time.Now()
	batch := []store.LogEntry{
		{SandboxID: "a", Time: tm, Level: "info", Source: "audit", Event: "net.connect.allowed", Message: "ok", Fields: []byte(`{"host":"example.com"}`)},
		{SandboxID: "b", Time: tm, Level: "warn", Source: "supervisor", Message: "slow"},
		{SandboxID: "", Time: tm, Level: "error", Source: "gateway", Message: "gateway-wide"},
	}
	must(t, s.AppendLogs(ctx, batch))
	for i := 1; i < len(batch); i++ {
		if batch[i].Seq <= batch[i-1].Seq || batch[0].Seq <= 0 {
			t.Fatalf("seqs not assigned in order: %d, %d, %d", batch[0].Seq, batch[1].Seq, batch[2].Seq)
		}
	}
	more := []store.LogEntry{{SandboxID: "a", Level: "debug", Source: "audit", Message: "later"}}
	must(t, s.AppendLogs(ctx, more))
	if more[0].Seq <= batch[2].Seq {
		t.Fatalf("seq of a later batch %d not above %d", more[0].Seq, batch[2].Seq)
	}
	if more[0].Seq == 0 {
		t.Fatal("seq not set")
	}

	all, err := s.QueryLogs(ctx, store.LogQuery{})
	must(t, err)
	if len(all) != 4 {
		t.Fatalf("%d entries, want 4", len(all))
	}
	for i, e := range all[:3] {
		want := batch[i]
		want.Time = micro(tm)
		if !e.Time.Equal(want.Time) {
			t.Errorf("entry %d time %v, want %v", i, e.Time, want.Time)
		}
		e.Time = want.Time
		if e.Fields == nil {
			e.Fields = []byte{}
		}
		if want.Fields == nil {
			want.Fields = []byte{}
		}
		if !reflect.DeepEqual(e, want) {
			t.Errorf("entry %d:\n got %+v\nwant %+v", i, e, want)
		}
	}
	if all[3].Time.IsZero() {
		t.Error("an entry without a time was not given one")
	}

	wantErr(t, s.AppendLogs(ctx, []store.LogEntry{{SandboxID: "ghost", Level: "info"}}), store.ErrNotFound, "logs of unknown sandbox")
	if err := s.AppendLogs(ctx, []store.LogEntry{{SandboxID: "a", Level: "info"}, {SandboxID: "a", Level: "loud"}}); err == nil {
		t.Error("appended an entry with an unknown level")
	}
	// A refused batch stores none of its entries.
	after, err := s.QueryLogs(ctx, store.LogQuery{AfterSeq: more[0].Seq})
	must(t, err)
	if len(after) != 0 {
		t.Errorf("a refused batch left %d entries", len(after))
	}
	must(t, s.AppendLogs(ctx, nil))
}

func testLogFilters(t *testing.T, s store.Store) {
	ctx := context.Background()
	mkSandbox(t, s, "a", nil)
	mkSandbox(t, s, "b", nil)
	old := time.Now().Add(-time.Hour)
	recent := time.Now()
	var batch []store.LogEntry
	for i, lvl := range []string{"debug", "info", "warn", "error", "info", "warn"} {
		sb := "a"
		if i%2 == 1 {
			sb = "b"
		}
		tm := old
		if i >= 3 {
			tm = recent
		}
		ev := ""
		if lvl == "warn" {
			ev = "net.connect.denied"
		}
		batch = append(batch, store.LogEntry{SandboxID: sb, Time: tm, Level: lvl, Source: "audit", Event: ev, Message: fmt.Sprint(i)})
	}
	must(t, s.AppendLogs(ctx, batch))
	msgs := func(q store.LogQuery) []string {
		t.Helper()
		es, err := s.QueryLogs(ctx, q)
		must(t, err)
		var out []string
		for _, e := range es {
			out = append(out, e.Message)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		q    store.LogQuery
		want []string
	}{
		{"all", store.LogQuery{}, []string{"0", "1", "2", "3", "4", "5"}},
		{"sandbox", store.LogQuery{SandboxID: "b"}, []string{"1", "3", "5"}},
		{"after", store.LogQuery{AfterSeq: batch[2].Seq}, []string{"3", "4", "5"}},
		{"since", store.LogQuery{Since: recent.Add(-time.Minute)}, []string{"3", "4", "5"}},
		{"since exact", store.LogQuery{Since: recent}, []string{"3", "4", "5"}},
		{"event", store.LogQuery{Event: "net.connect.denied"}, []string{"2", "5"}},
		{"debug", store.LogQuery{MinLevel: "debug"}, []string{"0", "1", "2", "3", "4", "5"}},
		{"info", store.LogQuery{MinLevel: "info"}, []string{"1", "2", "3", "4", "5"}},
		{"warn", store.LogQuery{MinLevel: "warn"}, []string{"2", "3", "5"}},
		{"error", store.LogQuery{MinLevel: "error"}, []string{"3"}},
		{"limit", store.LogQuery{Limit: 2}, []string{"0", "1"}},
		{"combined", store.LogQuery{SandboxID: "b", MinLevel: "warn", Since: recent.Add(-time.Minute), Limit: 10}, []string{"3", "5"}},
		{"none", store.LogQuery{SandboxID: "nope"}, nil},
	} {
		if got := msgs(tc.q); !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
	if _, err := s.QueryLogs(ctx, store.LogQuery{MinLevel: "loud"}); err == nil {
		t.Error("queried with an unknown level")
	}
	if _, err := s.QueryLogs(ctx, store.LogQuery{Limit: -1}); err == nil {
		t.Error("queried with a negative limit")
	}
}

func testLogDefaultLimit(t *testing.T, s store.Store) {
	ctx := context.Background()
	mkSandbox(t, s, "a", nil)
	batch := make([]store.LogEntry, 1200)
	for i := range batch {
		batch[i] = store.LogEntry{SandboxID: "a", Level: "info", Message: fmt.Sprint(i)}
	}
	must(t, s.AppendLogs(ctx, batch))
	got, err := s.QueryLogs(ctx, store.LogQuery{})
	must(t, err)
	if len(got) != 1000 {
		t.Fatalf("default limit returned %d entries, want 1000", len(got))
	}
	if got[0].Message != "0" || got[999].Message != "999" {
		t.Errorf("default limit does not return the oldest first: %q..%q", got[0].Message, got[999].Message)
	}
	got, err = s.QueryLogs(ctx, store.LogQuery{Limit: 5000})
	must(t, err)
	if len(got) != 1200 {
		t.Errorf("limit 5000 returned %d of 1200", len(got))
	}
}

// testLogSeqNeverReused: a follower that saw seq N must not be handed a
// different entry with seq N after the newest entries were deleted.
func testLogSeqNeverReused(t *testing.T, s store.Store) {
	ctx := context.Background()
	mkSandbox(t, s, "a", nil)
	mkSandbox(t, s, "b", nil)
	first := []store.LogEntry{{SandboxID: "b", Level: "info"}, {SandboxID: "a", Level: "info"}}
	must(t, s.AppendLogs(ctx, first))
	must(t, s.DeleteSandbox(ctx, "a"))
	next := []store.LogEntry{{SandboxID: "b", Level: "info"}}
	must(t, s.AppendLogs(ctx, next))
	if next[0].Seq <= first[1].Seq {
		t.Fatalf("seq %d reused after deleting the newest entry (seq %d)", next[0].Seq, first[1].Seq)
	}
	if _, err := s.PruneLogs(ctx, 0); err != nil {
		t.Fatal(err)
	}
	last := []store.LogEntry{{SandboxID: "b", Level: "info"}}
	must(t, s.AppendLogs(ctx, last))
	if last[0].Seq <= next[0].Seq {
		t.Fatalf("seq %d reused after pruning everything (last was %d)", last[0].Seq, next[0].Seq)
	}
}

// testLogFollower: writers append concurrently while a follower polls with
// AfterSeq, as `corral logs --follow` does. The follower must see every
// entry exactly once, which holds only if a seq becomes visible no earlier
// than every smaller seq.
func testLogFollower(t *testing.T, s store.Store) {
	ctx := context.Background()
	const writers, batches, size = 4, 15, 20
	for w := 0; w < writers; w++ {
		mkSandbox(t, s, fmt.Sprint("w", w), nil)
	}
	done := make(chan struct{})
	errs := make(chan error, writers)
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := 0; b < batches; b++ {
				batch := make([]store.LogEntry, size)
				for i := range batch {
					batch[i] = store.LogEntry{SandboxID: fmt.Sprint("w", w), Level: "info", Message: fmt.Sprintf("%d/%d/%d", w, b, i)}
				}
				if err := s.AppendLogs(ctx, batch); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	go func() { wg.Wait(); close(done) }()

	seen := map[string]bool{}
	var last int64
	deadline := time.Now().Add(30 * time.Second)
	for finished := false; ; {
		select {
		case <-done:
			finished = true
		default:
		}
		es, err := s.QueryLogs(ctx, store.LogQuery{AfterSeq: last, Limit: 50})
		must(t, err)
		for _, e := range es {
			if e.Seq <= last {
				t.Fatalf("seq %d after %d", e.Seq, last)
			}
			if seen[e.Message] {
				t.Fatalf("entry %q seen twice", e.Message)
			}
			seen[e.Message] = true
			last = e.Seq
		}
		if finished && len(es) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("follower did not finish in time")
		}
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if want := writers * batches * size; len(seen) != want {
		t.Fatalf("follower saw %d of %d entries: some were committed below a seq it had already passed", len(seen), want)
	}
}

// testLogOddText: one line with a NUL or broken UTF-8 from a workload must
// not make the whole batch fail on either backend.
func testLogOddText(t *testing.T, s store.Store) {
	ctx := context.Background()
	mkSandbox(t, s, "a", nil)
	batch := []store.LogEntry{
		{SandboxID: "a", Level: "info", Message: "nul\x00byte"},
		{SandboxID: "a", Level: "info", Message: "bad\xffutf8", Event: "e\xfe"},
		{SandboxID: "a", Level: "info", Message: "fine ünïcode", Fields: []byte("\x00\xff raw")},
	}
	must(t, s.AppendLogs(ctx, batch))
	got, err := s.QueryLogs(ctx, store.LogQuery{SandboxID: "a"})
	must(t, err)
	if len(got) != 3 {
		t.Fatalf("%d entries, want 3", len(got))
	}
	if got[0].Message != "nul\uFFFDbyte" || got[1].Message != "bad\uFFFDutf8" || got[2].Message != "fine ünïcode" {
		t.Errorf("messages %q %q %q", got[0].Message, got[1].Message, got[2].Message)
	}
	if !bytes.Equal(got[2].Fields, []byte("\x00\xff raw")) {
		t.Errorf("fields changed: %q", got[2].Fields)
	}
}

func testPruneLogs(t *testing.T, s store.Store) {
	ctx := context.Background()
	mkSandbox(t, s, "a", nil)
	mkSandbox(t, s, "b", nil)
	var batch []store.LogEntry
	count := map[string]int{}
	add := func(sb string, n int) {
		for i := 0; i < n; i++ {
			name := sb
			if name == "" {
				name = "g"
			}
			batch = append(batch, store.LogEntry{SandboxID: sb, Level: "info", Message: fmt.Sprintf("%s%d", name, count[sb])})
			count[sb]++
		}
	}
	add("a", 5)
	add("b", 3)
	add("", 2)
	add("a", 5)
	must(t, s.AppendLogs(ctx, batch))
	n, err := s.PruneLogs(ctx, 4)
	must(t, err)
	if n != 6 {
		t.Fatalf("pruned %d entries, want 6", n)
	}
	msgs := func(sb string) []string {
		es, err := s.QueryLogs(ctx, store.LogQuery{SandboxID: sb})
		must(t, err)
		var out []string
		for _, e := range es {
			out = append(out, e.Message)
		}
		return out
	}
	if got := msgs("a"); !slices.Equal(got, []string{"a6", "a7", "a8", "a9"}) {
		t.Errorf("sandbox a kept %v, want its newest 4", got)
	}
	if got := msgs("b"); !slices.Equal(got, []string{"b0", "b1", "b2"}) {
		t.Errorf("sandbox b kept %v", got)
	}
	n, err = s.PruneLogs(ctx, 1)
	must(t, err)
	if n != 3+2+1 {
		t.Errorf("pruned %d entries to keep 1 each, want 6", n)
	}
	// Gateway-wide lines (no sandbox) are a group of their own.
	if got := msgs(""); !slices.Equal(got, []string{"b2", "g1", "a9"}) {
		t.Errorf("kept %v, want b2 g1 a9", got)
	}
	if _, err := s.PruneLogs(ctx, -1); err == nil {
		t.Error("pruned with a negative keep")
	}
}

func testDeleteCascades(t *testing.T, s store.Store) {
	ctx := context.Background()
	mkSandbox(t, s, "gone", nil)
	mkSandbox(t, s, "kept", nil)
	for _, id := range []string{"gone", "kept"} {
		if _, err := s.AddPolicy(ctx, id, []byte("p"), "sha", "a"); err != nil {
			t.Fatal(err)
		}
		must(t, s.AppendLogs(ctx, []store.LogEntry{{SandboxID: id, Level: "info"}}))
		must(t, s.AddToken(ctx, store.Token{ID: "sbtok-" + id, Kind: store.TokenSandbox, SandboxID: id, Hash: "h-sb-" + id}))
		must(t, s.AddToken(ctx, store.Token{ID: "join-" + id, Kind: store.TokenJoin, Hash: "h-join-" + id}))
		must(t, s.SpendJoinToken(ctx, "join-"+id, id))
	}
	must(t, s.AddToken(ctx, store.Token{ID: "user", Kind: store.TokenUser, Hash: "h-user"}))
	must(t, s.DeleteSandbox(ctx, "gone"))

	_, err := s.Policy(ctx, "gone", 0)
	wantErr(t, err, store.ErrNotFound, "policy of deleted sandbox")
	logs, err := s.QueryLogs(ctx, store.LogQuery{SandboxID: "gone"})
	must(t, err)
	if len(logs) != 0 {
		t.Errorf("%d log entries outlived their sandbox", len(logs))
	}
	for _, h := range []string{"h-sb-gone", "h-join-gone"} {
		_, err := s.TokenByHash(ctx, h)
		wantErr(t, err, store.ErrNotFound, "token bound to deleted sandbox")
	}
	for _, h := range []string{"h-sb-kept", "h-join-kept", "h-user"} {
		if _, err := s.TokenByHash(ctx, h); err != nil {
			t.Errorf("token %s went with another sandbox: %v", h, err)
		}
	}
	if p, err := s.Policy(ctx, "kept", 0); err != nil || p.Version != 1 {
		t.Errorf("other sandbox's policy: %+v %v", p, err)
	}
	if logs, err := s.QueryLogs(ctx, store.LogQuery{SandboxID: "kept"}); err != nil || len(logs) != 1 {
		t.Errorf("other sandbox's logs: %d %v", len(logs), err)
	}

	// A sandbox created again under the same id starts clean.
	mkSandbox(t, s, "gone", nil)
	p, err := s.AddPolicy(ctx, "gone", []byte("p"), "sha", "a")
	must(t, err)
	if p.Version != 1 {
		t.Errorf("recreated sandbox's first policy is version %d", p.Version)
	}
}

func testTokens(t *testing.T, s store.Store) {
	ctx := context.Background()
	mkSandbox(t, s, "sb", nil)
	expires := time.Now().Add(24 * time.Hour)
	user := store.Token{ID: "t1", Name: "ci", Kind: store.TokenUser, Hash: "aa", ExpiresAt: expires}
	sbt := store.Token{ID: "t2", Name: "sb", Kind: store.TokenSandbox, SandboxID: "sb", Hash: "bb"}
	must(t, s.AddToken(ctx, user))
	must(t, s.AddToken(ctx, sbt))

	got, err := s.TokenByHash(ctx, "aa")
	must(t, err)
	if got.ID != "t1" || got.Name != "ci" || got.Kind != store.TokenUser || got.SandboxID != "" ||
		!got.ExpiresAt.Equal(micro(expires)) || !got.UsedAt.IsZero() || got.CreatedAt.IsZero() {
		t.Errorf("user token: %+v", got)
	}
	got, err = s.TokenByHash(ctx, "bb")
	must(t, err)
	if got.SandboxID != "sb" || got.Kind != store.TokenSandbox || !got.ExpiresAt.IsZero() {
		t.Errorf("sandbox token: %+v", got)
	}
	_, err = s.TokenByHash(ctx, "cc")
	wantErr(t, err, store.ErrNotFound, "unknown hash")

	wantErr(t, s.AddToken(ctx, store.Token{ID: "t1", Kind: store.TokenUser, Hash: "dd"}), store.ErrExists, "duplicate token id")
	wantErr(t, s.AddToken(ctx, store.Token{ID: "t3", Kind: store.TokenUser, Hash: "aa"}), store.ErrExists, "duplicate token hash")
	wantErr(t, s.AddToken(ctx, store.Token{ID: "t4", Kind: store.TokenSandbox, SandboxID: "ghost", Hash: "ee"}), store.ErrNotFound, "token for unknown sandbox")
	for _, bad := range []store.Token{
		{ID: "x", Kind: "admin", Hash: "x"},
		{ID: "x", Kind: store.TokenSandbox, Hash: "x"},
		{ID: "", Kind: store.TokenUser, Hash: "x"},
		{ID: "x", Kind: store.TokenUser},
	} {
		if err := s.AddToken(ctx, bad); err == nil {
			t.Errorf("added invalid token %+v", bad)
		}
	}

	list, err := s.ListTokens(ctx)
	must(t, err)
	if len(list) != 2 {
		t.Fatalf("%d tokens listed, want 2", len(list))
	}
	must(t, s.DeleteToken(ctx, "t1"))
	_, err = s.TokenByHash(ctx, "aa")
	wantErr(t, err, store.ErrNotFound, "deleted token")
	wantErr(t, s.DeleteToken(ctx, "t1"), store.ErrNotFound, "delete twice")
}

func testJoinTokens(t *testing.T, s store.Store) {
	ctx := context.Background()
	mkSandbox(t, s, "sb", nil)
	must(t, s.AddToken(ctx, store.Token{ID: "j", Kind: store.TokenJoin, Hash: "j"}))
	must(t, s.AddToken(ctx, store.Token{ID: "old", Kind: store.TokenJoin, Hash: "old", ExpiresAt: time.Now().Add(-time.Minute)}))
	must(t, s.AddToken(ctx, store.Token{ID: "u", Kind: store.TokenUser, Hash: "u"}))

	wantErr(t, s.SpendJoinToken(ctx, "j", "ghost"), store.ErrNotFound, "spend for unknown sandbox")
	must(t, s.SpendJoinToken(ctx, "j", "sb"))
	got, err := s.TokenByHash(ctx, "j")
	must(t, err)
	if got.SandboxID != "sb" || got.UsedAt.IsZero() {
		t.Errorf("spent token: %+v", got)
	}
	wantErr(t, s.SpendJoinToken(ctx, "j", "sb"), store.ErrNotFound, "spend twice")
	wantErr(t, s.SpendJoinToken(ctx, "old", "sb"), store.ErrNotFound, "spend expired")
	wantErr(t, s.SpendJoinToken(ctx, "u", "sb"), store.ErrNotFound, "spend a user token")
	wantErr(t, s.SpendJoinToken(ctx, "nope", "sb"), store.ErrNotFound, "spend unknown")

	// Grants come back sorted, by hash and in the list, and go with the
	// token; only a join token may carry them.
	must(t, s.AddToken(ctx, store.Token{ID: "g", Kind: store.TokenJoin, Hash: "g", Secrets: []string{"gh-token", "db"}}))
	got, err = s.TokenByHash(ctx, "g")
	must(t, err)
	if !slices.Equal(got.Secrets, []string{"db", "gh-token"}) {
		t.Errorf("granted secrets by hash: %q", got.Secrets)
	}
	if got, err := s.TokenByHash(ctx, "j"); err != nil || len(got.Secrets) != 0 {
		t.Errorf("a join token made without grants: %+v, %v", got, err)
	}
	list, err := s.ListTokens(ctx)
	must(t, err)
	for _, tk := range list {
		if want := map[string][]string{"g": {"db", "gh-token"}}[tk.ID]; !slices.Equal(tk.Secrets, want) {
			t.Errorf("listed token %s grants %q, want %q", tk.ID, tk.Secrets, want)
		}
	}
	if err := s.AddToken(ctx, store.Token{ID: "ug", Kind: store.TokenUser, Hash: "ug", Secrets: []string{"db"}}); err == nil {
		t.Error("a user token was stored with granted secrets")
	}
	must(t, s.DeleteToken(ctx, "g"))
	must(t, s.AddToken(ctx, store.Token{ID: "g", Kind: store.TokenJoin, Hash: "g2"}))
	if got, err := s.TokenByHash(ctx, "g2"); err != nil || len(got.Secrets) != 0 {
		t.Errorf("a deleted token's grants outlived it: %+v, %v", got, err)
	}
}

func testJoinTokenSpentOnce(t *testing.T, s store.Store) {
	ctx := context.Background()
	const n = 10
	for i := 0; i < n; i++ {
		mkSandbox(t, s, fmt.Sprint("sb", i), nil)
	}
	must(t, s.AddToken(ctx, store.Token{ID: "j", Kind: store.TokenJoin, Hash: "j"}))
	var wg sync.WaitGroup
	results := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results <- s.SpendJoinToken(ctx, "j", fmt.Sprint("sb", i))
		}()
	}
	wg.Wait()
	close(results)
	won := 0
	for err := range results {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, store.ErrNotFound):
			t.Errorf("racing spend: %v", err)
		}
	}
	if won != 1 {
		t.Fatalf("one join token was spent %d times", won)
	}
}

func testClientCerts(t *testing.T, s store.Store) {
	ctx := context.Background()
	expires := time.Now().Add(48 * time.Hour).Truncate(time.Second)
	must(t, s.AddClientCert(ctx, store.ClientCert{Serial: "0a1b", Name: "alice", ExpiresAt: expires}))
	must(t, s.AddClientCert(ctx, store.ClientCert{Serial: "0c2d", Name: "bob", ExpiresAt: expires}))
	if err := s.AddClientCert(ctx, store.ClientCert{Serial: "0a1b", Name: "mallory", ExpiresAt: expires}); err == nil {
		t.Error("a second certificate with the same serial was stored")
	}
	if err := s.AddClientCert(ctx, store.ClientCert{Serial: "0e3f", Name: "carol"}); err == nil {
		t.Error("a certificate without an expiry was stored")
	}
	c, err := s.ClientCertBySerial(ctx, "0a1b")
	if err != nil || c.Name != "alice" || !c.ExpiresAt.Equal(expires) || c.IssuedAt.IsZero() || !c.RevokedAt.IsZero() {
		t.Fatalf("ClientCertBySerial = %+v, %v", c, err)
	}
	if _, err := s.ClientCertBySerial(ctx, "ffff"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("unknown serial: %v, want ErrNotFound", err)
	}
	must(t, s.RevokeClientCert(ctx, "0a1b"))
	if err := s.RevokeClientCert(ctx, "0a1b"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("revoking twice: %v, want ErrNotFound", err)
	}
	if err := s.RevokeClientCert(ctx, "ffff"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("revoking an unknown serial: %v, want ErrNotFound", err)
	}
	if c, err := s.ClientCertBySerial(ctx, "0a1b"); err != nil || c.RevokedAt.IsZero() {
		t.Errorf("after revocation: %+v, %v", c, err)
	}
	all, err := s.ListClientCerts(ctx)
	if err != nil || len(all) != 2 || all[0].RevokedAt.IsZero() == all[1].RevokedAt.IsZero() {
		t.Errorf("ListClientCerts = %+v, %v; want two, one revoked", all, err)
	}
}

func testSecrets(t *testing.T, s store.Store) {
	ctx := context.Background()
	_, err := s.GetSecret(ctx, "k")
	wantErr(t, err, store.ErrNotFound, "unknown secret")
	at := time.Now().Add(-time.Minute)
	must(t, s.PutSecret(ctx, store.Secret{Name: "k", Sealed: []byte{0, 1, 2, 255}, UpdatedAt: at}))
	must(t, s.PutSecret(ctx, store.Secret{Name: "a", Sealed: []byte("x")}))
	got, err := s.GetSecret(ctx, "k")
	must(t, err)
	if !bytes.Equal(got.Sealed, []byte{0, 1, 2, 255}) || !got.UpdatedAt.Equal(micro(at)) {
		t.Errorf("secret: %+v", got)
	}
	must(t, s.PutSecret(ctx, store.Secret{Name: "k", Sealed: []byte("new")}))
	got, err = s.GetSecret(ctx, "k")
	must(t, err)
	if string(got.Sealed) != "new" || !got.UpdatedAt.After(at) {
		t.Errorf("overwritten secret: %+v", got)
	}
	names, err := s.ListSecrets(ctx)
	must(t, err)
	if !slices.Equal(names, []string{"a", "k"}) {
		t.Errorf("names %v", names)
	}
	must(t, s.DeleteSecret(ctx, "k"))
	wantErr(t, s.DeleteSecret(ctx, "k"), store.ErrNotFound, "delete twice")
	if err := s.PutSecret(ctx, store.Secret{Sealed: []byte("x")}); err == nil {
		t.Error("stored a secret without a name")
	}
}

func testRoutes(t *testing.T, s store.Store) {
	ctx := context.Background()
	_, err := s.CurrentRoutes(ctx)
	wantErr(t, err, store.ErrNotFound, "no routes yet")
	r1, err := s.AddRoutes(ctx, []byte("r: 1\n"), "alice")
	must(t, err)
	if r1.Version != 1 {
		t.Fatalf("first routes version %d", r1.Version)
	}
	const n = 10
	var wg sync.WaitGroup
	vs := make(chan int64, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := s.AddRoutes(ctx, []byte(fmt.Sprintf("r: %d\n", i)), "bob")
			if err != nil {
				t.Error(err)
				return
			}
			vs <- r.Version
		}()
	}
	wg.Wait()
	close(vs)
	var got []int64
	for v := range vs {
		got = append(got, v)
	}
	slices.Sort(got)
	for i, v := range got {
		if v != int64(i+2) {
			t.Fatalf("concurrent routes versions %v: want 2..%d", got, n+1)
		}
	}
	cur, err := s.CurrentRoutes(ctx)
	must(t, err)
	if cur.Version != n+1 || cur.Author != "bob" || cur.CreatedAt.IsZero() {
		t.Errorf("current routes: %+v", cur)
	}
}

func testTimes(t *testing.T, s store.Store) {
	ctx := context.Background()
	// Nanoseconds, a zone other than UTC, and a time before the epoch.
	for i, tm := range []time.Time{
		time.Date(2031, 12, 31, 23, 59, 59, 999999999, time.FixedZone("E", -7*3600)),
		time.Date(1969, 7, 20, 20, 17, 40, 123456789, time.UTC),
		time.Unix(0, 1),
	} {
		id := fmt.Sprint("sb", i)
		must(t, s.CreateSandbox(ctx, store.Sandbox{ID: id, CreatedAt: tm, UpdatedAt: tm}))
		sb, err := s.GetSandbox(ctx, id)
		must(t, err)
		if !sb.CreatedAt.Equal(micro(tm)) {
			t.Errorf("time %v came back as %v", tm, sb.CreatedAt)
		}
		if sb.CreatedAt.Location() != time.UTC {
			t.Errorf("time came back in %v, want UTC", sb.CreatedAt.Location())
		}
		e := []store.LogEntry{{SandboxID: id, Time: tm, Level: "info"}}
		must(t, s.AppendLogs(ctx, e))
		got, err := s.QueryLogs(ctx, store.LogQuery{SandboxID: id})
		must(t, err)
		if len(got) != 1 || !got[0].Time.Equal(micro(tm)) {
			t.Errorf("log time %v came back as %+v", tm, got)
		}
	}
}
