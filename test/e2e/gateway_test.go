package e2e

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	gatewayv1 "github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1/gatewayv1connect"
	"github.com/corral-sandbox/corral/internal/linux/cgroup"
	"github.com/corral-sandbox/corral/internal/sandbox"
	"github.com/corral-sandbox/corral/internal/testutil/gatewayproc"
	"github.com/corral-sandbox/corral/internal/testutil/netlab"
)

// gatewayBin is the corral-gateway TestMain builds beside corral.
func gatewayBin() string { return filepath.Join(filepath.Dir(corralBin), "corral-gateway") }

// gatewayProc is a real corral-gateway process with the local driver
// starting corralBin.
type gatewayProc struct {
	*gatewayproc.Proc
	t *testing.T
}

// startGatewayProc starts a gateway on a fresh data directory and a free
// loopback port, with a user token; its cleanup deletes every sandbox,
// stops the gateway and fails the test if any supervisor still runs.
func startGatewayProc(t *testing.T) *gatewayProc {
	t.Helper()
	requireRoot(t)
	return &gatewayProc{Proc: gatewayproc.Start(t, gatewayproc.Options{Gateway: gatewayBin(), Corral: corralBin, Dir: baseDir}), t: t}
}

type gwClients struct {
	sandbox    gatewayv1connect.SandboxServiceClient
	policy     gatewayv1connect.PolicyServiceClient
	logs       gatewayv1connect.LogServiceClient
	supervisor gatewayv1connect.SupervisorServiceClient
}

// clients are typed gRPC clients sending token ("" sends none).
func (g *gatewayProc) clients(token string) gwClients {
	hc := g.HTTPClient(token)
	o := connect.WithGRPC()
	return gwClients{
		sandbox:    gatewayv1connect.NewSandboxServiceClient(hc, g.URL, o),
		policy:     gatewayv1connect.NewPolicyServiceClient(hc, g.URL, o),
		logs:       gatewayv1connect.NewLogServiceClient(hc, g.URL, o),
		supervisor: gatewayv1connect.NewSupervisorServiceClient(hc, g.URL, o),
	}
}

func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// create makes a sandbox with the local driver and returns its id.
func (g *gatewayProc) create(t *testing.T, c gwClients, req *gatewayv1.CreateSandboxRequest) string {
	t.Helper()
	sb, err := c.sandbox.Create(callCtx(t), connect.NewRequest(req))
	if err != nil {
		t.Fatalf("create sandbox: %v\ngateway log:\n%s", err, g.Logs())
	}
	if sb.Msg.Phase != gatewayv1.Phase_PHASE_PROVISIONING {
		t.Errorf("a new sandbox is %v, want provisioning", sb.Msg.Phase)
	}
	return sb.Msg.Id
}

// waitSandbox polls Get until cond holds.
func (g *gatewayProc) waitSandbox(t *testing.T, c gwClients, id, what string, within time.Duration, cond func(*gatewayv1.Sandbox) bool) *gatewayv1.Sandbox {
	t.Helper()
	deadline := time.Now().Add(within)
	var last *gatewayv1.Sandbox
	var lastErr error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := c.sandbox.Get(ctx, connect.NewRequest(&gatewayv1.GetSandboxRequest{Id: id}))
		cancel()
		if err == nil {
			last = resp.Msg
			if cond(last) {
				return last
			}
		}
		lastErr = err
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("sandbox %s: no %s within %v; last %v (%v)\nsupervisor log:\n%s\ngateway log:\n%s",
		id, what, within, last, lastErr, g.SupervisorLog(id), g.Logs())
	return nil
}

func phaseIs(p gatewayv1.Phase) func(*gatewayv1.Sandbox) bool {
	return func(sb *gatewayv1.Sandbox) bool { return sb.Phase == p }
}

// policyIs holds once version v is the sandbox's newest and has status st.
func policyIs(v int64, st gatewayv1.PolicyStatus) func(*gatewayv1.Sandbox) bool {
	return func(sb *gatewayv1.Sandbox) bool { return sb.PolicyVersion == v && sb.PolicyStatus == st }
}

func (g *gatewayProc) setPolicy(t *testing.T, c gwClients, id, yaml string) *gatewayv1.PolicyVersion {
	t.Helper()
	pv, err := c.policy.Set(callCtx(t), connect.NewRequest(&gatewayv1.SetPolicyRequest{SandboxId: id, Yaml: yaml}))
	if err != nil {
		t.Fatalf("set policy of %s: %v", id, err)
	}
	return pv.Msg
}

func codeOfErr(err error) connect.Code {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Code()
	}
	return connect.CodeUnknown
}

