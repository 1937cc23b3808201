package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-sandbox/corral/internal/gateway/auth"
	"github.com/corral-sandbox/corral/internal/gateway/server"
	"github.com/corral-sandbox/corral/internal/gateway/store"
)

// storeFlags are shared by every command: the admin commands open the
// gateway's store directly, on the gateway's host.
type storeFlags struct {
	dataDir  string
	database string
}

// defaultJoinTTL is how long a join token lasts unless --ttl says: it is
// meant for one host's supervisor soon after it is made, and one left
// lying in a script or a chat stays usable no longer than this.
const defaultJoinTTL = 24 * time.Hour

func (f *storeFlags) open(ctx context.Context) (store.Store, error) {
	if err := os.MkdirAll(f.dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	return store.Open(ctx, f.database, f.dataDir)
}

// with runs an admin command against the store, closed after.
func (f *storeFlags) with(cmd *cobra.Command, do func(st store.Store) error) error {
	st, err := f.open(cmd.Context())
	if err != nil {
		return err
	}
	defer st.Close()
	return do(st)
}

// defaultDataDir is /var/lib/corral/gateway for root, else under the
// user's state directory.
func defaultDataDir() string {
	if os.Geteuid() == 0 {
		return "/var/lib/corral/gateway"
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "corral", "gateway")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "corral-gateway")
	}
	return filepath.Join(home, ".local", "state", "corral", "gateway")
}

