package audit

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/events.golden")

// TestEventFieldsGolden pins every event's name and field names, which
// are corral's interface: a change here breaks whoever reads the trail.
// Run with -update only when that break is intended.
// Observers see every event, typed, through every Logger sharing the sink,
// even those the rate limit leaves out of the trail.
func TestObserve(t *testing.T) {
	var buf bytes.Buffer
	root := New(&buf)
	l := root.For("sb", "s")
	var seen []Event
	root.Observe(func(e Event) { seen = append(seen, e) })
	const n = 100
	for range n {
		l.Log(NetDNSDeniedEvent{Name: "x.test", QType: "A", Reason: "not_allowed", Count: 1})
	}
	if len(seen) != n {
		t.Fatalf("observer saw %d events, want %d", len(seen), n)
	}
	if e, ok := seen[0].(NetDNSDeniedEvent); !ok || e.Name != "x.test" {
		t.Errorf("observer got %#v", seen[0])
	}
	if lines := bytes.Count(buf.Bytes(), []byte("\n")); lines >= n {
		t.Errorf("the rate limit wrote %d of %d repeated events; the test needs it to leave some out", lines, n)
	}
}

func TestEventFieldsGolden(t *testing.T) {
	events := []Event{
		SandboxStartEvent{Summary: "cage[x]", PolicySHA256: "ab", PolicyCommit: "0a1b", PID: 7, Argv: []string{"sh"}, Workdir: "/w", UID: 1000, GID: 1000,
			Rootless: true, LandlockABI: 6, Seccomp: "default", Network: "proxy", LimitsEnforced: true, Connects: "kernel"},
		SandboxStartUncagedEvent{Reason: "sandbox: disabled", PolicySHA256: "ab", PID: 7, Argv: []string{"sh"}, Workdir: "/w"},
		SandboxExitEvent{Code: 1, DurationMS: 20},
		SandboxKilledEvent{Reason: "walltime_exceeded"},
		SandboxKilledEvent{Reason: "signal", Signal: "SIGKILL"},
		SandboxLimitsNotEnforcedEvent{Reason: "no cgroups", Limits: []string{"memory 1GiB"}},
		SandboxCompileErrorEvent{Error: "bad", Policy: "p.yaml"},
		SandboxSetupErrorEvent{Step: "mount", Error: "EPERM", Code: 125},
		SandboxStaleSweptEvent{StaleSandboxID: "old"},
		SandboxDegradedEvent{What: "landlock", Reason: "unavailable"},
		NetConnectEvent{Outcome: OutcomeAllowed, Via: "transparent", Source: "198.19.255.254:4000", Host: "a.test", Port: 443,
			Binary: "/usr/bin/curl", PID: 9, Ancestors: []string{"/usr/bin/bash"}, CmdlinePaths: []string{}, Policy: "p", DecisionUS: 12},
		NetConnectEvent{Outcome: OutcomeDenied, Via: "http_connect", Source: "198.19.255.254:4001", IP: "203.0.113.9", Port: 80,
			Binary: "/usr/bin/python3", PID: 9, Untrusted: "started with LD_PRELOAD", Reason: "no_matching_policy", Detail: "no policy"},
		NetConnectEvent{Outcome: OutcomeFailed, Via: "http_forward", Host: "nx.test", Port: 80, Reason: "upstream_dns_failed", Detail: "nxdomain"},
		NetConnectEvent{Outcome: OutcomeRevoked, Via: "transparent", Host: "a.test", Port: 7000, Reason: "no_matching_policy", Detail: "gone"},
		NetAdmissionDeniedEvent{Via: "transparent", Source: "198.19.255.254:4002", Reason: "connection_limit", Detail: "full", Active: 1024, Limit: 1024},
		NetDNSDeniedEvent{Name: "x.test", QType: "A", Source: "198.19.255.254:53", Reason: "not_allowed", Count: 1},
		HTTPRequestEvent{Via: "transparent", Host: "a.test", Port: 443, Scheme: "https", Proto: "HTTP/2.0", Method: "GET", Path: "/",
			Decision: "audit", Policy: "p", Rule: "r", Status: 200, Bytes: 3, BytesOut: 3, DurationMS: 1, Binary: "/usr/bin/curl", PID: 9,
			Masked: 1, Reason: "l7_no_matching_rule", Detail: "no rule", WouldDeny: true},
		TLSHandshakeFailedEvent{Via: "transparent", Host: "a.test", Port: 443, Binary: "/usr/bin/java", PID: 9,
			Cause: "client_does_not_trust_sandbox_ca", Detail: "bad certificate", NextSteps: "trust it"},
		PolicyReloadedEvent{Source: "new.yaml", Version: 2, PolicySHA256: "cd"},
		PolicyReloadFailedEvent{Source: "bad.yaml", Version: 2, Error: "invalid"},
		InferenceRequestEvent{Route: "local", Protocol: "openai_chat_completions", ClientModel: "gpt-x", RoutedModel: "llama",
			Status: 200, DurationMS: 900, TTFBMS: 40, InputTokens: 12, OutputTokens: 30, BytesIn: 200, BytesOut: 800, Binary: "/usr/bin/node", PID: 9},
		NetConnectEvent{Outcome: OutcomeDenied, Via: "transparent", Host: "b.test", Port: 443, Binary: "/usr/bin/curl",
			Reason: "no_matching_policy", DraftChunk: "0a1b2c3d", NextSteps: "corral draft approve 0a1b2c3d"},
		NetConnectEvent{Outcome: OutcomeAllowed, Via: "transparent", Host: "c.test", Port: 443, Binary: "/usr/bin/curl", Decision: DecisionLearn},
		DraftEvent{Name: DraftProposed, Draft: "0a1b2c3d", Policy: "draft_b_test_443_curl", Author: "advisor", Stage: 1,
			Verdict: "broad", Summary: "b.test × ports 443 × /usr/bin/curl × GET"},
		DraftEvent{Name: DraftApproved, Draft: "0a1b2c3d", Policy: "draft_b_test_443_curl", Author: "advisor", Stage: 1,
			Verdict: "broad", Summary: "s", Actor: "alice", Version: 2, PolicySHA256: "ef"},
		DraftEvent{Name: DraftRejected, Draft: "0a1b2c3d", Policy: "p", Author: "agent", Stage: 1, Verdict: "narrow", Summary: "s", Actor: "alice", Reason: "too wide"},
		DraftEvent{Name: DraftExpired, Draft: "0a1b2c3d", Policy: "p", Author: "advisor", Stage: 1, Verdict: "broad", Summary: "s"},
		DraftEvent{Name: DraftUndone, Draft: "0a1b2c3d", Policy: "p", Author: "advisor", Stage: 2, Verdict: "narrow", Summary: "s", Actor: "alice", Version: 4, PolicySHA256: "ab"},
		PolicyProposalRefusedEvent{Author: "agent", Policy: "p", Reason: "port 22 was not denied", Binary: "/usr/bin/python3", PID: 9},
	}
	var buf bytes.Buffer
	l := New(&buf).For("sb", "default")
	for _, e := range events {
		l.Log(e)
	}
	// The time varies; everything else is the interface.
	var out bytes.Buffer
	for _, line := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		if _, ok := m[FieldTime]; !ok {
			t.Fatalf("event without %s: %s", FieldTime, line)
		}
		delete(m, FieldTime)
		b, _ := json.Marshal(m) // keys sorted
		out.Write(append(b, '\n'))
	}
	path := filepath.Join("testdata", "events.golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create)", err)
	}
	if !bytes.Equal(out.Bytes(), want) {
		t.Errorf("audit events differ from %s (run with -update if the change is intended):\n%s", path, out.String())
	}
}