// TestGatewaySandboxLifecycle creates a sandbox through a real gateway
// whose local driver starts a real supervisor: the watcher sees
// provisioning, ready, then exited with the workload's own exit code, Get
// says the same, the audit trail reached the gateway, and Delete removes
// the sandbox and everything the driver made for it.
func TestGatewaySandboxLifecycle(t *testing.T) {
	t.Parallel()
	g := startGatewayProc(t)
	c := g.clients(g.User)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	labels := map[string]string{"test": "lifecycle"}
	watch, err := c.sandbox.Watch(ctx, connect.NewRequest(&gatewayv1.WatchSandboxesRequest{Selector: labels}))
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	id := g.create(t, c, &gatewayv1.CreateSandboxRequest{
		Name: "exit7", Labels: labels,
		// An exit code of the workload's own, so that it can only come
		// from the workload.
		Command: []string{"/bin/sh", "-c", "sleep 1; echo workload-ran; exit 7"},
	})
	var phases []gatewayv1.Phase
	var final *gatewayv1.Sandbox
	for final == nil && watch.Receive() {
		sb := watch.Msg().Sandbox
		if sb.Id != id {
			continue
		}
		if len(phases) == 0 || phases[len(phases)-1] != sb.Phase {
			phases = append(phases, sb.Phase)
		}
		if sb.Phase == gatewayv1.Phase_PHASE_EXITED || sb.Phase == gatewayv1.Phase_PHASE_FAILED {
			final = sb
		}
	}
	if final == nil {
		t.Fatalf("watch ended (%v) before the sandbox ended; phases %v\nsupervisor log:\n%s\ngateway log:\n%s", watch.Err(), phases, g.SupervisorLog(id), g.Logs())
	}
	want := []gatewayv1.Phase{gatewayv1.Phase_PHASE_PROVISIONING, gatewayv1.Phase_PHASE_READY, gatewayv1.Phase_PHASE_EXITED}
	if fmt.Sprint(phases) != fmt.Sprint(want) {
		t.Errorf("watched phases %v, want %v\nsupervisor log:\n%s", phases, want, g.SupervisorLog(id))
	}
	if final.ExitCode == nil || *final.ExitCode != 7 {
		t.Errorf("exited with %v, want the workload's 7 (reason %q)\nsupervisor log:\n%s", final.ExitCode, final.Reason, g.SupervisorLog(id))
	}
	if !strings.Contains(g.SupervisorLog(id), "workload-ran") {
		t.Errorf("the workload's output is not in the supervisor log:\n%s", g.SupervisorLog(id))
	}
	got := g.waitSandbox(t, c, id, "exited", 5*time.Second, phaseIs(gatewayv1.Phase_PHASE_EXITED))
	if got.ExitCode == nil || *got.ExitCode != 7 || got.PolicyVersion != 1 || got.PolicyStatus != gatewayv1.PolicyStatus_POLICY_STATUS_LOADED {
		t.Errorf("Get: %v", got)
	}

	// The audit trail the supervisor pushed is at the gateway.
	events := map[string]bool{}
	deadline := time.Now().Add(10 * time.Second)
	for !(events["sandbox.start"] && events["sandbox.exit"]) && time.Now().Before(deadline) {
		q, err := c.logs.Query(ctx, connect.NewRequest(&gatewayv1.LogQuery{SandboxId: id}))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range q.Msg.Entries {
			if e.SandboxId != id {
				t.Errorf("query for %s returned an entry of %s", id, e.SandboxId)
			}
			events[e.Event] = true
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !events["sandbox.start"] || !events["sandbox.exit"] {
		t.Errorf("events at the gateway: %v, want sandbox.start and sandbox.exit", events)
	}

	// A policy can no longer change once the sandbox has ended.
	_, err = c.policy.Set(ctx, connect.NewRequest(&gatewayv1.SetPolicyRequest{SandboxId: id, Yaml: "version: 1\n"}))
	if codeOfErr(err) != connect.CodeFailedPrecondition {
		t.Errorf("set policy of an exited sandbox: %v, want FailedPrecondition", err)
	}

	if _, err := c.sandbox.Delete(ctx, connect.NewRequest(&gatewayv1.DeleteSandboxRequest{Id: id})); err != nil {
		t.Fatal(err)
	}
	for watch.Receive() {
		if watch.Msg().Sandbox.GetId() == id && watch.Msg().Deleted {
			break
		}
	}
	if _, err := c.sandbox.Get(ctx, connect.NewRequest(&gatewayv1.GetSandboxRequest{Id: id})); codeOfErr(err) != connect.CodeNotFound {
		t.Errorf("Get after Delete: %v, want NotFound", err)
	}
	if _, err := os.Stat(filepath.Join(g.Data, "sandboxes", id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the sandbox's directory outlives it: %v", err)
	}
}

// TestGatewayAuth: no credential and a wrong token are Unauthenticated;
// a sandbox's own credential (the one the local driver handed its
// supervisor) can reach neither another sandbox's policy or logs nor any
// user service; a user token cannot act as a supervisor; what a sandbox
// pushes is stored as its own whatever it claims; a deleted token is
// refused at once.
func TestGatewayAuth(t *testing.T) {
	t.Parallel()
	t.Cleanup(func() { noWorkloadLeft(t, []string{"sleep", "3011"}) })
	g := startGatewayProc(t)
	c := g.clients(g.User)
	cmd := []string{"/bin/sh", "-c", "exec sleep 3011"}
	a := g.create(t, c, &gatewayv1.CreateSandboxRequest{Name: "a", Command: cmd})
	b := g.create(t, c, &gatewayv1.CreateSandboxRequest{Name: "b", Command: cmd})
	for _, id := range []string{a, b} {
		g.waitSandbox(t, c, id, "ready", 30*time.Second, phaseIs(gatewayv1.Phase_PHASE_READY))
	}
	ctx := callCtx(t)
	list := func(cl gwClients) error {
		_, err := cl.sandbox.List(ctx, connect.NewRequest(&gatewayv1.ListSandboxesRequest{}))
		return err
	}
	if err := list(c); err != nil {
		t.Fatalf("the user token is refused: %v", err)
	}
	for name, tok := range map[string]string{
		"no credential":        "",
		"unknown user token":   "cgw_u_" + strings.Repeat("A", 43),
		"unknown sandbox cred": "cgw_s_" + strings.Repeat("A", 43),
		"not a token":          "hunter2",
	} {
		if err := list(g.clients(tok)); codeOfErr(err) != connect.CodeUnauthenticated {
			t.Errorf("%s: List: %v, want Unauthenticated", name, err)
		}
	}

	sa := g.clients(g.SandboxToken(a))
	if _, err := sa.policy.Get(ctx, connect.NewRequest(&gatewayv1.GetPolicyRequest{SandboxId: b})); codeOfErr(err) != connect.CodePermissionDenied {
		t.Errorf("sandbox a reads b's policy: %v, want PermissionDenied", err)
	}
	if _, err := sa.policy.Set(ctx, connect.NewRequest(&gatewayv1.SetPolicyRequest{SandboxId: b, Yaml: "version: 1\n"})); codeOfErr(err) != connect.CodePermissionDenied {
		t.Errorf("sandbox a sets b's policy: %v, want PermissionDenied", err)
	}
	if _, err := sa.logs.Query(ctx, connect.NewRequest(&gatewayv1.LogQuery{SandboxId: b})); codeOfErr(err) != connect.CodePermissionDenied {
		t.Errorf("sandbox a reads b's logs: %v, want PermissionDenied", err)
	}
	if err := list(sa); codeOfErr(err) != connect.CodePermissionDenied {
		t.Errorf("sandbox a lists sandboxes: %v, want PermissionDenied", err)
	}
	if _, err := sa.sandbox.Delete(ctx, connect.NewRequest(&gatewayv1.DeleteSandboxRequest{Id: b})); codeOfErr(err) != connect.CodePermissionDenied {
		t.Errorf("sandbox a deletes b: %v, want PermissionDenied", err)
	}
	if _, err := sa.supervisor.Join(ctx, connect.NewRequest(&gatewayv1.JoinRequest{Name: "x"})); codeOfErr(err) != connect.CodePermissionDenied {
		t.Errorf("sandbox a joins as a new sandbox: %v, want PermissionDenied", err)
	}
	if _, err := c.supervisor.ReportPhase(ctx, connect.NewRequest(&gatewayv1.ReportPhaseRequest{Phase: gatewayv1.Phase_PHASE_FAILED})); codeOfErr(err) != connect.CodePermissionDenied {
		t.Errorf("a user reports a phase as a supervisor: %v, want PermissionDenied", err)
	}

	// a pushes an entry claiming to be b's and the gateway's: it is a's,
	// from the supervisor.
	marker := fmt.Sprintf("forged-%d", time.Now().UnixNano())
	push := sa.supervisor.PushLogs(ctx)
	if err := push.Send(&gatewayv1.LogBatch{Entries: []*gatewayv1.LogEntry{{SandboxId: b, Source: "gateway", Level: "error", Event: "test.forged", Message: marker}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := push.CloseAndReceive(); err != nil {
		t.Fatalf("push: %v", err)
	}
	q, err := c.logs.Query(ctx, connect.NewRequest(&gatewayv1.LogQuery{All: true, Event: "test.forged"}))
	if err != nil {
		t.Fatal(err)
	}
	if len(q.Msg.Entries) != 1 || q.Msg.Entries[0].SandboxId != a || q.Msg.Entries[0].Source != "supervisor" || q.Msg.Entries[0].Message != marker {
		t.Errorf("forged entry stored as %v, want sandbox %s, source supervisor", q.Msg.Entries, a)
	}
	// a's phase report changes a, never b.
	if _, err := sa.supervisor.ReportPhase(ctx, connect.NewRequest(&gatewayv1.ReportPhaseRequest{Phase: gatewayv1.Phase_PHASE_READY})); err != nil {
		t.Errorf("a reports its own phase: %v", err)
	}

	// A user token deleted with the admin command is refused from then on.
	tok := g.Token("--name", "temp")
	tc := g.clients(tok)
	if err := list(tc); err != nil {
		t.Fatalf("new user token refused: %v", err)
	}
	out, err := exec.Command(gatewayBin(), "token", "list", "--data", g.Data).Output()
	if err != nil {
		t.Fatal(err)
	}
	var tokID string
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) > 2 && f[2] == "temp" {
			tokID = f[0]
		}
	}
	if err := exec.Command(gatewayBin(), "token", "delete", tokID, "--data", g.Data).Run(); err != nil {
		t.Fatalf("token delete %q: %v", tokID, err)
	}
	if err := list(tc); codeOfErr(err) != connect.CodeUnauthenticated {
		t.Errorf("deleted token: %v, want Unauthenticated", err)
	}
}

// curlLoop curls each address's port 80 every 200 ms and prints
// "ADDR CODE" (000 for a refused connection) until the file stop appears.
func curlLoop(hosts ...string) []string {
	return []string{"/bin/sh", "-c", `while [ ! -e stop ]; do
  for h in ` + strings.Join(hosts, " ") + `; do curl -s -o /dev/null -w "$h %{http_code}\n" --max-time 2 http://$h/; done
  sleep 0.2
done`}
}

// webPolicy allows port 80 of hosts in proxy mode.
func webPolicy(hosts ...string) string {
	s := "network:\n  mode: proxy\nnetwork_policies:\n  web:\n    endpoints:\n"
	for _, h := range hosts {
		s += "      - {host: \"" + h + "\", port: 80}\n"
	}
	return basePolicy(s)
}

// settled waits out the answers to requests sent before the policy
// change took effect, and returns where the next ones will start.
func settled(read func() string) int {
	time.Sleep(300 * time.Millisecond)
	return len(read())
}

// waitAnswers waits until text written after mark shows want for every
// host and no 200 for the hosts in denied. read returns the whole text.
func waitAnswers(t *testing.T, what string, read func() string, mark int, within time.Duration, allowed, denied []string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		out := read()
		if mark > len(out) {
			mark = len(out)
		}
		after := out[mark:]
		ok := true
		for _, h := range allowed {
			ok = ok && strings.Contains(after, h+" 200")
		}
		for _, h := range denied {
			ok = ok && strings.Contains(after, h+" ")
		}
		leaked := ""
		for _, h := range denied {
			if strings.Contains(after, h+" 200") {
				leaked = h
			}
		}
		if leaked != "" {
			t.Fatalf("%s: %s answered 200 but must be denied:\n%s", what, leaked, after)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: want 200 from %v and a refusal from %v within %v; got:\n%s", what, allowed, denied, within, after)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestGatewayPolicy runs a real sandbox from a real gateway and changes
// its policy through the API while the workload curls two test hosts:
// each accepted version is enforced at once and reported LOADED; a change
// to a static section is refused by Set; a version the gateway accepts
// but the supervisor cannot load is reported FAILED and the running one
// keeps working. Then the gateway is killed with SIGKILL: the sandbox
// keeps enforcing its last policy; the gateway restarts on the same data
// and port, the supervisor reconnects and a version set then is enforced;
// what the sandbox logged during the outage reaches the gateway (or is
// counted as dropped). Last, a supervisor on "another host" — started by
// the test as an unprivileged user (rootless) — joins with a one-time
// token and is re-policed the same way.
func TestGatewayPolicy(t *testing.T) {
	requireRoot(t)
	const one, two = "203.0.113.40", "203.0.113.41"
	lab := netlab.Start(t,
		netlab.Host{Name: "one.test", Addr: netip.MustParseAddr(one)},
		netlab.Host{Name: "two.test", Addr: netip.MustParseAddr(two)})
	g := startGatewayProc(t)
	c := g.clients(g.User)

	id := g.create(t, c, &gatewayv1.CreateSandboxRequest{Name: "web", Command: curlLoop(one, two), Policy: webPolicy(one)})
	out := func() string { return g.SupervisorLog(id) }
	g.waitSandbox(t, c, id, "ready, v1 loaded", 30*time.Second, func(sb *gatewayv1.Sandbox) bool {
		return sb.Phase == gatewayv1.Phase_PHASE_READY && policyIs(1, gatewayv1.PolicyStatus_POLICY_STATUS_LOADED)(sb)
	})
	waitAnswers(t, "v1", out, 0, 15*time.Second, []string{one}, []string{two})

	mark := len(out())
	pv := g.setPolicy(t, c, id, webPolicy(one, two))
	if pv.Version != 2 {
		t.Fatalf("set returned version %d, want 2", pv.Version)
	}
	g.waitSandbox(t, c, id, "v2 LOADED", 10*time.Second, policyIs(2, gatewayv1.PolicyStatus_POLICY_STATUS_LOADED))
	waitAnswers(t, "v2", out, mark, 10*time.Second, []string{one, two}, nil)

	// A static section (the filesystem) cannot change in a running
	// sandbox: refused by Set, nothing stored.
	_, err := c.policy.Set(callCtx(t), connect.NewRequest(&gatewayv1.SetPolicyRequest{SandboxId: id, Yaml: `version: 1
filesystem_policy:
  read_only: [/usr, /lib, /lib64, /lib32, /bin, /sbin, /etc, /opt, /root]
`}))
	if codeOfErr(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "filesystem") {
		t.Errorf("set of a filesystem change: %v, want FailedPrecondition naming the filesystem", err)
	}
	block := "version: 1\nextends: none\nfilesystem_policy:\n  read_only: [/usr, /lib, /lib64, /lib32, /bin, /sbin, /etc, /opt]\nnetwork:\n  mode: block\n"
	if _, err := c.policy.Set(callCtx(t), connect.NewRequest(&gatewayv1.SetPolicyRequest{SandboxId: id, Yaml: block})); codeOfErr(err) != connect.CodeFailedPrecondition {
		t.Errorf("set of a network mode change: %v, want FailedPrecondition", err)
	}
	if _, err := c.policy.Set(callCtx(t), connect.NewRequest(&gatewayv1.SetPolicyRequest{SandboxId: id, Yaml: "version: 1\nnetwork_policies: [\n"})); codeOfErr(err) != connect.CodeInvalidArgument {
		t.Errorf("set of broken YAML: %v, want InvalidArgument", err)
	}
	hist, err := c.policy.History(callCtx(t), connect.NewRequest(&gatewayv1.PolicyHistoryRequest{SandboxId: id}))
	if err != nil || len(hist.Msg.Versions) != 2 {
		t.Fatalf("history after refused sets: %v, %v; want 2 versions", hist, err)
	}

	// The gateway cannot see the supervisor's environment: a route whose
	// key comes from a variable the supervisor lacks passes Set and fails
	// to load. v2 stays in force.
	mark = len(out())
	g.setPolicy(t, c, id, `version: 1
inference:
  routes:
    - name: r
      base_url: https://model.test/v1
      protocols: [openai_chat_completions]
      api_key: {from_env: CORRAL_E2E_NO_SUCH_KEY}
`)
	sb := g.waitSandbox(t, c, id, "v3 FAILED", 10*time.Second, policyIs(3, gatewayv1.PolicyStatus_POLICY_STATUS_FAILED))
	v3, err := c.policy.Get(callCtx(t), connect.NewRequest(&gatewayv1.GetPolicyRequest{SandboxId: id, Version: 3}))
	if err != nil || !strings.Contains(v3.Msg.Error, "CORRAL_E2E_NO_SUCH_KEY") {
		t.Errorf("v3's error %q (%v), want the unset variable named", v3.Msg.GetError(), err)
	}
	if sb.Phase != gatewayv1.Phase_PHASE_READY {
		t.Errorf("after a failed load the sandbox is %v", sb.Phase)
	}
	waitAnswers(t, "v2 after failed v3", out, mark, 10*time.Second, []string{one, two}, nil)

	// v4 drops the route again and allows only two.
	g.setPolicy(t, c, id, webPolicy(two)+"inference:\n  routes: []\n")
	g.waitSandbox(t, c, id, "v4 LOADED", 10*time.Second, policyIs(4, gatewayv1.PolicyStatus_POLICY_STATUS_LOADED))
	mark = settled(out)
	waitAnswers(t, "v4", out, mark, 10*time.Second, []string{two}, []string{one})

	// The gateway dies. The sandbox keeps enforcing v4.
	g.Kill()
	outageStart := time.Now()
	mark = len(out())
	waitAnswers(t, "v4, gateway down", out, mark, 10*time.Second, []string{two}, []string{one})
	// Long enough for the supervisor's reconnects to back off.
	time.Sleep(2 * time.Second)
	mark = len(out())
	waitAnswers(t, "v4, gateway down a while", out, mark, 10*time.Second, []string{two}, []string{one})
	outageEnd := time.Now()

	g.Restart()
	pv = g.setPolicy(t, c, id, webPolicy(one))
	if pv.Version != 5 {
		t.Fatalf("set after restart returned version %d, want 5", pv.Version)
	}
	// The supervisor's backoff is at most 5 s.
	g.waitSandbox(t, c, id, "v5 LOADED after the restart", 20*time.Second, policyIs(5, gatewayv1.PolicyStatus_POLICY_STATUS_LOADED))
	mark = settled(out)
	waitAnswers(t, "v5", out, mark, 10*time.Second, []string{one}, []string{two})

	// What the sandbox audited while the gateway was down arrives: its
	// connections in the outage, with their times, or a count of drops.
	var inOutage map[string]int
	deadline := time.Now().Add(15 * time.Second)
	var dropped int64
	for time.Now().Before(deadline) {
		q, err := c.logs.Query(callCtx(t), connect.NewRequest(&gatewayv1.LogQuery{SandboxId: id, Since: timestamppb.New(outageStart)}))
		if err != nil {
			t.Fatal(err)
		}
		dropped = q.Msg.Dropped
		inOutage = map[string]int{}
		for _, e := range q.Msg.Entries {
			if tm := e.Time.AsTime(); tm.After(outageStart) && tm.Before(outageEnd) {
				inOutage[e.Event]++
			}
		}
		if (inOutage["net.connect.allowed"] > 0 && inOutage["net.connect.denied"] > 0) || dropped > 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !(inOutage["net.connect.allowed"] > 0 && inOutage["net.connect.denied"] > 0) && dropped == 0 {
		t.Errorf("the outage's audit events did not reach the gateway and none were counted as dropped: %v", inOutage)
	}
	t.Logf("events stamped inside the %v outage: %v; dropped: %d", outageEnd.Sub(outageStart).Round(time.Millisecond), inOutage, dropped)
	all, err := c.logs.Query(callCtx(t), connect.NewRequest(&gatewayv1.LogQuery{SandboxId: id}))
	if err != nil {
		t.Fatal(err)
	}
	events := map[string]int{}
	for _, e := range all.Msg.Entries {
		events[e.Event]++
	}
	for _, want := range []string{"sandbox.start", "net.connect.allowed", "net.connect.denied", "policy.reloaded", "policy.reload_failed"} {
		if events[want] == 0 {
			t.Errorf("no %s entry reached the gateway; got %v", want, events)
		}
	}

	t.Run("join_rootless", func(t *testing.T) {
		m := getMode(t, &rootlessMode)
		fx := newFixture(t, m)
		join := g.Token("--join")
		tokenFile := filepath.Join(fx.aux, "join-token")
		ca := filepath.Join(fx.aux, "gateway-ca.pem")
		copyFile(t, g.CAFile(), ca, 0o644)
		if err := os.WriteFile(tokenFile, []byte(join+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(tokenFile, m.uid, m.gid); err != nil {
			t.Fatal(err)
		}
		label := fmt.Sprintf("j%d", time.Now().UnixNano())
		p := startCorral(t, fx, runOpts{
			args: []string{"/bin/sh", "-c", `while [ ! -e stop ]; do
  for h in one two; do curl -s -o /dev/null -w "$h %{http_code}\n" --max-time 2 http://$h.test/; done
  sleep 0.2
done`},
			policy: webPolicy("one.test"),
			flags: []string{"--upstream-dns", lab.DNS.String(), "--name", "joined", "--label", "run=" + label,
				"--gateway", g.URL, "--gateway-ca", ca, "--gateway-token-file", tokenFile},
		})
		waitOut(t, p, "one 200", 20*time.Second)
		list, err := c.sandbox.List(callCtx(t), connect.NewRequest(&gatewayv1.ListSandboxesRequest{Selector: map[string]string{"run": label}}))
		if err != nil || len(list.Msg.Sandboxes) != 1 {
			t.Fatalf("joined sandbox by label: %v, %v", list, err)
		}
		jid := list.Msg.Sandboxes[0].Id
		if d := list.Msg.Sandboxes[0].Driver; d != "external" {
			t.Errorf("joined sandbox has driver %q", d)
		}
		g.waitSandbox(t, c, jid, "ready, v1 loaded", 15*time.Second, func(sb *gatewayv1.Sandbox) bool {
			return sb.Phase == gatewayv1.Phase_PHASE_READY && policyIs(1, gatewayv1.PolicyStatus_POLICY_STATUS_LOADED)(sb)
		})
		if strings.Contains(p.stdout.String(), "two 200") {
			t.Fatalf("two.test reachable under v1:\n%s", p.stdout)
		}
		// The join token is spent.
		if _, err := g.clients(join).supervisor.Join(callCtx(t), connect.NewRequest(&gatewayv1.JoinRequest{Name: "again"})); codeOfErr(err) != connect.CodeUnauthenticated {
			t.Errorf("second join with a spent token: %v, want Unauthenticated", err)
		}

		// A gateway user cannot have a joined supervisor read its host's
		// files (or environment) as a key: not started with
		// --gateway-host-keys, it refuses the version.
		g.setPolicy(t, c, jid, webPolicy("one.test")+"inference:\n  routes:\n    - {name: r, base_url: \"https://m.test/v1\", protocols: [openai_chat_completions], api_key: {from_file: /etc/hostname}}\n")
		g.waitSandbox(t, c, jid, "v2 FAILED", 10*time.Second, policyIs(2, gatewayv1.PolicyStatus_POLICY_STATUS_FAILED))
		v2, err := c.policy.Get(callCtx(t), connect.NewRequest(&gatewayv1.GetPolicyRequest{SandboxId: jid, Version: 2}))
		if err != nil || !strings.Contains(v2.Msg.Error, "--gateway-host-keys") {
			t.Errorf("v2's error %q (%v), want the refusal of a host key naming --gateway-host-keys", v2.Msg.GetError(), err)
		}

		stdout := func() string { return p.stdout.String() }
		g.setPolicy(t, c, jid, webPolicy("two.test"))
		g.waitSandbox(t, c, jid, "v3 LOADED", 10*time.Second, policyIs(3, gatewayv1.PolicyStatus_POLICY_STATUS_LOADED))
		mark := settled(stdout)
		waitAnswers(t, "joined v3", stdout, mark, 10*time.Second, []string{"two"}, []string{"one"})

		fx.signal(t, "stop")
		if r := p.wait(); r.code != 0 {
			t.Fatalf("corral exited %d\n%s", r.code, r)
		}
		end := g.waitSandbox(t, c, jid, "exited", 10*time.Second, phaseIs(gatewayv1.Phase_PHASE_EXITED))
		if end.ExitCode == nil || *end.ExitCode != 0 {
			t.Errorf("joined sandbox ended with %v, want exit 0", end.ExitCode)
		}
	})
}

// TestGatewayReadopt restarts a gateway whose two sandboxes run: the one
// whose supervisor survived stays ready and takes a policy set after the
// restart; the one whose supervisor was SIGKILLed while the gateway was
// down is marked failed.
func TestGatewayReadopt(t *testing.T) {
	t.Parallel()
	workload := []string{"sleep", "3023"}
	// Registered first, so it runs after the gateway's cleanup.
	t.Cleanup(func() { noWorkloadLeft(t, workload) })
	g := startGatewayProc(t)
	c := g.clients(g.User)
	live := g.create(t, c, &gatewayv1.CreateSandboxRequest{Name: "live", Command: workload})
	dead := g.create(t, c, &gatewayv1.CreateSandboxRequest{Name: "dead", Command: workload})
	for _, id := range []string{live, dead} {
		g.waitSandbox(t, c, id, "ready", 30*time.Second, phaseIs(gatewayv1.Phase_PHASE_READY))
	}

	g.Kill()
	pids := g.Supervisors(dead)
	if len(pids) != 1 {
		t.Fatalf("supervisor of %s: pids %v", dead, pids)
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// A supervisor killed outright leaves its run directory and cgroups
	// for the next corral run on its state directory to sweep; the test
	// does not leave them for whoever runs next.
	t.Cleanup(func() {
		if _, err := sandbox.Sweep(g.SandboxStateDir(), cgroup.Detect()); err != nil {
			t.Errorf("sweep what the killed supervisor left: %v", err)
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for len(g.Supervisors(dead)) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	g.Restart()

	sb := g.waitSandbox(t, c, dead, "failed", 10*time.Second, phaseIs(gatewayv1.Phase_PHASE_FAILED))
	if !strings.Contains(sb.Reason, "no longer running") {
		t.Errorf("reason %q, want it to say the supervisor is gone", sb.Reason)
	}
	got, err := c.sandbox.Get(callCtx(t), connect.NewRequest(&gatewayv1.GetSandboxRequest{Id: live}))
	if err != nil || got.Msg.Phase != gatewayv1.Phase_PHASE_READY {
		t.Fatalf("re-adopted sandbox: %v, %v; want ready", got, err)
	}
	if n := len(g.Supervisors(live)); n != 1 {
		t.Errorf("re-adopted sandbox has %d supervisors, want the one it had", n)
	}
	// Its supervisor reconnected: a policy set now is loaded.
	g.setPolicy(t, c, live, "version: 1\nnetwork_policies:\n  x:\n    endpoints:\n      - {host: x.test, port: 443}\n")
	g.waitSandbox(t, c, live, "v2 LOADED after the restart", 20*time.Second, policyIs(2, gatewayv1.PolicyStatus_POLICY_STATUS_LOADED))
}

// noWorkloadLeft fails the test for any host process running argv, and
// kills it: a sandbox's workload must end with its sandbox.
func noWorkloadLeft(t *testing.T, argv []string) {
	deadline := time.Now().Add(5 * time.Second)
	pids := hostProcs(argv...)
	for len(pids) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		pids = hostProcs(argv...)
	}
	if len(pids) > 0 {
		t.Errorf("workloads %v still run after their sandboxes were deleted: pids %v", argv, pids)
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// TestGatewaySetAfterFailedVersion: a set leaves the sections it does not
// name as they run, like `corral policy set`. After a version the
// supervisor refused, what runs is the version before it, so the refused
// version's content must not ride along into the next set, which would
// then be refused for a section it never named.
func TestGatewaySetAfterFailedVersion(t *testing.T) {
	t.Parallel()
	workload := []string{"sleep", "3037"}
	t.Cleanup(func() { noWorkloadLeft(t, workload) })
	g := startGatewayProc(t)
	c := g.clients(g.User)
	id := g.create(t, c, &gatewayv1.CreateSandboxRequest{Name: "refused", Command: workload})
	g.waitSandbox(t, c, id, "ready", 30*time.Second, phaseIs(gatewayv1.Phase_PHASE_READY))
	g.setPolicy(t, c, id, `version: 1
inference:
  routes:
    - name: r
      base_url: https://model.test/v1
      protocols: [openai_chat_completions]
      api_key: {from_env: CORRAL_E2E_NO_SUCH_KEY}
`)
	g.waitSandbox(t, c, id, "v2 FAILED", 10*time.Second, policyIs(2, gatewayv1.PolicyStatus_POLICY_STATUS_FAILED))
	g.setPolicy(t, c, id, "version: 1\nnetwork_policies:\n  x:\n    endpoints:\n      - {host: x.test, port: 443}\n")
	deadline := time.Now().Add(10 * time.Second)
	var sb *gatewayv1.Sandbox
	for time.Now().Before(deadline) {
		got, err := c.sandbox.Get(callCtx(t), connect.NewRequest(&gatewayv1.GetSandboxRequest{Id: id}))
		if err != nil {
			t.Fatal(err)
		}
		if sb = got.Msg; sb.PolicyVersion == 3 && sb.PolicyStatus != gatewayv1.PolicyStatus_POLICY_STATUS_PENDING {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	v3, err := c.policy.Get(callCtx(t), connect.NewRequest(&gatewayv1.GetPolicyRequest{SandboxId: id, Version: 3}))
	if err != nil {
		t.Fatal(err)
	}
	if sb.PolicyStatus != gatewayv1.PolicyStatus_POLICY_STATUS_LOADED || strings.Contains(v3.Msg.Yaml, "CORRAL_E2E_NO_SUCH_KEY") {
		t.Errorf("v3, which names only network_policies, is %v (%q) and carries the refused v2's route: %v\n%s",
			sb.PolicyStatus, v3.Msg.Error, strings.Contains(v3.Msg.Yaml, "CORRAL_E2E_NO_SUCH_KEY"), v3.Msg.Yaml)
	}
}

// TestGatewaySecret: a policy secret taken from_gateway reaches the
// upstream it is scoped to in clear, while the workload, the supervisor's
// state directory and the gateway's log see only the surrogate or nothing;
// a value changed at the gateway is swapped in under the same surrogate.
func TestGatewaySecret(t *testing.T) {
	requireRoot(t)
	const addr = "203.0.113.46"
	lab := netlab.Start(t, netlab.Host{Name: "gwsecret.test", Addr: netip.MustParseAddr(addr)})
	lab.Serve("gwsecret.test", http.HandlerFunc(echoSite))
	g := startGatewayProc(t)
	secrets := gatewayv1connect.NewSecretServiceClient(g.HTTPClient(g.User), g.URL, connect.WithGRPC())
	real := "ghp_" + randomAlnum(36)
	if _, err := secrets.Set(callCtx(t), connect.NewRequest(&gatewayv1.SetSecretRequest{Name: "gh-token", Value: []byte(real)})); err != nil {
		t.Fatal(err)
	}

	m := getMode(t, &rootMode)
	fx := newFixture(t, m)
	labCA := filepath.Join(fx.aux, "lab-ca.pem")
	if err := os.WriteFile(labCA, lab.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(fx.aux, "join-token")
	if err := os.WriteFile(tokenFile, []byte(g.Token("--join", "--secret", "gh-token")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	policy := basePolicy(`network_policies:
  echo:
    endpoints:
      - {host: gwsecret.test, port: 443, protocol: rest, access: full}
secrets:
  GH_TOKEN:
    from_gateway: gh-token
    hosts: [gwsecret.test]
`)
	p := startCorral(t, fx, runOpts{
		args: []string{"/bin/sh", "-c", `echo "TOKEN=$GH_TOKEN"
curl -s -H "Authorization: Bearer $GH_TOKEN" https://gwsecret.test/basic; echo
while [ ! -e next ]; do sleep 0.1; done
curl -s -H "Authorization: Bearer $GH_TOKEN" https://gwsecret.test/basic; echo
echo DONE`},
		policy: policy,
		flags: []string{"--upstream-dns", lab.DNS.String(), "--upstream-ca", labCA,
			"--gateway", g.URL, "--gateway-ca", g.CAFile(), "--gateway-token-file", tokenFile},
	})
	waitOut(t, p, "you sent", 20*time.Second)
	rotated := "ghp_" + randomAlnum(36)
	if _, err := secrets.Set(callCtx(t), connect.NewRequest(&gatewayv1.SetSecretRequest{Name: "gh-token", Value: []byte(rotated)})); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.stderr.String(), "new secret values from the gateway") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	fx.signal(t, "next")
	r := p.wait()
	if r.code != 0 || !strings.Contains(r.stdout, "DONE") {
		t.Fatalf("the workload did not complete\n%s", r)
	}
	sur := regexp.MustCompile(`TOKEN=(ghp_[A-Za-z0-9]{36})\n`).FindStringSubmatch(r.stdout)
	if sur == nil || sur[1] == real || sur[1] == rotated {
		t.Fatalf("the workload's GH_TOKEN is not a surrogate\n%s", r)
	}
	var sent []string
	for _, req := range lab.HTTPRequests() {
		sent = append(sent, req.Header.Get("Authorization"))
	}
	if !slices.Equal(sent, []string{"Bearer " + real, "Bearer " + rotated}) {
		t.Errorf("the upstream got %q, want the real value, then the rotated one", sent)
	}
	for _, v := range []string{real, rotated} {
		if forms := leakedIn(r.stdout+r.stderr, v); len(forms) > 0 {
			t.Errorf("a real value reached the workload or corral's output as %q", forms)
		}
		if forms := leakedIn(g.Logs(), v); len(forms) > 0 {
			t.Errorf("a real value is in the gateway's log as %q", forms)
		}
		_ = filepath.WalkDir(fx.state, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return nil
			}
			if data, err := os.ReadFile(path); err == nil && len(leakedIn(string(data), v)) > 0 {
				t.Errorf("a real value was written to %s", path)
			}
			return nil
		})
	}
	if strings.Count(r.stdout, "you sent Bearer "+sur[1]) != 2 {
		t.Errorf("the echoes do not carry the surrogate twice\n%s", r.stdout)
	}
}

// The lean corral runs the gateway commands as its full program, which
// runs from the state directory; corral gateway must still find the
// corral-gateway next to the corral the user ran (PATH has none), and the
// full program lands in that user's state directory.
func TestGatewayCommandsRunAsTheFullProgram(t *testing.T) {
	m := getMode(t, &rootlessMode)
	state := filepath.Join(m.home, "state")
	code, out := corralCLI(t, m, "gateway", "serve", "--help")
	if code != 0 || !strings.Contains(out, "Serve the gateway") {
		t.Fatalf("corral gateway serve --help: exit %d\n%s", code, out)
	}
	if full, _ := filepath.Glob(filepath.Join(state, "corral", "bin", "corral-full-*")); len(full) != 1 {
		t.Fatalf("the full program is not in the user's state directory: %v", full)
	}
	// Without a gateway, policy get says what it needs; it is the full
	// program's own check.
	if code, out := corralCLI(t, m, "policy", "get"); code != 2 || !strings.Contains(out, "--sandbox ID is required") {
		t.Fatalf("corral policy get: exit %d\n%s", code, out)
	}
}

// corral version --full-program writes the full program to the state
// directory it is given (the gateway's --sandbox-state-dir passes one)
// and prints its path; --state-dir alone is refused.
func TestFullProgramInTheStateDirGiven(t *testing.T) {
	m := getMode(t, &rootlessMode)
	state := filepath.Join(m.home, "given-state")
	code, out := corralCLI(t, m, "version", "--full-program", "--state-dir", state)
	path := strings.TrimSpace(out)
	if code != 0 || filepath.Dir(path) != filepath.Join(state, "bin") || !strings.HasPrefix(filepath.Base(path), "corral-full-") {
		t.Fatalf("corral version --full-program --state-dir %s: exit %d\n%s", state, code, out)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode()&0o100 == 0 {
		t.Fatalf("full program %s: %v %v", path, fi, err)
	}
	if code, out := corralCLI(t, m, "version", "--state-dir", state); code != 2 || !strings.Contains(out, "--state-dir goes with --full-program") {
		t.Errorf("corral version --state-dir without --full-program: exit %d\n%s", code, out)
	}
}