func newRootCmd() *cobra.Command {
	sf := &storeFlags{}
	so := &serveOpts{}
	root := &cobra.Command{
		Use:   "corral-gateway",
		Short: "Serve corral's control plane for many sandboxes",
		Long: `corral-gateway serves the gateway API (gRPC, gRPC-Web and Connect/JSON over
TLS) with /metrics (a user credential, unless --public-metrics), /healthz and
/readyz. Without a subcommand it serves.
On first start it makes its CA, server certificate and secret key in the
data directory; use the token and issue-client commands on the same host to
let users and supervisors in.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE:          func(cmd *cobra.Command, _ []string) error { return so.run(cmd.Context(), sf) },
	}
	root.PersistentFlags().StringVar(&sf.dataDir, "data", defaultDataDir(), "data directory (TLS material, secret key, SQLite database)")
	root.PersistentFlags().StringVar(&sf.database, "database", "", "postgres://… URL; empty = SQLite in the data directory")
	so.flags(root)

	serve := &cobra.Command{
		Use:   "serve",
		Short: "Serve the gateway (the default)",
		Args:  cobra.NoArgs,
	}
	serveOpts := &serveOpts{}
	serveOpts.flags(serve)
	serve.RunE = func(cmd *cobra.Command, _ []string) error { return serveOpts.run(cmd.Context(), sf) }

	root.AddCommand(serve, newIssueClientCmd(sf), newListClientsCmd(sf), newRevokeClientCmd(sf), newTokenCmd(sf))
	return root
}

type serveOpts struct {
	listen        string
	sans          []string
	url           string
	logRetention  int
	logLevel      string
	corral        string
	workdirs      []string
	stateDir      string
	newKey        bool
	publicMetrics bool
}

func (o *serveOpts) flags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&o.listen, "listen", "127.0.0.1:7443", "address to serve on")
	cmd.Flags().StringArrayVar(&o.sans, "san", nil, "extra host name or IP for the server certificate (repeatable)")
	cmd.Flags().StringVar(&o.url, "url", "", "URL supervisors started here dial (default: from --listen)")
	cmd.Flags().IntVar(&o.logRetention, "log-retention", server.DefaultLogRetention, "log entries kept per sandbox")
	cmd.Flags().StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	cmd.Flags().StringVar(&o.corral, "corral", "", "corral binary the local driver starts supervisors with (default: next to corral-gateway, then PATH)")
	cmd.Flags().StringArrayVar(&o.workdirs, "allow-workdir", nil, "host directory the local driver's sandboxes may name as their working directory, or one below it (repeatable; default none: each sandbox gets a directory of its own)")
	cmd.Flags().BoolVar(&o.publicMetrics, "public-metrics", false, "serve /metrics without a credential (by default it takes a user's token or client certificate, as the API does)")
	cmd.Flags().BoolVar(&o.newKey, "new-secret-key", false, "make a new secret key although the database holds secrets sealed with one that is missing (they must then be set again)")
	cmd.Flags().StringVar(&o.stateDir, "sandbox-state-dir", "", "state directory of the supervisors the local driver starts (corral run --state-dir: their audit log, run directories and saved gateway credentials; default: corral's own, /var/lib/corral)")
}

func (o *serveOpts) run(ctx context.Context, sf *storeFlags) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(strings.ToUpper(o.logLevel))); err != nil {
		return fmt.Errorf("--log-level %q: want debug, info, warn or error", o.logLevel)
	}
	if o.logRetention <= 0 {
		return fmt.Errorf("--log-retention must be positive")
	}
	if o.stateDir != "" && !filepath.IsAbs(o.stateDir) {
		return fmt.Errorf("--sandbox-state-dir %q: want an absolute path", o.stateDir)
	}
	for _, w := range o.workdirs {
		if fi, err := os.Stat(w); err != nil || !fi.IsDir() || !filepath.IsAbs(w) {
			return fmt.Errorf("--allow-workdir %q: want an absolute path of an existing directory", w)
		}
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	return server.Run(ctx, server.RunConfig{
		Listen:        o.listen,
		DataDir:       sf.dataDir,
		Database:      sf.database,
		SANs:          o.sans,
		URL:           o.url,
		LogRetention:  o.logRetention,
		Drivers:       drivers(o.corral, sf.dataDir, o.workdirs, o.stateDir, log),
		Logger:        log,
		NewSecretKey:  o.newKey,
		PublicMetrics: o.publicMetrics,
	})
}

func newIssueClientCmd(sf *storeFlags) *cobra.Command {
	var name, out string
	cmd := &cobra.Command{
		Use:   "issue-client --name N --out DIR",
		Short: "Write a client certificate that authenticates as user N",
		Long: `Write DIR/N.pem, DIR/N-key.pem (mode 0600) and DIR/ca.pem: a client
certificate signed by the gateway's CA, which authenticates as user N. The
certificate is recorded in the gateway's database by serial number: only a
recorded one authenticates, and revoke-client SERIAL refuses it from then
on (list-clients shows the serials).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if name == "" || out == "" {
				return errors.New("--name and --out are required")
			}
			pki, err := auth.EnsurePKI(filepath.Join(sf.dataDir, "tls"), nil)
			if err != nil {
				return err
			}
			return sf.with(cmd, func(st store.Store) error {
				path, c, err := auth.IssueClientCert(cmd.Context(), st, pki, name, out)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "client certificate for %s: %s (key %s, CA %s), serial %s, expires %s\n",
					name, path, filepath.Join(out, name+"-key.pem"), filepath.Join(out, "ca.pem"), c.Serial, c.ExpiresAt.UTC().Format(time.RFC3339))
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "user name the certificate authenticates as and its files are named by (letters, digits, '.', '_', '@', '-')")
	cmd.Flags().StringVar(&out, "out", "", "directory to write the certificate, key and CA into")
	return cmd
}

func newListClientsCmd(sf *storeFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "list-clients",
		Short: "List the client certificates issue-client made",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return sf.with(cmd, func(st store.Store) error {
				cs, err := st.ListClientCerts(cmd.Context())
				if err != nil {
					return err
				}
				w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "SERIAL\tNAME\tISSUED\tEXPIRES\tREVOKED")
				for _, c := range cs {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", c.Serial, c.Name, when(c.IssuedAt), when(c.ExpiresAt), when(c.RevokedAt))
				}
				return w.Flush()
			})
		},
	}
}

func newRevokeClientCmd(sf *storeFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "revoke-client SERIAL",
		Short: "Refuse a client certificate from now on; its open streams end",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return sf.with(cmd, func(st store.Store) error {
				serial := strings.ToLower(strings.TrimPrefix(strings.ReplaceAll(args[0], ":", ""), "0x"))
				if err := st.RevokeClientCert(cmd.Context(), serial); err != nil {
					return fmt.Errorf("revoke client certificate %s (serials as list-clients shows them): %w", args[0], err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "client certificate %s revoked\n", serial)
				return nil
			})
		},
	}
}

