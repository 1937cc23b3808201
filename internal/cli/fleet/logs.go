package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/corral-sandbox/corral/internal/cli"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1"
	"github.com/corral-sandbox/corral/internal/gatewayclient"
	"github.com/corral-sandbox/corral/internal/termsafe"
)

// logsPage is how many entries one query asks for when reading all.
const logsPage = 1000

func newLogsCmd() *cobra.Command {
	var gf cli.GatewayFlags
	var all, follow, asJSON bool
	var event, level, since string
	var limit int
	cmd := &cobra.Command{
		Use:   "logs SANDBOX|--all [--follow] [--event NAME] [--level LEVEL] [--since 10m] [--json] [--limit N]",
		Short: cli.FullShort("", "logs"),
		Long: `Print what the supervisors of SANDBOX (or, with --all, of every sandbox)
pushed to the gateway: audit events, warnings and phase changes, oldest
first. --follow keeps printing new entries until interrupted. --event keeps
one event (e.g. net.connect.denied), --level that level and above (debug,
info, warn, error), --since a duration back (10m) or an RFC 3339 time, and
--limit the first N that match.

A line is: time, sandbox (with --all), level, event, message, then the
event's other fields as key=value. --json prints each entry as one JSON
object per line, the event's own fields under "fields". When a supervisor
had to drop lines before they reached the gateway, their count is printed
on standard error.` + "\n" + cli.GatewayHelp,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			q := &gatewayv1.LogQuery{All: all, Event: event, MinLevel: level}
			switch {
			case all && len(args) == 1:
				return cli.Exit(2, errors.New("name a SANDBOX or pass --all, not both"))
			case !all && len(args) == 0:
				return cli.Exit(2, errors.New("name a SANDBOX (see corral sandbox list) or pass --all"))
			case len(args) == 1:
				q.SandboxId = args[0]
			}
			switch level {
			case "", "debug", "info", "warn", "error":
			default:
				return cli.Exit(2, fmt.Errorf("--level %q: want debug, info, warn or error", level))
			}
			if limit < 0 || (limit > 0 && follow) {
				return cli.Exit(2, errors.New("--limit takes a positive N and does not go with --follow"))
			}
			if since != "" {
				t, err := parseSince(since, time.Now())
				if err != nil {
					return cli.Exit(2, err)
				}
				q.Since = timestamppb.New(t)
			}
			c, err := dial(&gf)
			if err != nil {
				return err
			}
			defer c.Close()
			p := logPrinter{out: cmd.OutOrStdout(), json: asJSON, all: all}
			if follow {
				return followLogs(cmd, c, q, p)
			}
			return queryLogs(cmd, c, q, limit, p)
		},
	}
	gf.Add(cmd)
	cmd.Flags().BoolVar(&all, "all", false, "every sandbox's logs")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new entries until interrupted")
	cmd.Flags().StringVar(&event, "event", "", "only this event, e.g. net.connect.denied")
	cmd.Flags().StringVar(&level, "level", "", "only this level and above: debug, info, warn or error")
	cmd.Flags().StringVar(&since, "since", "", "only entries newer than a duration (10m, 2h) or an RFC 3339 time")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object per entry")
	cmd.Flags().IntVar(&limit, "limit", 0, "print at most the first N matching entries (default: all)")
	return cmd
}

// parseSince reads a duration back from now or an absolute time.
func parseSince(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("--since %q: want a duration like 10m or a time like 2026-01-02T15:04:05Z", s)
}

// queryLogs prints what is stored, page by page, up to limit (0: all).
func queryLogs(cmd *cobra.Command, c *gatewayclient.Client, q *gatewayv1.LogQuery, limit int, p logPrinter) error {
	var dropped int64
	printed := 0
	for {
		n := logsPage
		if limit > 0 {
			n = min(n, limit-printed)
		}
		q.Limit = int32(n)
		ctx, cancel := context.WithTimeout(cmd.Context(), callTimeout)
		resp, err := c.Logs.Query(ctx, connect.NewRequest(q))
		cancel()
		if err != nil {
			return gwErr(c, err, q.SandboxId)
		}
		dropped = resp.Msg.Dropped
		for _, e := range resp.Msg.Entries {
			if err := p.print(e); err != nil {
				return err
			}
			q.AfterSeq = e.Seq
		}
		printed += len(resp.Msg.Entries)
		if len(resp.Msg.Entries) < n || (limit > 0 && printed >= limit) {
			break
		}
	}
	reportDropped(cmd.ErrOrStderr(), dropped)
	return nil
}

