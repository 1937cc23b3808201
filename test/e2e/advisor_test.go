package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/testutil/netlab"
)

// The policy advisor end to end: real curl and python3 inside proxy-mode
// sandboxes are refused lab hosts, the supervisor proposes chunks, and
// corral draft (as a person would) approves, rejects and undoes them while
// the same sandbox keeps running.

var (
	addrAdv    = netip.MustParseAddr("203.0.113.40")
	addrUndo   = netip.MustParseAddr("203.0.113.41")
	addrRej    = netip.MustParseAddr("203.0.113.42")
	addrAgent  = netip.MustParseAddr("203.0.113.43")
	addrAgent2 = netip.MustParseAddr("203.0.113.44")
	addrLearn  = netip.MustParseAddr("203.0.113.45")
)

// agentLoop runs each command file the test drops in the workdir (cmd-1,
// cmd-2, ...) in turn and leaves its output in out-N, so the test can act
// inside one running sandbox as often as it likes.
const agentLoop = `#!/bin/bash
i=1
echo READY
while [ ! -e "$W/stop" ]; do
  if [ -e "$W/cmd-$i" ]; then
    bash "$W/cmd-$i" >"$W/out-$i.tmp" 2>&1
    echo "rc=$?" >>"$W/out-$i.tmp"
    mv "$W/out-$i.tmp" "$W/out-$i"
    i=$((i+1))
  else
    sleep 0.02
  fi
done
`

// sandboxAgent is a running sandbox driven through agentLoop.
type sandboxAgent struct {
	t  *testing.T
	fx *fixture
	p  *proc
	id string
	n  int
}

func startAgent(t *testing.T, fx *fixture, policy string, flags []string, env []string) *sandboxAgent {
	t.Helper()
	writeOwned(t, fx.m, filepath.Join(fx.W, "loop.sh"), []byte(agentLoop), 0o755)
	p := startCorral(t, fx, runOpts{args: []string{"/usr/bin/bash", filepath.Join(fx.W, "loop.sh")}, policy: policy,
		flags: append([]string{"--env", "W=" + fx.W}, flags...), env: env, timeout: 120 * time.Second})
	waitOut(t, p, "READY", 15*time.Second)
	a := &sandboxAgent{t: t, fx: fx, p: p}
	for _, e := range readEvents(t, p.audit) {
		if e["event"] == "sandbox.start" {
			a.id = fmt.Sprint(e["sandbox_id"])
		}
	}
	if a.id == "" {
		t.Fatalf("no sandbox.start in %s", p.audit)
	}
	return a
}

// run runs script inside the sandbox and returns its output, which ends
// with rc=N.
func (a *sandboxAgent) run(script string) string {
	a.t.Helper()
	a.n++
	writeOwned(a.t, a.fx.m, filepath.Join(a.fx.W, fmt.Sprintf("cmd-%d", a.n)), []byte(script), 0o644)
	out := filepath.Join(a.fx.W, fmt.Sprintf("out-%d", a.n))
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(out); err == nil {
			return string(b)
		}
		time.Sleep(10 * time.Millisecond)
	}
	a.t.Fatalf("command %d did not finish:\n%s\nstderr:\n%s", a.n, script, a.p.stderr)
	return ""
}

func (a *sandboxAgent) stop() *result {
	a.t.Helper()
	a.fx.signal(a.t, "stop")
	return a.p.wait()
}

// draft runs corral draft ... --sandbox ID as the mode's user.
func (a *sandboxAgent) draft(args ...string) (int, string) {
	a.t.Helper()
	return corralCLI(a.t, a.fx.m, append(append([]string{"draft"}, args...), "--state-dir", a.fx.state, "--sandbox", a.id)...)
}

// draftView is what corral draft --json lists.
type draftView struct {
	ID    string `json:"id"`
	State string `json:"state"`
	Chunk struct {
		Name   string          `json:"name"`
		Stage  int             `json:"stage"`
		Author string          `json:"author"`
		Policy json.RawMessage `json:"policy"`
		Wants  []struct {
			Host   string `json:"host"`
			Port   int    `json:"port"`
			Binary string `json:"binary"`
		} `json:"wants"`
	} `json:"chunk"`
	Guidance string `json:"guidance"`
}

