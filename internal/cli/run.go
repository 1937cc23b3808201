package cli

import (
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/egress/assemble"
	"github.com/corral-sandbox/corral/internal/egress/decide/userrules"
	"github.com/corral-sandbox/corral/internal/inference"
	"github.com/corral-sandbox/corral/internal/l7/secrets"
	"github.com/corral-sandbox/corral/internal/linux/prefault"
	"github.com/corral-sandbox/corral/internal/linux/timerslack"
	"github.com/corral-sandbox/corral/internal/netclass"
	"github.com/corral-sandbox/corral/internal/plan"
	"github.com/corral-sandbox/corral/internal/planner"
	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/corral-sandbox/corral/internal/policy/gitsrc"
	"github.com/corral-sandbox/corral/internal/reload"
	"github.com/corral-sandbox/corral/internal/sandbox"
	"github.com/corral-sandbox/corral/internal/statedir"
	"github.com/corral-sandbox/corral/internal/trace"
)

// Uncaged reasons in sandbox.start.uncaged events.
const (
	reasonPolicyDisabled = "policy_disabled"
	reasonFlagNoSandbox  = "flag_no_sandbox"
)

// defaultPath is the workload's PATH when the caller has none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// notifyConnectsEnv, set to 1, keeps a root run on the path a rootless one
// takes, the seccomp filter handing each connect to the supervisor, rather
// than the kernel's cgroup hook recording them: for tests and comparisons.
const notifyConnectsEnv = "CORRAL_NOTIFY_CONNECTS"

// inheritedPath is the PATH the workload starts from, before the plan
// leaves out what does not exist inside.
func inheritedPath() string {
	if p := os.Getenv("PATH"); p != "" {
		return p
	}
	return defaultPath
}

type runFlags struct {
	policy      string
	workdir     string
	timeout     time.Duration
	env         []string
	passEnv     []string
	envFile     string
	auditLog    string
	stateDir    string
	session     string
	noSandbox   bool
	logLevel    string
	upstreamDNS string
	upstreamCA  []string
	policyRules string
	// inferenceRoutes is the --inference-routes file.
	inferenceRoutes string
	trustedCIDRs    []string
	trace           bool
	// learn is --learn (policy network.learn).
	learn bool
	// advisorProbe is --advisor-probe.
	advisorProbe bool
	// gateway, gatewayCA and gatewayToken are --gateway,
	// --gateway-ca and --gateway-token-file; name and labels describe
	// the sandbox to the gateway when it joins.
	gateway, gatewayCA, gatewayToken string
	name                             string
	labels                           map[string]string
	// gatewayHostKeys is --gateway-host-keys.
	gatewayHostKeys bool
}