// followLogs prints what is stored, then new entries until interrupted.
// The stream carries no drop count, so it is asked for once first.
func followLogs(cmd *cobra.Command, c *gatewayclient.Client, q *gatewayv1.LogQuery, p logPrinter) error {
	qctx, cancel := context.WithTimeout(cmd.Context(), callTimeout)
	first := proto.CloneOf(q)
	first.Limit = 1
	resp, err := c.Logs.Query(qctx, connect.NewRequest(first))
	cancel()
	if err != nil {
		return gwErr(c, err, q.SandboxId)
	}
	reportDropped(cmd.ErrOrStderr(), resp.Msg.Dropped)
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	stream, err := c.Logs.Follow(ctx, connect.NewRequest(q))
	if err != nil {
		return gwErr(c, err, q.SandboxId)
	}
	defer stream.Close()
	for stream.Receive() {
		if err := p.print(stream.Msg()); err != nil {
			return err
		}
	}
	if err := stream.Err(); err != nil && ctx.Err() == nil {
		return gwErr(c, err, q.SandboxId)
	}
	return nil
}

func reportDropped(w io.Writer, n int64) {
	if n > 0 {
		fmt.Fprintf(w, "corral: %d lines were dropped by the supervisor before reaching the gateway\n", n)
	}
}

type logPrinter struct {
	out  io.Writer
	json bool
	all  bool
}

// jsonEntry is an entry as --json prints it: the event's fields as an
// object, not the base64 protojson makes of bytes.
type jsonEntry struct {
	Seq       int64           `json:"seq"`
	SandboxID string          `json:"sandbox_id"`
	Time      time.Time       `json:"time"`
	Level     string          `json:"level"`
	Source    string          `json:"source,omitempty"`
	Event     string          `json:"event,omitempty"`
	Message   string          `json:"message,omitempty"`
	Fields    json.RawMessage `json:"fields,omitempty"`
}

func (p logPrinter) print(e *gatewayv1.LogEntry) error {
	if p.json {
		je := jsonEntry{Seq: e.Seq, SandboxID: e.SandboxId, Time: e.Time.AsTime(), Level: e.Level,
			Source: e.Source, Event: e.Event, Message: e.Message}
		if json.Valid(e.Fields) {
			je.Fields = e.Fields
		}
		b, err := json.Marshal(je)
		if err != nil {
			return fmt.Errorf("encode log entry: %w", err)
		}
		_, err = fmt.Fprintf(p.out, "%s\n", b)
		return err
	}
	var b strings.Builder
	b.WriteString(e.Time.AsTime().Local().Format("2006-01-02T15:04:05.000Z07:00"))
	if p.all {
		b.WriteString(" " + e.SandboxId)
	}
	fmt.Fprintf(&b, " %-5s %s", strings.ToUpper(cli.OrDash(e.Level)), cli.OrDash(e.Event))
	if e.Message != "" {
		b.WriteString(" " + e.Message)
	}
	if f := fieldsSummary(e.Fields); f != "" {
		b.WriteString(" " + f)
	}
	// Supervisors write every part of an entry, and the workload names
	// what they report on (a binary's path, a host): escaped as a whole,
	// the line stays one line and cannot drive the terminal.
	_, err := fmt.Fprintln(p.out, termsafe.Line(b.String()))
	return err
}

// shownApart are the fields a text line already shows in its columns.
var shownApart = map[string]bool{"time": true, "level": true, "event": true, "msg": true, "message": true, "sandbox": true, "sandbox_id": true}

// fieldsSummary is an event's fields as sorted key=value pairs; values
// that are not plain strings stay JSON.
func fieldsSummary(raw []byte) string {
	if len(raw) == 0 {
		return ""
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return string(raw)
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if shownApart[k] {
			continue
		}
		v := m[k]
		var s string
		if json.Unmarshal(v, &s) == nil && s != "" && !strings.ContainsAny(s, " \t\n\"=") {
			parts = append(parts, k+"="+s)
			continue
		}
		var buf bytes.Buffer
		if json.Compact(&buf, v) == nil {
			v = buf.Bytes()
		}
		parts = append(parts, k+"="+string(v))
	}
	return strings.Join(parts, " ")
}