func (a *sandboxAgent) drafts(all bool) []draftView {
	a.t.Helper()
	args := []string{"--json"}
	if all {
		args = append(args, "--all")
	}
	code, out := a.draft(args...)
	if code != 0 {
		a.t.Fatalf("corral draft: exit %d\n%s", code, out)
	}
	var list []draftView
	if err := json.Unmarshal([]byte(out), &list); err != nil && strings.TrimSpace(out) != "null" {
		a.t.Fatalf("corral draft --json: %v\n%s", err, out)
	}
	return list
}

// waitDraft waits for a pending draft for host:port by binary (any binary
// when empty; a prefix, since python3 is python3.N once resolved) at stage (any when 0) and returns it with how long it took.
func (a *sandboxAgent) waitDraft(host string, port, stage int, binary string, within time.Duration) (draftView, time.Duration) {
	a.t.Helper()
	start := time.Now()
	for time.Since(start) < within {
		for _, d := range a.drafts(false) {
			for _, w := range d.Chunk.Wants {
				if w.Host == host && w.Port == port && strings.HasPrefix(w.Binary, binary) && (stage == 0 || d.Chunk.Stage == stage) {
					return d, time.Since(start)
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	a.t.Fatalf("no pending draft for %s:%d (%s, stage %d) within %v\n%s", host, port, binary, stage, within, a.events())
	return draftView{}, 0
}

func (a *sandboxAgent) events() string {
	var b strings.Builder
	for _, e := range readEvents(a.t, a.p.audit) {
		j, _ := json.Marshal(e)
		b.Write(j)
		b.WriteByte('\n')
	}
	return b.String()
}

func (a *sandboxAgent) approve(ids ...string) {
	a.t.Helper()
	if code, out := a.draft(append([]string{"approve"}, ids...)...); code != 0 {
		a.t.Fatalf("corral draft approve %v: exit %d\n%s", ids, code, out)
	}
}

// body returns the JSON object curl printed after BODY.
func body(t *testing.T, out string) map[string]any {
	t.Helper()
	_, js, ok := strings.Cut(out, "BODY ")
	if !ok {
		t.Fatalf("no BODY in %q", out)
	}
	js, _, _ = strings.Cut(js, "\n")
	var m map[string]any
	if err := json.Unmarshal([]byte(js), &m); err != nil {
		t.Fatalf("body %q: %v", js, err)
	}
	return m
}

const advisorPolicy = `version: 1
filesystem_policy:
  read_only: [/usr, /lib, /lib64, /lib32, /bin, /sbin, /etc, /opt]
network:
  mode: proxy
`

func TestAdvisor(t *testing.T) {
	requireRoot(t)
	lab := netlab.Start(t,
		netlab.Host{Name: "adv.test", Addr: addrAdv},
		netlab.Host{Name: "undo.test", Addr: addrUndo},
		netlab.Host{Name: "rej.test", Addr: addrRej},
		netlab.Host{Name: "agent.test", Addr: addrAgent},
		netlab.Host{Name: "agent2.test", Addr: addrAgent2},
		netlab.Host{Name: "learn.test", Addr: addrLearn},
	)
	lab.AddRecord("learnpriv.test", netip.MustParseAddr("10.0.0.7"))
	forEachMode(t, false, func(t *testing.T, m *mode) {
		caFile := filepath.Join(newDir(t, m, "ca-"), "lab-ca.pem")
		if err := os.WriteFile(caFile, lab.CAPEM, 0o644); err != nil {
			t.Fatal(err)
		}
		flags := []string{"--upstream-dns", lab.DNS.String(), "--upstream-ca", caFile}

		t.Run("approve-refine-undo-reject", func(t *testing.T) {
			fx := newFixture(t, m)
			a := startAgent(t, fx, advisorPolicy, flags, nil)
			defer func() {
				if t.Failed() {
					t.Logf("audit:\n%s\nstderr:\n%s", a.events(), a.p.stderr)
				}
			}()
			get := `curl -sS -o /dev/null -w 'STATUS %{http_code}\n' http://adv.test/` + m.name + `/items/1; curl -sS http://adv.test/x | sed 's/^/BODY /'; echo`

			// Denied: the first 403 comes before any chunk exists.
			out := a.run(get)
			if !strings.Contains(out, "STATUS 403") {
				t.Fatalf("adv.test was not refused:\n%s", out)
			}
			d, took := a.waitDraft("adv.test", 80, 1, "/usr/bin/curl", 5*time.Second)
			t.Logf("first denial → visible draft: %v", took)
			if took > time.Second {
				t.Errorf("the draft appeared %v after the denial, want within 1s", took)
			}
			// The next 403 names it, and so does its denial event.
			out = a.run(get)
			b := body(t, out)
			if b["draft_chunk"] != d.ID || !strings.Contains(fmt.Sprint(b["next_steps"]), "corral draft approve "+d.ID) {
				t.Errorf("403 body does not name draft %s: %v", d.ID, b)
			}
			found := false
			for _, e := range readEvents(t, a.p.audit) {
				if e["event"] == "net.connect.denied" && e["host"] == "adv.test" && e["draft_chunk"] == d.ID {
					found = true
				}
			}
			if !found {
				t.Errorf("no net.connect.denied event names draft %s", d.ID)
			}

			// Approved: the same curl works in the same sandbox, in audit.
			a.approve(d.ID)
			for i := range 5 {
				out = a.run(fmt.Sprintf(`curl -sS http://adv.test/%s/items/%d`, m.name, i+1))
				if !strings.Contains(out, "hello from adv.test GET /"+m.name) {
					t.Fatalf("after approval the request failed:\n%s", out)
				}
			}
			// Five reads: a refined read-only chunk replaces the audit one.
			d2, _ := a.waitDraft("adv.test", 80, 2, "/usr/bin/curl", 5*time.Second)
			if code, out := a.draft("show", d2.ID); code != 0 || !strings.Contains(out, "access: read-only") || !strings.Contains(out, "replaces: "+d.ID) {
				t.Errorf("draft show %s: exit %d\n%s", d2.ID, code, out)
			}
			a.approve(d2.ID)
			out = a.run(`curl -sS -X POST -d x -w '\nSTATUS %{http_code}\n' http://adv.test/` + m.name + `/items`)
			if !strings.Contains(out, "STATUS 403") || !strings.Contains(out, "l7_") {
				t.Errorf("a write after the refined chunk was not refused:\n%s", out)
			}
			if out = a.run(`curl -sS http://adv.test/` + m.name + `/items/9`); !strings.Contains(out, "hello from adv.test GET") {
				t.Errorf("a read after the refined chunk failed:\n%s", out)
			}

			// Undo: the host is refused again.
			a.run(`curl -sS -o /dev/null http://undo.test/`)
			du, _ := a.waitDraft("undo.test", 80, 1, "/usr/bin/curl", 5*time.Second)
			a.approve(du.ID)
			if out = a.run(`curl -sS http://undo.test/` + m.name); !strings.Contains(out, "hello from undo.test") {
				t.Fatalf("undo.test after approval:\n%s", out)
			}
			if code, out := a.draft("undo", du.ID); code != 0 {
				t.Fatalf("draft undo: exit %d\n%s", code, out)
			}
			if out = a.run(`curl -sS -o /dev/null -w 'STATUS %{http_code}\n' http://undo.test/` + m.name + `/after-undo`); !strings.Contains(out, "STATUS 403") {
				t.Errorf("undo.test after undo:\n%s", out)
			}

			// Rejected twice for one host and port: nothing more is
			// proposed for it, whatever binary asks.
			a.run(`curl -sS -o /dev/null http://rej.test/`)
			r1, _ := a.waitDraft("rej.test", 80, 1, "/usr/bin/curl", 5*time.Second)
			if code, out := a.draft("reject", r1.ID, "--reason", "no"); code != 0 {
				t.Fatalf("reject: %d %s", code, out)
			}
			a.run(`python3 -c 'import urllib.request as u; u.urlopen("http://rej.test/")' 2>/dev/null`)
			r2, _ := a.waitDraft("rej.test", 80, 1, "/usr/bin/python3", 5*time.Second)
			if code, out := a.draft("reject", r2.ID, "--reason", "still no"); code != 0 {
				t.Fatalf("reject: %d %s", code, out)
			}
			a.run(`wget -q -O /dev/null http://rej.test/ ; curl -sS -o /dev/null http://rej.test/again`)
			time.Sleep(1500 * time.Millisecond)
			for _, d := range a.drafts(false) {
				if d.Chunk.Name != "" && strings.Contains(d.Chunk.Name, "rej_test") {
					t.Errorf("a draft for rej.test after two rejections: %+v", d)
				}
			}
			if code, out := a.draft("retry", "rej.test:80"); code != 0 || !strings.Contains(out, "new draft") {
				t.Errorf("draft retry: exit %d\n%s", code, out)
			}
			a.waitDraft("rej.test", 80, 1, "/usr/bin/wget", 2*time.Second)
			if code, out := a.draft("history"); code != 0 || !strings.Contains(out, "rejected") || !strings.Contains(out, "undone") {
				t.Errorf("draft history: exit %d\n%s", code, out)
			}
			// A policy cannot turn learn mode on in a running sandbox.
			learnOn := fx.writePolicy(t, advisorPolicy+"  learn: true\n")
			if code, out := corralCLI(t, m, "policy", "set", "--state-dir", fx.state, "--sandbox", a.id, learnOn); code == 0 || !strings.Contains(out, "network.learn") {
				t.Errorf("policy set turned learn mode on: exit %d\n%s", code, out)
			}
			if out = a.run(`curl -sS -o /dev/null -w 'STATUS %{http_code}\n' http://rej.test/after-set`); !strings.Contains(out, "STATUS 403") {
				t.Errorf("rej.test after the refused policy set:\n%s", out)
			}
			// Proposing for a denial asks no upstream resolver about the
			// name: DNS must not carry what a workload was refused.
			for _, q := range lab.DNSQueries() {
				if q == "rej.test" {
					t.Errorf("the lab's DNS server was asked about rej.test, which nothing allowed")
				}
			}
			r := a.stop()
			for _, ev := range []string{"draft.proposed", "draft.approved", "draft.rejected", "draft.undone"} {
				if len(r.find(ev)) == 0 {
					t.Errorf("no %s event", ev)
				}
			}
		})

		t.Run("expiry", func(t *testing.T) {
			fx := newFixture(t, m)
			a := startAgent(t, fx, advisorPolicy, flags, []string{"CORRAL_DRAFT_TTL=1s"})
			a.run(`curl -sS -o /dev/null http://adv.test/`)
			d, _ := a.waitDraft("adv.test", 80, 1, "", 5*time.Second)
			deadline := time.Now().Add(5 * time.Second)
			for {
				var state string
				for _, x := range a.drafts(true) {
					if x.ID == d.ID {
						state = x.State
					}
				}
				if state == "expired" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("draft %s is %s 5s after a 1s TTL", d.ID, state)
				}
				time.Sleep(100 * time.Millisecond)
			}
			if code, out := a.draft("approve", d.ID); code == 0 {
				t.Errorf("an expired draft was approved:\n%s", out)
			}
			r := a.stop()
			r.requireEvent(t, "draft.expired", map[string]any{"draft": d.ID})
		})

		t.Run("policy-local", func(t *testing.T) {
			fx := newFixture(t, m)
			a := startAgent(t, fx, advisorPolicy, flags, nil)
			defer func() {
				if t.Failed() {
					t.Logf("audit:\n%s\nstderr:\n%s", a.events(), a.p.stderr)
				}
			}()
			out := a.run(`head -c 200 /run/corral/skills/policy-advisor.md; echo; curl -sS http://policy.local/v1/skill | head -1`)
			if strings.Count(out, "# Skill: getting network access approved") != 2 {
				t.Errorf("skill file and /v1/skill:\n%s", out)
			}
			a.run(`curl -sS -o /dev/null http://agent.test/`)
			a.waitDraft("agent.test", 80, 1, "", 5*time.Second)
			out = a.run(`curl -sS http://policy.local/v1/denials?last=5; curl -sS http://policy.local/v1/drafts`)
			if !strings.Contains(out, `"host": "agent.test"`) || !strings.Contains(out, "draft_agent_test_80_curl") {
				t.Errorf("denials and drafts from policy.local:\n%s", out)
			}
			// The agent proposes a narrower chunk and waits on it.
			propose := func(host string) string {
				return `curl -sS http://policy.local/v1/proposals -d '{"addition": "network_policies:\n  ` + strings.ReplaceAll(host, ".", "_") +
					`_read:\n    endpoints:\n      - host: ` + host + `\n        port: 80\n        protocol: rest\n        access: read-only\n    binaries:\n      - path: /usr/bin/curl\n", "intent": "read ` + host + `"}'`
			}
			out = a.run(propose("agent.test"))
			var resp struct {
				Draft struct {
					ID     string `json:"id"`
					Author string `json:"author"`
				} `json:"draft"`
				Wait string `json:"wait"`
			}
			if err := json.Unmarshal([]byte(strings.TrimSuffix(strings.TrimSpace(out), "rc=0")), &resp); err != nil || resp.Draft.ID == "" || resp.Draft.Author != "agent" {
				t.Fatalf("proposal: %v\n%s", err, out)
			}
			// A proposal changes nothing by itself.
			if out = a.run(`curl -sS -o /dev/null -w 'STATUS %{http_code}\n' http://agent.test/` + m.name + `/before`); !strings.Contains(out, "STATUS 403") {
				t.Errorf("agent.test before anyone approved the proposal:\n%s", out)
			}
			a.run(`(curl -sS "` + resp.Wait + `?timeout=60s" >"$W/wait1.json"; mv "$W/wait1.json" "$W/wait1.done") >/dev/null 2>&1 &`)
			time.Sleep(300 * time.Millisecond)
			if _, err := os.Stat(filepath.Join(fx.W, "wait1.done")); err == nil {
				t.Fatal("the wait returned before anyone approved")
			}
			a.approve(resp.Draft.ID)
			w := waitFile(t, filepath.Join(fx.W, "wait1.done"), 5*time.Second)
			if !strings.Contains(w, `"approved": true`) || !strings.Contains(w, `"loaded_version"`) {
				t.Errorf("wait after approval:\n%s", w)
			}
			if out = a.run(`curl -sS http://agent.test/` + m.name); !strings.Contains(out, "hello from agent.test") {
				t.Errorf("agent.test after the agent's chunk was approved:\n%s", out)
			}

			// Rejected with guidance: the waiting agent gets it.
			a.run(`curl -sS -o /dev/null http://agent2.test/`)
			a.waitDraft("agent2.test", 80, 1, "", 5*time.Second)
			out = a.run(propose("agent2.test"))
			if err := json.Unmarshal([]byte(strings.TrimSuffix(strings.TrimSpace(out), "rc=0")), &resp); err != nil || resp.Draft.ID == "" {
				t.Fatalf("proposal: %v\n%s", err, out)
			}
			a.run(`(curl -sS "` + resp.Wait + `?timeout=60s" >"$W/wait2.json"; mv "$W/wait2.json" "$W/wait2.done") >/dev/null 2>&1 &`)
			time.Sleep(200 * time.Millisecond)
			if code, out := a.draft("reject", resp.Draft.ID, "--reason", "not this host", "--guidance", "use the mirror at agent.test"); code != 0 {
				t.Fatalf("reject: %d\n%s", code, out)
			}
			w = waitFile(t, filepath.Join(fx.W, "wait2.done"), 5*time.Second)
			if !strings.Contains(w, `"approved": false`) || !strings.Contains(w, "use the mirror at agent.test") {
				t.Errorf("wait after rejection:\n%s", w)
			}

			// An invalid proposal is refused with its reason; past five a
			// minute, proposals are refused outright.
			out = a.run(`curl -sS -w '\nSTATUS %{http_code}\n' http://policy.local/v1/proposals -d '{"addition": "network_policies:\n  x:\n    endpoints: [{host: never-denied.test, port: 22}]\n"}'`)
			if !strings.Contains(out, "STATUS 422") || !strings.Contains(out, "invalid") {
				t.Errorf("invalid proposal:\n%s", out)
			}
			out = a.run(`for i in 1 2 3 4; do curl -sS -o /dev/null -w '%{http_code}\n' http://policy.local/v1/proposals -d '{"addition": "network_policies: {}"}'; done`)
			if !strings.Contains(out, "429") {
				t.Errorf("proposals past the rate limit were not refused:\n%s", out)
			}
			r := a.stop()
			r.requireEvent(t, "policy.proposal_refused", map[string]any{"author": "agent"})
		})

		t.Run("probe", func(t *testing.T) {
			fx := newFixture(t, m)
			// Off by default: the refused name never reaches the resolver.
			a := startAgent(t, fx, advisorPolicy, flags, nil)
			a.run(`curl -sS -o /dev/null http://learnpriv.test/`)
			d, _ := a.waitDraft("learnpriv.test", 80, 1, "", 5*time.Second)
			if strings.Contains(string(d.Chunk.Policy), "10.0.0.7") {
				t.Errorf("without --advisor-probe the draft knows the address: %s", d.Chunk.Policy)
			}
			a.stop()
			// With it, the draft allows exactly the address the name has.
			fx = newFixture(t, m)
			a = startAgent(t, fx, advisorPolicy, append([]string{"--advisor-probe"}, flags...), nil)
			a.run(`curl -sS -o /dev/null http://learnpriv.test/`)
			deadline := time.Now().Add(5 * time.Second)
			for {
				d, _ = a.waitDraft("learnpriv.test", 80, 1, "", 5*time.Second)
				if strings.Contains(string(d.Chunk.Policy), "10.0.0.7/32") || time.Now().After(deadline) {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if !strings.Contains(string(d.Chunk.Policy), "10.0.0.7/32") {
				t.Errorf("with --advisor-probe the draft has no allowed_ips for the private address: %s", d.Chunk.Policy)
			}
			a.stop()
		})

		t.Run("learn", func(t *testing.T) {
			fx := newFixture(t, m)
			a := startAgent(t, fx, advisorPolicy, append([]string{"--learn"}, flags...), nil)
			if !strings.Contains(a.p.stderr.String(), "LEARN MODE") {
				t.Errorf("no learn mode warning on stderr:\n%s", a.p.stderr)
			}
			out := a.run(`curl -sS http://learn.test/` + m.name + `/learned; echo; curl -sS -o /dev/null -w 'STATUS %{http_code}\n' http://learnpriv.test/`)
			if !strings.Contains(out, "hello from learn.test GET /"+m.name+"/learned") {
				t.Fatalf("learn mode did not let learn.test through:\n%s", out)
			}
			// Learn mode never opens what the dialer refuses.
			if !strings.Contains(out, "STATUS 403") {
				t.Errorf("learn mode let a name with a private address through:\n%s", out)
			}
			d, _ := a.waitDraft("learn.test", 80, 1, "/usr/bin/curl", 5*time.Second)
			// Audit-mode chunks carry a security note: --all alone keeps them.
			if code, _ := a.draft("approve", "--all"); code == 0 {
				t.Errorf("approve --all approved a flagged draft")
			}
			if code, out := a.draft("approve", "--all", "--include-flagged"); code != 0 {
				t.Fatalf("approve --all --include-flagged: %d\n%s", code, out)
			}
			var learned json.RawMessage
			for _, x := range a.drafts(true) {
				if x.ID == d.ID {
					if x.State != "approved" {
						t.Fatalf("draft %s is %s", d.ID, x.State)
					}
					learned = x.Chunk.Policy
				}
			}
			r := a.stop()
			r.requireEvent(t, "net.connect.allowed", map[string]any{"host": "learn.test", "decision": "learn"})
			r.requireEvent(t, "net.connect.denied", map[string]any{"host": "learnpriv.test", "reason": "internal_address"})

			// The learned chunk is a policy a run without learn mode passes.
			pol := advisorPolicy + "network_policies:\n  learned: " + string(learned) + "\n"
			fx2 := newFixture(t, m)
			r2 := runCorral(t, fx2, runOpts{args: []string{"/usr/bin/curl", "-sS", "http://learn.test/" + m.name + "/second"}, policy: pol, flags: flags})
			if r2.code != 0 || !strings.Contains(r2.stdout, "hello from learn.test GET /"+m.name+"/second") {
				t.Errorf("second run with the learned policy:\n%s", r2)
			}
		})
	})
}

// waitFile waits for path and returns its content.
func waitFile(t *testing.T, path string, within time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(path); err == nil {
			return string(b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s did not appear within %v", path, within)
	return ""
}

// draftSpoofBody writes the proposal of red-team finding rt-fs 7: an intent
// that erases the lines above it, prints a reassuring summary, writes the
// reviewer's clipboard (OSC 52) and starts a "security notes" line of its
// own.
const draftSpoofBody = `import json
intent = "need it\x1b[2K\x1b[1A\x1b[2K\x1b[1A\x1b[2K\r\x1b[32mSAFE: read-only GET on spoof.test/docs only\x1b[0m\x1b]52;c;ZWNobyBwd25lZAo=\x07\nsecurity notes: none"
add = "network_policies:\n  ex:\n    endpoints:\n      - host: spoof.test\n        port: 80\n    binaries:\n      - path: /usr/bin/curl\n"
open("/tmp/body.json", "w").write(json.dumps({"addition": add, "intent": intent}))
`

// TestDraftShowEscapesWorkloadText: what the workload writes reaches the
// reviewer's corral draft and corral draft show as visible escapes, not as
// terminal control sequences: an agent's intent, and the path of an
// executable it named with escape sequences (in its denial's draft).
func TestDraftShowEscapesWorkloadText(t *testing.T) {
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		requireFeature(t, "needs /usr/bin/python3 inside the sandbox")
	}
	fx := newFixture(t, getRootMode(t))
	writeOwned(t, fx.m, filepath.Join(fx.W, "mk.py"), []byte(draftSpoofBody), 0o644)
	a := startAgent(t, fx, "", nil, nil)
	defer a.stop()
	// The proposal must answer a denial of the curl that sends it.
	a.run(`B="$W/$(printf 'cu\033]52;c;cHduZWQK\007\033[2Krl')"; cp /usr/bin/curl "$B" && "$B" -s -m 3 -o /dev/null http://spoof.test/; curl -s -m 3 -o /dev/null http://spoof.test/`)
	denied, _ := a.waitDraft("spoof.test", 80, 0, fx.W+"/cu\x1b", 15*time.Second)
	out := a.run(`python3 "$W/mk.py" && curl -s -m 5 http://policy.local/v1/proposals --data-binary @/tmp/body.json`)
	m := regexp.MustCompile(`"id": "([0-9a-f]+)"`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("proposal not accepted:\n%s", out)
	}
	for _, args := range [][]string{{}, {"show", denied.ID}, {"show", m[1]}} {
		code, out := a.draft(args...)
		if code != 0 {
			t.Fatalf("corral draft %q: exit %d\n%q", args, code, out)
		}
		if strings.ContainsAny(out, "\x1b\x07") {
			t.Errorf("corral draft %q prints the workload's terminal control sequences:\n%q", args, out)
		}
		if want := `cu\x1b]52;c;cHduZWQK\a\x1b[2Krl`; len(args) < 2 || args[1] == denied.ID {
			if !strings.Contains(out, want) {
				t.Errorf("corral draft %q does not show the binary as %s:\n%q", args, want, out)
			}
		}
	}
}