func newRunCmd() *cobra.Command {
	var f runFlags
	cmd := &cobra.Command{
		Use:   "run [flags] -- CMD [ARGS...]",
		Short: "Run a command inside a sandbox",
		Long: `Run CMD inside a sandbox built from the policy (the built-in default policy
unless --policy is given).

Inside, only the policy's paths exist; the workload runs as an unprivileged
user with no capabilities, no_new_privs, Landlock and a seccomp filter, in its
own mount, pid, ipc, uts, cgroup and network namespaces, under cgroup limits
and a walltime watchdog.

In proxy network mode (the default policy's), every TCP connection and DNS
query of the workload is captured and allowed only if a network policy names
its host, port and binary; HTTP_PROXY, HTTPS_PROXY and ALL_PROXY point at
corral's explicit proxies. Every decision is an audit event.

Endpoints with protocol: rest are inspected request by request: corral
terminates their TLS with a CA generated for this sandbox (trusted inside
through /run/corral/ca-bundle.pem, SSL_CERT_FILE and friends, and the system
bundle paths) and checks each request's method, path and query against the
endpoint's rules. Upstream servers are verified against the host's roots plus
--upstream-ca. Masked secrets (the policy's secrets section) reach the
workload only as surrogates, swapped for the real value in requests to the
secret's hosts.

The workload's environment is a small safe set (PATH, HOME, TERM, LANG, LC_*,
TZ, USER, CORRAL_SANDBOX=1) plus what --env and --pass-env add. A real secret
value never enters it: a variable holding one gets the surrogate instead.

Exit status: the command's own; 128+N if it was killed by signal N; 124 when
the walltime ran out; 125 when corral failed before the command ran; 126 if
the command cannot be executed; 127 if it was not found.`,
		Example: `  corral run -- ls -la
  corral run --policy agent.yaml --timeout 30m -- claude
  corral run --policy git:origin/main:.corral/policy.yaml -- claude
  corral run --env CI=1 --pass-env GITHUB_TOKEN -- make test`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 0 {
				return &exitError{code: 2, err: errors.New("put the command after --, e.g. corral run -- ls -la")}
			}
			return runCommand(cmd, f, args)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.policy, "policy", "", "policy file, or git:REF:PATH for the file as committed on REF of the working directory's repository, which the workload cannot change (default: the built-in default policy; see 'corral policy explain')")
	fl.StringVar(&f.workdir, "workdir", "", "working directory, mounted read-write unless the policy says otherwise (default: current directory)")
	fl.DurationVar(&f.timeout, "timeout", 0, "walltime limit, overriding limits.walltime (e.g. 30s, 10m, 2h)")
	fl.StringArrayVar(&f.env, "env", nil, "set K=V in the workload's environment (repeatable)")
	fl.StringArrayVar(&f.passEnv, "pass-env", nil, "pass the named variable from corral's environment (repeatable)")
	fl.StringVar(&f.envFile, "env-file", "", "set the NAME=VALUE lines of this file in the workload's environment (blank lines and # comments skipped); unlike --env, the values stay off corral's command line, which every host user can read")
	fl.StringVar(&f.auditLog, "audit-log", "", "audit log file, JSON lines (default: STATE_DIR/audit.log)")
	fl.StringVar(&f.stateDir, "state-dir", "", "directory for corral's host state (default: /var/lib/corral as root, else $XDG_STATE_HOME/corral)")
	fl.StringVar(&f.session, "session", "default", "session name: groups audit events and keeps /scratch across runs with state: scratch")
	fl.BoolVar(&f.noSandbox, "no-sandbox", false, "run the command WITHOUT any sandbox (walltime and audit still apply)")
	fl.StringVar(&f.logLevel, "log-level", "info", "log level on stderr: debug, info, warn, error")
	fl.StringVar(&f.upstreamDNS, "upstream-dns", "", "resolver HOST:PORT the supervisor uses for allowed names in proxy mode (default: the host's)")
	fl.StringArrayVar(&f.upstreamCA, "upstream-ca", nil, "PEM file of CA certificates trusted, besides the host's roots, for upstream servers of inspected (protocol: rest) connections (repeatable)")
	fl.StringVar(&f.policyRules, "policy-rules", "", "Rego file replacing corral's built-in network decision rules (same input document); OPA evaluates it, which only corral's full program carries, so such a run starts as that program (written to the state directory's bin/ on first use)")
	fl.StringArrayVar(&f.trustedCIDRs, "trusted-cidr", nil, "private network (CIDR) the policy advisor may propose in allowed_ips whole, instead of each address seen (repeatable)")
	fl.StringVar(&f.inferenceRoutes, "inference-routes", "", "YAML file of model routes served at inference.local (proxy mode), replacing the policy's inference section for the whole run; an empty list turns routing off")
	fl.BoolVar(&f.advisorProbe, "advisor-probe", false, "let the policy advisor look up each refused name once, through corral's resolver, to propose allowed_ips for private addresses; this sends names the workload chose, and was refused, to the upstream resolver (always on in learn mode)")
	fl.BoolVar(&f.learn, "learn", false, "learn mode (policy network.learn): let through connections no policy allows, except to internal addresses, and turn them into draft policy chunks (corral draft); for discovering what a workload needs, never for production")
	fl.BoolVar(&f.trace, "trace", false, "print each start-up step and its duration to stderr (also: "+trace.Env+"=1)")
	fl.StringVar(&f.gateway, "gateway", os.Getenv("CORRAL_GATEWAY"), "gateway URL (https://HOST:PORT): take the policy from it, receive its updates, report to it and push the audit trail (env CORRAL_GATEWAY)")
	fl.StringVar(&f.gatewayCA, "gateway-ca", os.Getenv("CORRAL_GATEWAY_CA"), "PEM file of the gateway's CA (env CORRAL_GATEWAY_CA)")
	fl.BoolVar(&f.gatewayHostKeys, "gateway-host-keys", false, "let the gateway's policies and model routes take secrets and route keys from_file and from_env on this host; without it they are refused, since gateway users could read this host's files and corral's environment by naming them (from_gateway needs no such trust)")
	fl.StringVar(&f.gatewayToken, "gateway-token-file", os.Getenv("CORRAL_GATEWAY_TOKEN_FILE"), "file holding the sandbox's gateway token, or a one-time join token (env CORRAL_GATEWAY_TOKEN_FILE)")
	fl.StringVar(&f.name, "name", "", "name of the sandbox at the gateway, when it joins with a join token")
	fl.StringToStringVar(&f.labels, "label", nil, "label K=V of the sandbox at the gateway, when it joins with a join token (repeatable)")
	return cmd
}

