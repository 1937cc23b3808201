package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-sandbox/corral/internal/advisor/drafts"
	"github.com/corral-sandbox/corral/internal/advisor/service"
	"github.com/corral-sandbox/corral/internal/control"
	"github.com/corral-sandbox/corral/internal/sandbox"
	"github.com/corral-sandbox/corral/internal/statedir"
	"github.com/corral-sandbox/corral/internal/termsafe"
)

// draftFlags are the flags every corral draft command shares.
var draftFlags struct {
	sandbox  string
	stateDir string
	json     bool
}

// draftCmd is `corral draft`; files adding a subcommand AddCommand to it
// from an init function.
var draftCmd = &cobra.Command{
	Use:   "draft",
	Short: "Review the policy chunks proposed for a running sandbox's denials",
	Long: `List the pending policy chunks the sandbox's advisor proposed for what it was
denied (and those its agent proposed through http://policy.local/), newest
first. Approving one merges it into the running sandbox's policy with no
restart; rejecting one twice for the same host and port stops further
proposals for it until corral draft retry.

With a single running sandbox --sandbox may be left out.`,
	Args: cobra.NoArgs,
	RunE: func(cmd *cobra.Command, _ []string) error {
		all, _ := cmd.Flags().GetBool("all")
		var list []sandbox.DraftDetail
		if err := draftCall(cmd, control.OpDraftList, control.DraftArgs{}, &list); err != nil {
			return err
		}
		var out []sandbox.DraftDetail
		for _, d := range list {
			if all || d.State == drafts.Pending {
				out = append(out, d)
			}
		}
		if draftFlags.json {
			return PrintJSON(cmd.OutOrStdout(), out)
		}
		return draftTable(cmd.OutOrStdout(), out, all)
	},
}

func init() {
	pf := draftCmd.PersistentFlags()
	pf.StringVar(&draftFlags.sandbox, "sandbox", "", "id of the running sandbox (see corral ps); optional when only one runs")
	pf.StringVar(&draftFlags.stateDir, "state-dir", "", "state directory of the sandbox")
	pf.BoolVar(&draftFlags.json, "json", false, "print JSON instead of a table")
	draftCmd.Flags().Bool("all", false, "list drafts in every state, not just pending ones")
	draftCmd.AddCommand(newDraftShowCmd(), newDraftApproveCmd(), newDraftRejectCmd(), newDraftUndoCmd(),
		newDraftHistoryCmd(), newDraftWatchCmd(), newDraftRetryCmd(), newDraftRefineCmd())
}

// findSandbox returns the sandbox --sandbox names, or the only one
// running.
func findSandbox(ctx context.Context, state, id string) (string, error) {
	if id != "" {
		return id, nil
	}
	entries, err := os.ReadDir(statedir.Runs(state))
	if err != nil && !os.IsNotExist(err) {
		return "", err
	}
	var running []string
	for _, e := range entries {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := control.Call(cctx, state, e.Name(), control.Request{Op: control.OpStatus})
		cancel()
		if err == nil && resp.Status != nil {
			running = append(running, e.Name())
		}
	}
	switch len(running) {
	case 0:
		return "", fmt.Errorf("no running sandbox under %s", state)
	case 1:
		return running[0], nil
	}
	return "", fmt.Errorf("%d sandboxes are running (%s): name one with --sandbox", len(running), strings.Join(running, ", "))
}