func newTokenCmd(sf *storeFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Create, list and delete bearer tokens",
	}
	var name, sandbox string
	var join bool
	var secrets []string
	var ttl time.Duration
	create := &cobra.Command{
		Use:   "create (--name N | --sandbox ID | --join [--secret NAME]...) [--ttl D]",
		Short: "Create a token and print its secret once",
		Long: `Create a bearer token and print its secret; only its SHA-256 is kept, so
it cannot be shown again.
  --name N      a user token for N
  --sandbox ID  a new credential for sandbox ID's supervisor
  --join        a one-time token a supervisor on another host joins with;
                the policy it joins with may take from_gateway only the
                secrets named by --secret NAME (repeatable), none without
  --ttl D       refuse the token D after now (e.g. 1h, 720h); a join
                token lasts 24h unless told otherwise, the others until
                deleted unless given one`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			kind := store.TokenUser
			switch {
			case sandbox != "" && join:
				return errors.New("give --sandbox or --join, not both")
			case sandbox != "":
				kind = store.TokenSandbox
				if name == "" {
					name = "sandbox " + sandbox
				}
			case join:
				kind = store.TokenJoin
				if name == "" {
					name = "join"
				}
			case name == "":
				return errors.New("give --name N for a user token, --sandbox ID or --join")
			}
			if ttl < 0 {
				return fmt.Errorf("--ttl %s: must not be negative", ttl)
			}
			if !cmd.Flags().Changed("ttl") && kind == store.TokenJoin {
				ttl = defaultJoinTTL
			}
			var expires time.Time
			if ttl > 0 {
				expires = time.Now().Add(ttl)
			}
			return sf.with(cmd, func(st store.Store) error {
				secret, t, err := auth.CreateTokenUntil(cmd.Context(), st, kind, name, sandbox, expires, secrets...)
				if err != nil {
					return err
				}
				until := "never expires"
				if !expires.IsZero() {
					until = "expires " + expires.UTC().Format(time.RFC3339)
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "token %s (%s, %s, %s) created; its secret is shown only now:\n", t.ID, t.Kind, t.Name, until)
				fmt.Fprintln(cmd.OutOrStdout(), secret)
				return nil
			})
		},
	}
	create.Flags().StringVar(&name, "name", "", "token name (the user it authenticates as)")
	create.Flags().StringVar(&sandbox, "sandbox", "", "make a credential for this sandbox's supervisor")
	create.Flags().BoolVar(&join, "join", false, "make a one-time join token")
	create.Flags().DurationVar(&ttl, "ttl", 0, "refuse the token this long after now (0 = never; join tokens default to 24h)")
	create.Flags().StringArrayVar(&secrets, "secret", nil, "gateway secret the sandbox joining with this token may take from_gateway (repeatable; with --join)")

	list := &cobra.Command{
		Use:   "list",
		Short: "List tokens (never their secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return sf.with(cmd, func(st store.Store) error {
				ts, err := st.ListTokens(cmd.Context())
				if err != nil {
					return err
				}
				w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "ID\tKIND\tNAME\tSANDBOX\tSECRETS\tCREATED\tEXPIRES\tUSED")
				for _, t := range ts {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, t.Kind, t.Name, orDash(t.SandboxID), orDash(strings.Join(t.Secrets, ",")), when(t.CreatedAt), when(t.ExpiresAt), when(t.UsedAt))
				}
				return w.Flush()
			})
		},
	}
	del := &cobra.Command{
		Use:   "delete ID",
		Short: "Delete a token; whoever holds it is refused from then on, and its open streams end",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return sf.with(cmd, func(st store.Store) error {
				if err := st.DeleteToken(cmd.Context(), args[0]); err != nil {
					return fmt.Errorf("delete token %s: %w", args[0], err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "token %s deleted\n", args[0])
				return nil
			})
		},
	}
	cmd.AddCommand(create, list, del)
	return cmd
}

// when is a time in a listing, "-" for none.
func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Format(time.RFC3339)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