// sessionName checks --session, up to 64 bytes (validSession): a bounded
// repetition would compile into a copy per count at every start.
var sessionName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

func validSession(s string) bool { return len(s) <= 64 && sessionName.MatchString(s) }

func runCommand(cmd *cobra.Command, f runFlags, argv []string) (retErr error) {
	setupFailed := func(err error) error { return &exitError{code: sandbox.ExitSetupFailed, err: err} }
	// OPA and the gateway client are in the full program only
	// (internal/fullbin), so that no other run pays for initialising
	// them; it runs this command line again from the start.
	if needs := fullRunNeeds(f); needs != "" {
		state, err := absStateDir(f.stateDir)
		if err == nil {
			err = execFull(needs, state)
		}
		return setupFailed(err)
	}
	slack := timerslack.WidenProcess()
	// A sandbox's start grows the heap by a few megabytes, a page fault
	// per page otherwise.
	prefault.Heap(4 << 20)
	var tr *trace.Tracer
	if f.trace || os.Getenv(trace.Env) == "1" {
		tr = trace.New(cmd.ErrOrStderr())
	}
	tr.Step("corral started (package initialisation, flags)")
	// Registered first, so it runs last: what follows it is the exit.
	defer tr.Step("audit flushed, corral exiting")
	resumeGC := pauseGC()
	defer resumeGC()
	log, err := newLogger(cmd.ErrOrStderr(), f.logLevel)
	if err != nil {
		return setupFailed(err)
	}
	defer startCPUProfile(func(msg string) { log.Warn(msg) })()
	if !validSession(f.session) {
		return setupFailed(fmt.Errorf("--session %q: use 1-64 letters, digits, '.', '_' or '-'", f.session))
	}
	set := f.env
	if f.envFile != "" {
		lines, err := readEnvFile(f.envFile)
		if err != nil {
			return setupFailed(err)
		}
		set = slices.Concat(lines, f.env)
	}
	extraEnv, err := parseEnvFlags(set, f.passEnv)
	if err != nil {
		return setupFailed(err)
	}
	trusted, err := parseTrustedCIDRs(f.trustedCIDRs)
	if err != nil {
		return setupFailed(err)
	}
	if f.timeout < 0 {
		return setupFailed(fmt.Errorf("--timeout %s: must be positive", f.timeout))
	}
	workdir, namedWorkdir, err := resolveWorkdir(f.workdir)
	if err != nil {
		return setupFailed(err)
	}
	state, err := absStateDir(f.stateDir)
	if err != nil {
		return setupFailed(err)
	}
	if err := os.MkdirAll(state, 0o700); err != nil {
		return setupFailed(fmt.Errorf("create state directory %s: %w", state, err))
	}
	auditPath := statedir.AuditLog(state)
	if f.auditLog != "" {
		if auditPath, err = filepath.Abs(f.auditLog); err != nil {
			return setupFailed(err)
		}
	}
	sink, err := audit.Open(auditPath)
	if err != nil {
		return setupFailed(err)
	}
	defer sink.Close()
	tr.Step("audit log opened")
	id := newID()
	aud := sink.For(id, f.session)

	pol, err := loadPolicy(f.policy, workdir)
	if err != nil {
		aud.Log(audit.SandboxCompileErrorEvent{Error: err.Error(), Policy: f.policy})
		return setupFailed(err)
	}
	policySpec := f.policy
	var gw sandbox.GatewayLink
	if f.gateway != "" {
		var gwPol *policy.Policy
		if gw, gwPol, err = connectGateway(cmd, f, state, argv, workdir, log, aud); err != nil {
			return setupFailed(err)
		}
		defer func() {
			var ee *exitError
			code, err := 0, retErr
			if errors.As(retErr, &ee) {
				code, err = ee.code, ee.err
			}
			gw.Finish(code, err)
		}()
		log = gw.Logger(log)
		if gwPol != nil {
			pol, policySpec = gwPol, ""
		}
		tr.Step("gateway connected")
	}
	if gw != nil {
		if err := gw.CheckSecrets(pol); err != nil {
			aud.Log(audit.SandboxCompileErrorEvent{Error: err.Error(), Policy: pol.Source})
			return setupFailed(err)
		}
	} else if names := pol.GatewaySecrets(); len(names) > 0 {
		err := fmt.Errorf("the policy takes %s from_gateway, but corral run has no --gateway (or CORRAL_GATEWAY) to take them from", strings.Join(names, ", "))
		aud.Log(audit.SandboxCompileErrorEvent{Error: err.Error(), Policy: pol.Source})
		return setupFailed(err)
	}
	for _, w := range pol.Warnings() {
		log.Warn("policy: " + w.String())
	}
	if err := learnMode(pol, f.learn, cmd.ErrOrStderr()); err != nil {
		aud.Log(audit.SandboxCompileErrorEvent{Error: err.Error(), Policy: pol.Source})
		return setupFailed(err)
	}
	tr.Step("policy loaded")
	// As root the sandbox's network namespace is made from here on, on the
	// other core, while the plan is built; Run checks it is what the plan
	// asks for.
	var launcher *sandbox.Launcher
	if !f.noSandbox && !pol.SandboxDisabled() {
		launcher = sandbox.StartLauncher(pol.NetworkMode(), tr)
		defer launcher.Stop()
	}

	host := planner.LocalHost(state)
	swept, err := sandbox.Sweep(state, host.Cgroups)
	for _, old := range swept {
		log.Warn("removed state left by a sandbox whose supervisor died", "sandbox", old)
		aud.Log(audit.SandboxStaleSweptEvent{StaleSandboxID: old})
	}
	if err != nil {
		log.Warn("could not remove all stale sandbox state", "err", err)
	}

	planPol, err := gitsrc.ForPlan(pol, workdir, policySpec)
	if err != nil {
		aud.Log(audit.SandboxCompileErrorEvent{Error: err.Error(), Policy: pol.Source})
		return setupFailed(err)
	}
	// The files that chose this cage choose the next run's too, when the
	// same command line runs again.
	var cageFiles []string
	for _, file := range []string{policySpec, f.policyRules, f.inferenceRoutes} {
		if abs, err := filepath.Abs(file); file != "" && !gitsrc.IsSpec(file) && err == nil {
			cageFiles = append(cageFiles, abs)
		}
	}
	planPol = planPol.ReadOnlyWhereWritable(workdir, cageFiles)
	pl, err := planner.Build(planPol, planner.Context{Workdir: workdir, StateDir: state, AuditLog: auditPath, ID: id, Session: f.session, Path: inheritedPath()}, host)
	if err != nil {
		aud.Log(audit.SandboxCompileErrorEvent{Error: err.Error(), Policy: pol.Source})
		return setupFailed(err)
	}
	// A symlink an earlier sandbox could have planted where it could
	// write (its working directory, say) must not choose where this one
	// writes: `cd build && corral run` with build -> ~ would hand it the
	// home directory.
	if err := planner.PlantedLink(host, namedWorkdir, statedir.WritableBefore(state)); err != nil {
		err = fmt.Errorf("working directory %s: %w; an earlier sandbox could write there: if %s is meant, name it with --workdir", namedWorkdir, err, workdir)
		aud.Log(audit.SandboxCompileErrorEvent{Error: err.Error(), Policy: pol.Source})
		return setupFailed(err)
	}
	if err := statedir.RecordWritable(state, writableSources(pl, state)); err != nil {
		log.Warn("could not record the directories this sandbox can write, which later runs check their working directory against", "err", err)
	}
	tr.Step("stale state swept, plan built")
	if len(pl.PathDropped) > 0 {
		log.Debug("PATH entries that do not exist inside the sandbox are left out", "dropped", strings.Join(pl.PathDropped, string(filepath.ListSeparator)))
	}

	uncaged := ""
	switch {
	case f.noSandbox:
		uncaged = reasonFlagNoSandbox
	case !pl.Caged:
		uncaged = reasonPolicyDisabled
	}
	if uncaged == "" {
		for _, w := range pl.Warnings {
			log.Warn(w)
		}
	}
	walltime := time.Duration(pl.Limits.WalltimeMS) * time.Millisecond
	if f.timeout > 0 {
		walltime = f.timeout
		// sandbox.start's summary is read from the plan: it must show the
		// walltime in force, not the policy's.
		pl.Limits.WalltimeMS = walltime.Milliseconds()
	}
	compiled, err := pol.Compile()
	if err != nil {
		aud.Log(audit.SandboxCompileErrorEvent{Error: err.Error(), Policy: pol.Source})
		return setupFailed(fmt.Errorf("compile policy: %w", err))
	}
	routes, fileRoutes := compiled.Inference, (*inference.Config)(nil)
	if f.inferenceRoutes != "" {
		c, err := inference.LoadRoutesFile(f.inferenceRoutes)
		if err != nil {
			return setupFailed(fmt.Errorf("--inference-routes: %w", err))
		}
		routes, fileRoutes = c, &c
		if gw != nil && gw.HasRoutes() {
			log.Warn("--inference-routes wins over the gateway's model routes for this run, and the gateway's updates to them are ignored")
		}
	} else if gw != nil {
		if c := gw.Routes(); c != nil {
			routes, fileRoutes = *c, c
		}
	}
	if fileRoutes != nil {
		origin := "the gateway's routes"
		if f.inferenceRoutes != "" {
			origin = "--inference-routes " + f.inferenceRoutes
		}
		if err := planner.RouteKeysHidden(pl, host, origin, fileRoutes.Routes); err != nil {
			aud.Log(audit.SandboxCompileErrorEvent{Error: err.Error(), Policy: pol.Source})
			return setupFailed(err)
		}
	}
	src := secrets.Sources{Getenv: os.Getenv}
	if gw != nil {
		src.Gateway = gw.SecretLookup()
	}
	masked, err := secrets.LoadFrom(compiled.Secrets, src)
	if err != nil {
		aud.Log(audit.SandboxCompileErrorEvent{Error: err.Error(), Policy: pol.Source})
		return setupFailed(fmt.Errorf("load secrets: %w", err))
	}
	tr.Step("policy compiled, secrets loaded")
	// In proxy mode the egress is built on a goroutine of its own while
	// Run makes the run directory, the cgroup and the init, and Run waits
	// for it once the init is cloned: on a 2-core VM that took a few
	// milliseconds off the start (bench/startup.sh). Its errors come back
	// from Run as a *sandbox.EgressError and are reported as before.
	var egress func() (*assemble.Egress, error)
	if pl.Network.Capture != nil && uncaged == "" {
		egress = onItsOwn(tr.Fork(), func() (*assemble.Egress, error) {
			return newEgress(compiled, fileRoutes, pl, host, masked, f, id, aud, log)
		})
	} else if masked.Len() > 0 {
		log.Warn("secrets: the workload gets surrogates, but without corral's proxy nothing swaps them for the real values, so requests using them will fail",
			"secrets", masked.Names())
	}
	var inferenceEnv []string
	if egress != nil {
		inferenceEnv = routes.Environ()
	} else if len(routes.Routes) > 0 {
		log.Warn("inference routes are served only in proxy mode; inference.local does not exist in this sandbox")
	}
	compileFailed := func(err error) error {
		aud.Log(audit.SandboxCompileErrorEvent{Error: err.Error(), Policy: pol.Source})
		return setupFailed(err)
	}
	var policies *reload.Reloader
	if egress == nil {
		if policies, err = reload.New(compiled, nil, aud, log); err != nil {
			return setupFailed(err)
		}
	}
	if gw != nil {
		t := sandbox.GatewayTargets{Policy: policies, Secrets: masked}
		var eg *assemble.Egress
		if egress != nil {
			// The gateway updates what the egress serves: it waits for it.
			if eg, err = egress(); err != nil {
				return compileFailed(err)
			}
			t.Policy = eg.Policy()
		}
		switch {
		case f.inferenceRoutes != "":
			t.RoutesFixed = "--inference-routes given locally wins"
		case eg == nil:
			t.RoutesFixed = "model routes are served only in proxy mode"
		default:
			t.Routes = eg.SetRoutes
		}
		gw.Serve(cmd.Context(), t)
	}
	env := masked.ScrubEnv(workloadEnv(os.Environ(), pl, uncaged != "", slices.Concat(inferenceEnv, masked.Env(), extraEnv)))
	code, err := sandbox.Run(cmd.Context(), sandbox.Options{
		ID: id, Session: f.session, Plan: pl, Argv: argv, Env: env,
		StateDir: state, Cgroups: host.Cgroups, Walltime: walltime,
		Audit: aud, Log: log, PolicySHA: compiled.SHA256, PolicyCommit: gitsrc.Commit(pol.Source), Policy: policies, UncagedReason: uncaged, Egress: egress,
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Trace: tr, TrustedCIDRs: trusted, AdvisorProbe: f.advisorProbe,
		Launcher: launcher, TimerSlack: slack, NotifyConnects: os.Getenv(notifyConnectsEnv) == "1",
		Running: func() {
			resumeGC()
			log.Debug("set-up over: garbage collection resumed")
		},
	})
	if ee, ok := errors.AsType[*sandbox.EgressError](err); ok {
		return compileFailed(ee.Err)
	}
	if err != nil || code != 0 {
		return &exitError{code: code, err: err}
	}
	return nil
}