// draftCall runs one draft operation on the sandbox and decodes its
// result into out.
func draftCall(cmd *cobra.Command, op string, args control.DraftArgs, out any) error {
	ctx := cmd.Context()
	state := orStateDir(draftFlags.stateDir)
	id, err := findSandbox(ctx, state, draftFlags.sandbox)
	if err != nil {
		return &exitError{code: 2, err: err}
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := control.Call(ctx, state, id, control.Request{Op: op, Draft: &args})
	if err != nil {
		return err
	}
	if !resp.OK {
		return &exitError{code: 1, err: fmt.Errorf("sandbox %s: %s", id, resp.Error)}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(resp.Draft, out); err != nil {
		return fmt.Errorf("sandbox %s: decode %s result: %w", id, op, err)
	}
	return nil
}

// PrintJSON writes v as indented JSON.
func PrintJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// target is the host:port and binary a draft answers first, escaped for
// the terminal: the workload names both (and an agent's chunk its name).
func target(d drafts.Draft) (string, string) {
	if len(d.Chunk.Wants) == 0 {
		return termsafe.Line(d.Chunk.Name), ""
	}
	w := d.Chunk.Wants[0]
	return termsafe.Line(net.JoinHostPort(w.Host, strconv.Itoa(int(w.Port)))), termsafe.Line(w.Binary)
}

func draftTable(w io.Writer, list []sandbox.DraftDetail, withState bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	head := "ID\tHOST:PORT\tBINARY\tSTAGE\tHITS\tAGE\tNOTES"
	if withState {
		head = "ID\tSTATE\tHOST:PORT\tBINARY\tSTAGE\tHITS\tAGE\tNOTES"
	}
	fmt.Fprintln(tw, head)
	for _, d := range list {
		hostPort, bin := target(d.Draft)
		var hits uint64
		for _, e := range d.Entries {
			hits += e.Count
		}
		notes := []string{string(d.Check.Verdict)}
		if d.Chunk.Author == "agent" {
			notes = append(notes, "by the agent")
		}
		if n := len(d.Chunk.SecurityNotes); n > 0 {
			notes = append(notes, fmt.Sprintf("%d security note(s)", n))
		}
		state := ""
		if withState {
			state = string(d.State) + "\t"
		}
		fmt.Fprintf(tw, "%s\t%s%s\t%s\t%d\t%d\t%s\t%s\n", d.ID, state, hostPort, OrDash(bin), d.Chunk.Stage, hits,
			time.Since(d.Created).Round(time.Second), strings.Join(notes, ", "))
	}
	return tw.Flush()
}

// OrDash is s, or "-" for an empty table cell.
func OrDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newDraftShowCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "show CHUNK",
		Short: "Show a draft: the YAML it adds, why, its security notes and the denials it answers",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var d sandbox.DraftDetail
			if err := draftCall(cmd, control.OpDraftShow, control.DraftArgs{IDs: args}, &d); err != nil {
				return err
			}
			if draftFlags.json {
				return PrintJSON(cmd.OutOrStdout(), d)
			}
			return showDraft(cmd.OutOrStdout(), d)
		},
	}
}

