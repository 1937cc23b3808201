package cli

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-sandbox/corral/internal/advisor/drafts"
	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/control"
	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/corral-sandbox/corral/internal/policy/gitsrc"
	"github.com/corral-sandbox/corral/internal/sandbox"
	"github.com/corral-sandbox/corral/internal/statedir"
	"github.com/corral-sandbox/corral/internal/termsafe"
)

// exportPath is the file a diff against the built-in default creates.
const exportPath = ".corral/policy.yaml"

func init() { draftCmd.AddCommand(newDraftExportCmd()) }

type exportFlags struct {
	session, policy, out, auditLog string
}

func newDraftExportCmd() *cobra.Command {
	var f exportFlags
	cmd := &cobra.Command{
		Use:   "export [--sandbox ID | --session NAME] [--policy SPEC] [-o FILE]",
		Short: "Write the approved chunks as a diff of the policy file, for review in git",
		Long: `Write the approved drafts of a sandbox's session as a unified diff that adds
them under network_policies of the policy file the sandbox started from, ready
for 'git apply' on a branch and review. Nothing else in the file changes.

--policy names that file as corral run was given it: a path, git:REF:PATH
(read at the commit the sandbox's sandbox.start audit event records, so a
branch that moved since does not matter), or nothing for the built-in
default, in which case the diff creates .corral/policy.yaml. A policy that
differs from the one the sandbox started with (by its sha256 in the audit
log) is reported. Paths in the diff are from the top of the repository
holding the file.

The drafts are read from the session's state, so this works after the
sandbox has exited; with no running sandbox, --session (default "default")
picks them.`,
		Example: `  corral draft export --policy git:origin/main:.corral/policy.yaml -o allow.diff
  git switch -c more-hosts && git apply allow.diff`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return draftExport(cmd, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.session, "session", "", "session whose drafts to export (default: the running sandbox's, else \"default\")")
	fl.StringVar(&f.policy, "policy", "", "the policy the sandbox ran with: a path or git:REF:PATH (default: the built-in default)")
	fl.StringVarP(&f.out, "output", "o", "", "write the diff to FILE instead of standard output")
	fl.StringVar(&f.auditLog, "audit-log", "", "audit log the sandbox wrote (default: the state directory's)")
	return cmd
}

func draftExport(cmd *cobra.Command, f exportFlags) error {
	state := orStateDir(draftFlags.stateDir)
	id, session, err := exportTarget(cmd.Context(), state, draftFlags.sandbox, f.session)
	if err != nil {
		return &exitError{code: 2, err: err}
	}
	auditLog := cmp.Or(f.auditLog, statedir.AuditLog(state))
	start, err := lastStart(auditLog, id, session)
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	session = cmp.Or(session, start.Session)
	chunks, err := approvedChunks(sandbox.DraftsDir(state, session), session)
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	base, path, source, err := exportBase(f.policy, start.PolicyCommit)
	if err != nil {
		return &exitError{code: 2, err: err}
	}
	if err := checkBase(cmd, start, f.policy, base, source); err != nil {
		return &exitError{code: 2, err: err}
	}
	after, err := gitsrc.AddNetworkPolicies(base, chunks)
	if err != nil {
		return &exitError{code: 1, err: fmt.Errorf("add the approved chunks to %s: %w", orDefault(source), err)}
	}
	diff, err := gitsrc.UnifiedDiff(path, base, after)
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	w := cmd.OutOrStdout()
	if f.out != "" {
		if err := os.WriteFile(f.out, []byte(diff), 0o644); err != nil {
			return &exitError{code: 1, err: fmt.Errorf("write the diff: %w", err)}
		}
		w = cmd.ErrOrStderr()
		fmt.Fprintf(w, "wrote %s\n", f.out)
	} else {
		fmt.Fprint(w, diff)
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "%d approved chunk(s) of session %s added to %s (from %s)\n", len(chunks), session, path, orDefault(source))
	return nil
}

// checkBase warns when the base is not the policy the sandbox started
// with, as far as its sandbox.start tells.
func checkBase(cmd *cobra.Command, start startRecord, spec string, base []byte, source string) error {
	switch {
	case start.SandboxID == "":
		return nil
	case gitsrc.IsSpec(spec):
		// Read at the recorded commit, it is the file the sandbox ran with.
		if start.PolicyCommit == "" {
			fmt.Fprintf(cmd.ErrOrStderr(), "warning: sandbox %s did not start with a policy from git: pass the --policy it ran with\n", start.SandboxID)
		}
		return nil
	}
	sha := policy.Default().SHA256()
	if len(base) > 0 {
		p, err := policy.Parse(base, source)
		if err != nil {
			return fmt.Errorf("load policy %s: %w", source, err)
		}
		sha = p.SHA256()
	}
	if sha != start.PolicySHA256 {
		fmt.Fprintf(cmd.ErrOrStderr(), "warning: sandbox %s started with policy sha256 %s, but %s is %s: pass the --policy it ran with (run flags such as --learn also change it)\n",
			start.SandboxID, start.PolicySHA256, orDefault(source), sha)
	}
	return nil
}

// exportTarget returns the sandbox and session whose drafts to export:
// --session as given, else the session of the sandbox --sandbox names or
// of the only one running, else "default".
func exportTarget(ctx context.Context, state, id, session string) (string, string, error) {
	if session != "" {
		if !validSession(session) {
			return "", "", fmt.Errorf("--session %q: use 1-64 letters, digits, '.', '_' or '-'", session)
		}
		return id, session, nil
	}
	running, err := findSandbox(ctx, state, id)
	if err != nil {
		if id != "" {
			return "", "", err
		}
		return "", "default", nil
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := control.Call(cctx, state, running, control.Request{Op: control.OpStatus})
	if err == nil && resp.Status != nil {
		return running, resp.Status.Session, nil
	}
	if id == "" {
		return "", "", fmt.Errorf("sandbox %s: %v", running, err)
	}
	// An exited sandbox: its session is in its audit events; the caller
	// finds them by id.
	return id, "", nil
}

// startRecord is what export reads of a sandbox.start event.
type startRecord struct {
	SandboxID    string `json:"sandbox_id"`
	Session      string `json:"session"`
	PolicySHA256 string `json:"policy_sha256"`
	PolicyCommit string `json:"policy_commit"`
}

// lastStart returns the last sandbox.start of sandbox id (or, without
// one, of session) in the audit log, or a zero record if there is none.
// With an id but no session it also fills in the session.
func lastStart(auditLog, id, session string) (startRecord, error) {
	var last startRecord
	f, err := os.Open(auditLog)
	if errors.Is(err, fs.ErrNotExist) && id == "" {
		return last, nil
	}
	if err != nil {
		return last, fmt.Errorf("no sandbox.start of sandbox %s (%w): name its session with --session (and the audit log with --audit-log)", id, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 4<<20)
	marker := []byte(`"` + audit.FieldEvent + `":"sandbox.start"`)
	for sc.Scan() {
		line := sc.Bytes()
		if !strings.Contains(string(line), string(marker)) {
			continue
		}
		var r startRecord
		if json.Unmarshal(line, &r) != nil {
			continue
		}
		if id != "" && r.SandboxID == id || id == "" && r.Session == session {
			last = r
		}
	}
	if err := sc.Err(); err != nil {
		return last, fmt.Errorf("read %s: %w", auditLog, err)
	}
	if id != "" && last.SandboxID == "" {
		return last, fmt.Errorf("no sandbox.start of sandbox %s in %s: name its session with --session (and the audit log with --audit-log)", id, auditLog)
	}
	return last, nil
}

// approvedChunks reads the approved drafts of a session, the newest of
// each network_policies name.
func approvedChunks(dir, session string) ([]gitsrc.Chunk, error) {
	if _, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("no drafts for session %s (%w)", session, err)
	}
	store, err := drafts.Open(dir, drafts.Options{})
	if err != nil {
		return nil, err
	}
	list, err := store.List()
	if err != nil {
		return nil, fmt.Errorf("read the drafts of session %s: %w", session, err)
	}
	var chunks []gitsrc.Chunk
	seen := map[string]bool{}
	for _, d := range list { // newest first
		if d.State != drafts.Approved || seen[d.Chunk.Name] {
			continue
		}
		seen[d.Chunk.Name] = true
		note := "corral draft " + d.ID
		// An agent's rationale carries its intent: escaped, it can neither
		// put control characters into the policy file (and onto the
		// terminal showing the diff) nor break out of the comment.
		if r, _, _ := strings.Cut(d.Chunk.Rationale, "\n"); r != "" {
			note += ": " + termsafe.Line(r)
		}
		chunks = append(chunks, gitsrc.Chunk{Name: d.Chunk.Name, Policy: d.Chunk.Policy, Note: note})
	}
	if len(chunks) == 0 {
		return nil, fmt.Errorf("session %s has no approved drafts: approve them first (corral draft approve)", session)
	}
	return chunks, nil
}

// exportBase returns the content of the policy file spec names (empty for
// the built-in default), its path from the top of its repository, and the
// source to name it by. A git: spec is read at commit when the sandbox's
// start recorded one.
func exportBase(spec, commit string) (data []byte, path, source string, err error) {
	switch {
	case spec == "":
		return nil, exportPath, "", nil
	case gitsrc.IsSpec(spec):
		s, err := gitsrc.ParseSpec(spec)
		if err != nil {
			return nil, "", "", err
		}
		at := spec
		if commit != "" {
			at = gitsrc.Spec{Ref: commit, Path: s.Path}.String()
		}
		data, commit, file, err := gitsrc.Load(".", at)
		if err != nil {
			return nil, "", "", fmt.Errorf("read policy %w", err)
		}
		return data, file, s.Source(commit), nil
	}
	data, err = os.ReadFile(spec)
	if err != nil {
		return nil, "", "", fmt.Errorf("read policy: %w", err)
	}
	abs, err := filepath.Abs(spec)
	if err != nil {
		return nil, "", "", err
	}
	// git apply takes paths from the top of the repository; outside one,
	// from the current directory.
	top, err := gitsrc.TopLevel(filepath.Dir(abs))
	if err != nil {
		if top, err = os.Getwd(); err != nil {
			return nil, "", "", err
		}
	}
	rel, err := filepath.Rel(top, abs)
	if err != nil || strings.HasPrefix(rel, "..") {
		rel = filepath.Base(abs)
	}
	return data, filepath.ToSlash(rel), spec, nil
}