// onItsOwn runs build on a goroutine of its own and returns what waits for
// its result; tr traces when it ended.
func onItsOwn(tr *trace.Tracer, build func() (*assemble.Egress, error)) func() (*assemble.Egress, error) {
	var eg *assemble.Egress
	var err error
	done := make(chan struct{})
	go func() {
		eg, err = build()
		tr.Step("egress prepared (decision index, sandbox CA, model routes), alongside")
		close(done)
	}()
	return func() (*assemble.Egress, error) {
		<-done
		return eg, err
	}
}

// fullRunNeeds names what of f only the full program has, or "".
func fullRunNeeds(f runFlags) string {
	switch {
	case f.policyRules != "" && !userrules.Available():
		return "--policy-rules"
	case f.gateway != "" && full == nil:
		return "--gateway"
	}
	return ""
}

// connectGateway connects to --gateway and returns the policy it gives
// the sandbox, nil when it has none.
func connectGateway(cmd *cobra.Command, f runFlags, state string, argv []string, workdir string, log *slog.Logger, aud *audit.Logger) (sandbox.GatewayLink, *policy.Policy, error) {
	if f.gatewayCA == "" || f.gatewayToken == "" {
		return nil, nil, errors.New("--gateway needs --gateway-ca and --gateway-token-file")
	}
	// The run's policy goes with a join, for the gateway to start from.
	var joinPolicy []byte
	var err error
	switch {
	case gitsrc.IsSpec(f.policy):
		if joinPolicy, _, _, err = gitsrc.Load(workdir, f.policy); err != nil {
			return nil, nil, fmt.Errorf("--policy: %w", err)
		}
	case f.policy != "":
		if joinPolicy, err = os.ReadFile(f.policy); err != nil {
			return nil, nil, fmt.Errorf("--policy: %w", err)
		}
	}
	return full.ConnectGateway(cmd.Context(), sandbox.GatewayOptions{
		URL: f.gateway, CAFile: f.gatewayCA, TokenFile: f.gatewayToken, StateDir: state,
		Name: f.name, Labels: f.labels, Argv: argv, Workdir: workdir, Policy: joinPolicy, Log: log,
		HostKeys: f.gatewayHostKeys,
	}, aud)
}