// showDraft prints a draft for the person deciding on it. Everything the
// workload or its agent could have written (names, paths, the intent, the
// notes and rationale that quote them, the denials) goes through termsafe,
// so that it cannot rewrite the screen around the decision; the YAML keeps
// its lines.
func showDraft(w io.Writer, d sandbox.DraftDetail) error {
	y, err := d.Chunk.YAML()
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "draft %s (%s, stage %d, by %s, confidence %.2f)\n", d.ID, d.State, d.Chunk.Stage, d.Chunk.Author, d.Chunk.Confidence)
	fmt.Fprintf(w, "verdict: %s\nallows:  %s\n", d.Check.Verdict, termsafe.Line(d.Check.Summary.String()))
	if d.State == drafts.Pending {
		fmt.Fprintf(w, "expires: %s\n", d.Expires.Local().Format(time.RFC3339))
	}
	if d.Replaces != "" {
		fmt.Fprintf(w, "replaces: %s\n", d.Replaces)
	}
	if d.Loaded != nil {
		fmt.Fprintf(w, "loaded:  policy version %d (sha256 %.12s)\n", d.Loaded.Version, d.Loaded.Hash)
	}
	fmt.Fprintf(w, "\n%s\n\n%s\n", termsafe.Line(strings.TrimSpace(d.Chunk.Rationale)), termsafe.Text(strings.TrimRight(string(y), "\n")))
	if d.Chunk.Intent != "" {
		fmt.Fprintf(w, "\nthe agent's intent: %s\n", termsafe.Line(d.Chunk.Intent))
	}
	if len(d.Chunk.SecurityNotes) > 0 || len(d.Check.Flags) > 0 {
		fmt.Fprintln(w, "\nsecurity notes:")
		for _, n := range append(append([]string(nil), d.Chunk.SecurityNotes...), d.Check.Flags...) {
			fmt.Fprintf(w, "  - %s\n", termsafe.Line(n))
		}
	}
	if len(d.Entries) > 0 {
		fmt.Fprintln(w, "\ndenials:")
		for _, e := range d.Entries {
			fmt.Fprintf(w, "  %s:%d %s ×%d (%s)", termsafe.Line(e.Host), e.Port, OrDash(termsafe.Line(e.Binary)), e.Count, termsafe.Line(e.Reason))
			if e.Cmdline != "" {
				fmt.Fprintf(w, "  $ %s", termsafe.Line(e.Cmdline))
			}
			fmt.Fprintln(w)
		}
	}
	if d.Guidance != "" {
		fmt.Fprintf(w, "\nguidance for the agent: %s\n", termsafe.Line(d.Guidance))
	}
	if len(d.History) > 0 {
		fmt.Fprintln(w, "\nhistory:")
		for _, t := range d.History {
			fmt.Fprintf(w, "  %s  %s → %s  by %s  %s\n", t.At.Local().Format(time.RFC3339), OrDash(string(t.From)), t.To, termsafe.Line(t.Actor.User), termsafe.Line(t.Reason))
		}
	}
	return nil
}

