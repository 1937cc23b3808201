package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/advisor/check"
	"github.com/corral-sandbox/corral/internal/advisor/drafts"
	"github.com/corral-sandbox/corral/internal/advisor/policylocal"
	"github.com/corral-sandbox/corral/internal/advisor/propose"
	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/corral-sandbox/corral/internal/sandbox"
)

const (
	// hostileIntent is what red-team finding rt-fs 7 had an agent send to
	// policy.local: erase the lines above, print a reassuring summary,
	// write the reviewer's clipboard (OSC 52) and start a line of its own.
	hostileIntent = "need it\x1b[2K\x1b[1A\x1b[2K\r\x1b[32mSAFE: read-only GET only\x1b[0m\x1b]52;c;ZWNobyBwd25lZAo=\x07\nsecurity notes: none"
	// hostileBinary is an executable the workload named itself: OSC 52,
	// erase line, a C1 CSI and a right-to-left override.
	hostileBinary = "/tmp/cu\x1b]52;c;cHduZWQK\x07\x1b[2Krl\u009b2J\u202egnp.sh"
)

// terminalActs fails t for each hostile character left in out that a
// terminal would act on rather than show; newlines are the output's own.
func terminalActs(t *testing.T, out string) {
	t.Helper()
	for _, c := range []string{"\x1b", "\x07", "\r", "\u009b", "\u202e"} {
		if strings.Contains(out, c) {
			t.Errorf("output carries %q from the workload:\n%q", c, out)
		}
	}
}

func hostileDraft() sandbox.DraftDetail {
	c := propose.Chunk{
		ID: "0123456789", Name: "ex", Author: propose.AuthorAgent, Stage: propose.StageInitial, Confidence: 0.5,
		Rationale: "proposed by the agent: " + hostileIntent, Intent: hostileIntent,
		Policy: policy.NetworkPolicy{
			Endpoints: []policy.Endpoint{{Host: "rtfs-spoof.test", Port: 80}},
			Binaries:  []policy.Binary{{Path: hostileBinary}},
		},
		SecurityNotes: []string{hostileBinary + " is an interpreter: any script it runs gets this access"},
		Wants:         []propose.Want{{Host: "rtfs-spoof.test", Port: 80, Binary: hostileBinary}},
	}
	return sandbox.DraftDetail{
		Draft: drafts.Draft{ID: c.ID, Chunk: c, State: drafts.Pending, Created: time.Now(), Expires: time.Now().Add(time.Hour),
			Check: check.Result{Verdict: check.Broad, Summary: check.Summary{Hosts: []string{"rtfs-spoof.test"}, Ports: []int{80},
				Binaries: []string{hostileBinary}, Requests: []string{"any traffic"}}}},
		Entries: []policylocal.Denial{{Host: "rtfs-spoof.test", Port: 80, Binary: hostileBinary, Count: 1,
			Reason: "no_matching_policy", Cmdline: hostileBinary + " http://rtfs-spoof.test/\x1b[2J"}},
		History: []drafts.Transition{{At: time.Now(), Draft: c.ID, To: drafts.Pending, Actor: drafts.Actor{UID: -1, User: "agent"},
			Reason: "proposed\x1b]0;title\x07"}},
	}
}

// TestShowDraftEscapesWorkloadText: corral draft show prints what the
// agent and the workload wrote (intent, rationale, binary paths in the
// summary, YAML, notes and denials) as visible escapes, on the lines
// corral puts it on.
func TestShowDraftEscapesWorkloadText(t *testing.T) {
	var b bytes.Buffer
	if err := showDraft(&b, hostileDraft()); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	terminalActs(t, out)
	for _, want := range []string{
		`the agent's intent: need it\x1b[2K\x1b[1A\x1b[2K\r\x1b[32mSAFE: read-only GET only\x1b[0m\x1b]52;c;ZWNobyBwd25lZAo=\a\nsecurity notes: none` + "\n",
		`allows:  rtfs-spoof.test × ports 80 × /tmp/cu\x1b]52;c;cHduZWQK\a\x1b[2Krl\u009b2J\u202egnp.sh × any traffic`,
		`  $ /tmp/cu\x1b]52;c;cHduZWQK\a\x1b[2Krl\u009b2J\u202egnp.sh http://rtfs-spoof.test/\x1b[2J`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("draft show lacks %q:\n%q", want, out)
		}
	}
	// The only security notes section is corral's, not the one the intent
	// tried to start on a line of its own.
	if n := strings.Count(out, "\nsecurity notes:"); n != 1 {
		t.Errorf("%d lines start with \"security notes:\", want 1:\n%q", n, out)
	}
}

// TestDraftTableEscapesBinary: corral draft (the list) shows a binary the
// workload named in its BINARY column, escaped.
func TestDraftTableEscapesBinary(t *testing.T) {
	var b bytes.Buffer
	if err := draftTable(&b, []sandbox.DraftDetail{hostileDraft()}, true); err != nil {
		t.Fatal(err)
	}
	terminalActs(t, b.String())
	if want := `/tmp/cu\x1b]52;c;cHduZWQK\a\x1b[2Krl\u009b2J\u202egnp.sh`; !strings.Contains(b.String(), want) {
		t.Errorf("draft list lacks %q:\n%q", want, b.String())
	}
}

// TestDraftExportNoteEscaped: the comment draft export writes above an
// agent's chunk quotes its intent escaped, so the diff (and the policy
// file it is applied to) carries no control characters.
func TestDraftExportNoteEscaped(t *testing.T) {
	dir := t.TempDir()
	store, err := drafts.Open(dir, drafts.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := hostileDraft().Chunk
	c.Intent = "fetch\x1b[2K\rdocs"
	c.Rationale = "proposed by the agent: " + c.Intent
	d, err := store.Add(c, check.Result{Verdict: check.Broad}, drafts.Actor{UID: -1, User: "agent"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Approve(d.ID, drafts.Actor{UID: 0, User: "root"}, "ok"); err != nil {
		t.Fatal(err)
	}
	chunks, err := approvedChunks(dir, "s1")
	if err != nil {
		t.Fatal(err)
	}
	var notes []string
	for _, c := range chunks {
		notes = append(notes, c.Note)
	}
	if want := "corral draft " + d.ID + `: proposed by the agent: fetch\x1b[2K\rdocs`; len(notes) != 1 || notes[0] != want {
		t.Errorf("notes %q, want one %q", notes, want)
	}
}