// loadPolicy loads the --policy given: a path, "git:REF:PATH" (read from
// the repository workdir is in), or "" for the built-in default.
func loadPolicy(spec, workdir string) (*policy.Policy, error) {
	switch {
	case spec == "":
		return policy.Default(), nil
	case gitsrc.IsSpec(spec):
		return gitsrc.LoadPolicy(workdir, spec)
	}
	return policy.Load(spec)
}

// writableSources are the host directories pl mounts writable, but for
// corral's own in the state directory (a run's scratch), which no later
// working directory can lie in.
func writableSources(pl *plan.Plan, state string) []string {
	var dirs []string
	for _, m := range pl.Mounts {
		if m.Kind == plan.KindBind && !m.ReadOnly && !strings.HasPrefix(m.Source, state+"/") {
			dirs = append(dirs, m.Source)
		}
	}
	return dirs
}

// resolveWorkdir returns the working directory dir names (the current one
// if dir is empty), symlinks resolved, and the path it was reached by.
func resolveWorkdir(dir string) (real, named string, err error) {
	if dir == "" {
		// Getwd gives $PWD, the path the shell reached it by, when that
		// still names this directory.
		if dir, err = os.Getwd(); err != nil {
			return "", "", fmt.Errorf("current directory: %w", err)
		}
	}
	named, err = filepath.Abs(dir)
	if err != nil {
		return "", "", err
	}
	// The user named this directory, so following their symlinks is
	// right, unless a sandbox could have planted one (see run).
	real, err = filepath.EvalSymlinks(named)
	if err != nil {
		return "", "", fmt.Errorf("--workdir %s: %w", dir, err)
	}
	return real, named, nil
}