func newDraftApproveCmd() *cobra.Command {
	var all, flagged bool
	var reason string
	cmd := &cobra.Command{
		Use:   "approve CHUNK...|--all",
		Short: "Merge drafts into the running sandbox's policy (no restart)",
		Long: `Re-check each draft against the policy in force and reload the sandbox with it
added. A draft whose reload fails stays pending and the reason is printed.
--all approves every pending draft except those with security notes (L4,
wildcards, interpreters, any binary, internal addresses), which need
--include-flagged or their id.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) > 0) {
				return &exitError{code: 2, err: errors.New("name the drafts to approve, or pass --all")}
			}
			var res []service.ApproveResult
			if err := draftCall(cmd, control.OpDraftApprove, control.DraftArgs{IDs: args, All: all, IncludeFlagged: flagged, Reason: reason}, &res); err != nil {
				return err
			}
			if draftFlags.json {
				return PrintJSON(cmd.OutOrStdout(), res)
			}
			failed := 0
			for _, r := range res {
				if r.Error != "" {
					failed++
					fmt.Fprintf(cmd.ErrOrStderr(), "draft %s not approved: %s\n", r.Draft.ID, termsafe.Line(r.Error))
					continue
				}
				v := 0
				if r.Draft.Loaded != nil {
					v = r.Draft.Loaded.Version
				}
				fmt.Fprintf(cmd.OutOrStdout(), "draft %s approved: policy version %d is in force\n", r.Draft.ID, v)
			}
			if failed > 0 {
				return &exitError{code: 1}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "approve every pending draft")
	cmd.Flags().BoolVar(&flagged, "include-flagged", false, "with --all, approve drafts with security notes too")
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the history")
	return cmd
}

func newDraftRejectCmd() *cobra.Command {
	var reason, guidance string
	cmd := &cobra.Command{
		Use:   "reject CHUNK --reason TEXT [--guidance TEXT]",
		Short: "Reject a draft; --guidance goes back to the agent waiting on it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if reason == "" {
				return &exitError{code: 2, err: errors.New("--reason is required")}
			}
			var d drafts.Draft
			if err := draftCall(cmd, control.OpDraftReject, control.DraftArgs{IDs: args, Reason: reason, Guidance: guidance}, &d); err != nil {
				return err
			}
			if draftFlags.json {
				return PrintJSON(cmd.OutOrStdout(), d)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "draft %s rejected\n", d.ID)
			return nil
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why (required)")
	cmd.Flags().StringVar(&guidance, "guidance", "", "what the agent should do instead")
	return cmd
}

func newDraftUndoCmd() *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   "undo CHUNK",
		Short: "Take an approved draft out of the running policy again",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var d drafts.Draft
			if err := draftCall(cmd, control.OpDraftUndo, control.DraftArgs{IDs: args, Reason: reason}, &d); err != nil {
				return err
			}
			if draftFlags.json {
				return PrintJSON(cmd.OutOrStdout(), d)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "draft %s undone\n", d.ID)
			return nil
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the history")
	return cmd
}

func newDraftHistoryCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "history",
		Short: "Every draft transition with its time, actor and reason",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var hist []drafts.Transition
			if err := draftCall(cmd, control.OpDraftHistory, control.DraftArgs{}, &hist); err != nil {
				return err
			}
			if draftFlags.json {
				return PrintJSON(cmd.OutOrStdout(), hist)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TIME\tDRAFT\tFROM\tTO\tBY\tREASON")
			for _, t := range hist {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", t.At.Local().Format(time.RFC3339), OrDash(t.Draft), OrDash(string(t.From)),
					OrDash(string(t.To)), termsafe.Line(t.Actor.User), termsafe.Line(t.Reason))
			}
			return tw.Flush()
		},
	}
}

func newDraftWatchCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "watch",
		Short: "Print new pending drafts as they appear, until interrupted",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			seen := map[string]bool{}
			first := true
			for cmd.Context().Err() == nil {
				args := control.DraftArgs{WaitMS: control.MaxWatch.Milliseconds()}
				if first {
					args.WaitMS = 0
				}
				var list []sandbox.DraftDetail
				if err := draftCall(cmd, control.OpDraftWatch, args, &list); err != nil {
					return err
				}
				var fresh []sandbox.DraftDetail
				for _, d := range list {
					if d.State == drafts.Pending && !seen[d.ID] {
						seen[d.ID] = true
						fresh = append(fresh, d)
					}
				}
				switch {
				case draftFlags.json:
					for _, d := range fresh {
						if err := json.NewEncoder(cmd.OutOrStdout()).Encode(d); err != nil {
							return err
						}
					}
				case len(fresh) > 0:
					if err := draftTable(cmd.OutOrStdout(), fresh, false); err != nil {
						return err
					}
				}
				first = false
			}
			return nil
		},
	}
}

func newDraftRetryCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "retry HOST:PORT",
		Short: "Let the advisor propose again for a host and port rejected twice",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			host, p, err := net.SplitHostPort(args[0])
			port, perr := strconv.ParseUint(p, 10, 16)
			if err != nil || perr != nil || host == "" {
				return &exitError{code: 2, err: fmt.Errorf("%q: want HOST:PORT", args[0])}
			}
			var out []drafts.Draft
			if err := draftCall(cmd, control.OpDraftRetry, control.DraftArgs{Host: host, Port: uint16(port)}, &out); err != nil {
				return err
			}
			if draftFlags.json {
				return PrintJSON(cmd.OutOrStdout(), out)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s may be proposed again; %d new draft(s)\n", args[0], len(out))
			for _, d := range out {
				fmt.Fprintf(cmd.OutOrStdout(), "  %s\n", d.ID)
			}
			return nil
		},
	}
}

func newDraftRefineCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "refine CHUNK",
		Short: "Propose a refined (L7) chunk now from the requests seen, however few",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var out []drafts.Draft
			if err := draftCall(cmd, control.OpDraftRefine, control.DraftArgs{IDs: args}, &out); err != nil {
				return err
			}
			if draftFlags.json {
				return PrintJSON(cmd.OutOrStdout(), out)
			}
			for _, d := range out {
				fmt.Fprintf(cmd.OutOrStdout(), "draft %s proposed (stage %d): corral draft show %s\n", d.ID, d.Chunk.Stage, d.ID)
			}
			return nil
		},
	}
}