func newID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// parseEnvFlags checks --env and --pass-env up front, so a typo fails the
// run instead of silently starting the workload without a variable.
func parseEnvFlags(set, pass []string) ([]string, error) {
	var out []string
	for _, name := range pass {
		v, ok := os.LookupEnv(name)
		if !ok {
			return nil, fmt.Errorf("--pass-env %s: not set in corral's environment", name)
		}
		out = append(out, name+"="+v)
	}
	for _, kv := range set {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.ContainsAny(k, " \x00") {
			return nil, fmt.Errorf("--env %q: want NAME=VALUE", kv)
		}
		out = append(out, kv)
	}
	return out, nil
}

// readEnvFile reads --env-file: one NAME=VALUE per line; blank lines and
// lines starting with # are skipped.
func readEnvFile(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--env-file: %w", err)
	}
	var out []string
	n := 0
	for line := range strings.Lines(string(b)) {
		n++
		line = strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r")
		if t := strings.TrimSpace(line); t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		if k, _, ok := strings.Cut(line, "="); !ok || k == "" || strings.ContainsAny(k, " \t\x00") {
			return nil, fmt.Errorf("--env-file %s line %d: want NAME=VALUE", path, n)
		}
		out = append(out, line)
	}
	return out, nil
}

// safeEnv names what passes from corral's environment by default: enough
// for tools to behave, nothing that carries credentials.
func safeEnv(key string) bool {
	switch key {
	case "PATH", "TERM", "LANG", "TZ", "COLORTERM":
		return true
	}
	return strings.HasPrefix(key, "LC_")
}

// parseTrustedCIDRs reads --trusted-cidr: private networks only, since
// the advisor proposes them as allowed_ips, which never open the others.
func parseTrustedCIDRs(in []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(in))
	for _, s := range in {
		p, err := netip.ParsePrefix(s)
		if err != nil || p != p.Masked() {
			return nil, fmt.Errorf("--trusted-cidr %q: want a network such as 10.20.0.0/16", s)
		}
		if class, internal := netclass.Classify(p.Addr()); !internal || netclass.NeverAllowed(class) {
			return nil, fmt.Errorf("--trusted-cidr %s: only private networks can be trusted, not %s addresses", s, class)
		}
		out = append(out, p)
	}
	return out, nil
}

// newEgress checks proxy mode's flags and hands what they say, with the
// policy, the plan's limits and the secrets, to the egress assembly.
func newEgress(p *policy.Compiled, routes *inference.Config, pl *plan.Plan, host planner.Host, masked *secrets.Set, f runFlags, id string, aud *audit.Logger, log *slog.Logger) (*assemble.Egress, error) {
	var rules []byte
	if f.policyRules != "" {
		var err error
		if rules, err = os.ReadFile(f.policyRules); err != nil {
			return nil, fmt.Errorf("--policy-rules: %w", err)
		}
	}
	if f.upstreamDNS != "" {
		if _, _, err := net.SplitHostPort(f.upstreamDNS); err != nil {
			return nil, fmt.Errorf("--upstream-dns %q: want HOST:PORT, e.g. 192.0.2.53:53", f.upstreamDNS)
		}
	}
	roots, err := upstreamRoots(f.upstreamCA)
	if err != nil {
		return nil, err
	}
	return assemble.New(assemble.Config{
		ID: id, Hostname: pl.Hostname, Policy: p, Rules: rules, UpstreamDNS: f.upstreamDNS, UpstreamRoots: roots,
		Secrets: masked, Inference: routes, Limits: pl.Limits, Audit: aud, Log: log,
		RouteKeys: func(origin string, rs []inference.Route) error { return planner.RouteKeysHidden(pl, host, origin, rs) },
	})
}

// upstreamRoots returns the host's roots plus every certificate in files.
// The files are read now, so a bad one stops the run before it starts; the
// host's roots are loaded (tens of milliseconds) only when an inspected
// connection first needs them.
func upstreamRoots(files []string) (func() *x509.CertPool, error) {
	var extra []*x509.Certificate
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("--upstream-ca: %w", err)
		}
		found := 0
		for rest := data; ; {
			var block *pem.Block
			if block, rest = pem.Decode(rest); block == nil {
				break
			}
			if block.Type != "CERTIFICATE" {
				continue
			}
			c, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("--upstream-ca %s: %w", name, err)
			}
			extra = append(extra, c)
			found++
		}
		if found == 0 {
			return nil, fmt.Errorf("--upstream-ca %s: no PEM certificate in it", name)
		}
	}
	return sync.OnceValue(func() *x509.CertPool {
		roots, err := x509.SystemCertPool()
		if err != nil {
			roots = x509.NewCertPool()
		}
		for _, c := range extra {
			roots.AddCert(c)
		}
		return roots
	}), nil
}

func workloadEnv(host []string, pl *plan.Plan, uncaged bool, extra []string) []string {
	u := pl.User
	vals := map[string]string{"PATH": defaultPath}
	order := []string{"PATH"}
	set := func(k, v string) {
		if _, ok := vals[k]; !ok {
			order = append(order, k)
		}
		vals[k] = v
	}
	for _, kv := range host {
		if k, v, ok := strings.Cut(kv, "="); ok && safeEnv(k) {
			set(k, v)
		}
	}
	home := u.Home
	if uncaged {
		home, _ = os.UserHomeDir()
	}
	set("HOME", home)
	if !uncaged {
		set("PATH", pl.Path)
	}
	set("USER", u.Name)
	set("LOGNAME", u.Name)
	set("CORRAL_SANDBOX", "1")
	if !uncaged {
		for _, kv := range pl.ProxyEnv() {
			k, v, _ := strings.Cut(kv, "=")
			set(k, v)
		}
	}
	for _, kv := range extra {
		k, v, _ := strings.Cut(kv, "=")
		if prev, ok := vals[k]; ok && k == plan.JavaToolOptions && !uncaged {
			// Appended, so the JVM still trusts the sandbox's CA.
			v = prev + " " + v
		}
		set(k, v)
	}
	env := make([]string, 0, len(order))
	for _, k := range order {
		env = append(env, k+"="+vals[k])
	}
	return env
}
