package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestExitCodes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		args   func(fx *fixture) []string
		policy string
		code   int
		check  func(t *testing.T, r *result)
	}{
		{name: "workload-code", args: func(fx *fixture) []string { return []string{fx.attack, "exit", "42"} }, code: 42},
		{name: "killed-by-signal", args: func(fx *fixture) []string { return []string{fx.attack, "raise", "10"} }, code: 128 + 10,
			check: func(t *testing.T, r *result) {
				r.requireEvent(t, "sandbox.killed", map[string]any{"reason": "signal", "signal": "SIGUSR1"})
			}},
		{name: "not-executable", code: 126, args: func(fx *fixture) []string {
			p := filepath.Join(fx.W, "script.sh")
			if err := os.WriteFile(p, []byte("#!/bin/sh\necho hi\n"), 0o644); err != nil {
				panic(err)
			}
			return []string{p}
		}},
		{name: "directory", code: 126, args: func(fx *fixture) []string { return []string{fx.W} }},
		{name: "command-not-found", code: 127, args: func(*fixture) []string { return []string{"corral-e2e-no-such-command"} }},
		{name: "path-not-found", code: 127, args: func(fx *fixture) []string { return []string{filepath.Join(fx.W, "missing")} }},
		// A command given relative to the workdir, as `corral run -- ./x`.
		{name: "relative-command", code: 7, args: func(*fixture) []string { return []string{"./attack", "exit", "7"} }},
		{name: "invalid-policy", code: 125, policy: "version: 1\nfilesystem_polcy: {}\n",
			args: func(fx *fixture) []string { return []string{fx.attack, "exit", "0"} },
			check: func(t *testing.T, r *result) {
				r.requireEvent(t, "sandbox.compile_error", nil)
				if len(r.find("sandbox.start")) > 0 {
					t.Fatalf("the workload started despite an invalid policy\n%s", r)
				}
			}},
	}
	forEachMode(t, true, func(t *testing.T, m *mode) {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				fx := newFixture(t, m)
				r := runCorral(t, fx, runOpts{args: c.args(fx), policy: c.policy})
				if r.code != c.code {
					t.Fatalf("want exit %d\n%s", c.code, r)
				}
				if c.code != 125 && len(r.find("sandbox.exit")) == 0 {
					// A command that cannot be executed ends as a set-up error.
					r.requireEvent(t, "sandbox.setup_error", map[string]any{"code": c.code})
				} else if c.code != 125 {
					r.requireEvent(t, "sandbox.exit", map[string]any{"code": c.code})
				}
				if c.check != nil {
					c.check(t, r)
				}
			})
		}
	})
}

// TestBadEgressInputRefused: a proxy-mode run whose egress cannot be built
// from what it was given (an --upstream-ca file without a certificate)
// fails as bad input: exit 125 with the reason, one sandbox.compile_error
// and no sandbox.start or sandbox.setup_error, the workload never run, and
// nothing left of the sandbox. The egress is built while the sandbox is
// being made, so by the time this fails the init has been cloned and must
// be undone.
func TestBadEgressInputRefused(t *testing.T) {
	forEachMode(t, true, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		bad := filepath.Join(fx.W, "no-certificate.pem")
		writeOwned(t, m, bad, []byte("not a certificate\n"), 0o644)
		ran := filepath.Join(fx.W, "ran")
		r := runCorral(t, fx, runOpts{args: []string{"/bin/sh", "-c", "touch " + ran},
			policy: proxyPolicy(""), flags: []string{"--upstream-ca", bad}})
		if r.code != 125 || !strings.Contains(r.stderr, "no PEM certificate") {
			t.Fatalf("want exit 125 naming the bad --upstream-ca file\n%s", r)
		}
		failed := r.find("sandbox.compile_error")
		if len(failed) != 1 || len(r.find("sandbox.start")) > 0 || len(r.find("sandbox.setup_error")) > 0 {
			t.Fatalf("want one sandbox.compile_error and no sandbox.start or sandbox.setup_error\n%s", r)
		}
		if _, err := os.Stat(ran); err == nil {
			t.Error("the workload ran")
		}
		id := fmt.Sprint(failed[0]["sandbox_id"])
		if _, err := os.Lstat(filepath.Join(fx.state, "run", id)); err == nil {
			t.Errorf("run directory of %s left behind", id)
		}
		if left := existing(cgroupDirs(id)); len(left) > 0 {
			t.Errorf("cgroups left behind: %v", left)
		}
	})
}

// TestSignalForwarding sends signals to corral and expects the workload to
// receive them.
func TestSignalForwarding(t *testing.T) {
	t.Parallel()
	forEachMode(t, true, func(t *testing.T, m *mode) {
		t.Run("trapped-TERM", func(t *testing.T) {
			t.Parallel()
			fx := newFixture(t, m)
			p := startCorral(t, fx, runOpts{args: []string{fx.attack, "term-exit", "42"}})
			p.waitOutput("READY", 10*time.Second)
			if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			r := p.wait()
			if r.code != 42 || !strings.Contains(r.stdout, "caught SIGTERM") {
				t.Fatalf("want the workload to catch the forwarded SIGTERM and exit 42\n%s", r)
			}
		})
		// A signal for the command reaches its whole process group: here
		// the shell's foreground job dies of it while the shell, which
		// traps it, goes on to say so.
		t.Run("process-group", func(t *testing.T) {
			t.Parallel()
			fx := newFixture(t, m)
			// The job says READY itself, then becomes sleep: a
			// signal after READY finds it, whichever it is by then.
			p := startCorral(t, fx, runOpts{args: []string{"/bin/sh", "-c",
				`trap 'echo shell-got-TERM' TERM; /bin/sh -c 'echo READY; exec /bin/sleep 60'; echo job-ended $?`}})
			p.waitOutput("READY", 10*time.Second)
			if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			r := p.wait()
			if r.elapsed > 10*time.Second || !strings.Contains(r.stdout, "job-ended 143") || !strings.Contains(r.stdout, "shell-got-TERM") {
				t.Fatalf("want the job killed by SIGTERM and the shell told too\n%s", r)
			}
		})
		// The init catches no signal (the supervisor's come as messages):
		// one sent to it straight from the host ends the sandbox, and
		// corral says so.
		t.Run("init-signalled-directly", func(t *testing.T) {
			t.Parallel()
			fx := newFixture(t, m)
			p := startCorral(t, fx, runOpts{args: []string{fx.attack, "term-exit", "42"}})
			p.waitOutput("READY", 10*time.Second)
			init := initOf(t, p.cmd.Process.Pid)
			if err := syscall.Kill(init, syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			r := p.wait()
			if r.elapsed > 10*time.Second || strings.Contains(r.stdout, "caught SIGTERM") ||
				!strings.Contains(r.stderr, "the sandbox's init ended before reporting the command's end") {
				t.Fatalf("want the sandbox ended at once, the workload not signalled, and a warning\n%s", r)
			}
		})
		for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT} {
			t.Run("default-"+sig.String(), func(t *testing.T) {
				t.Parallel()
				fx := newFixture(t, m)
				// A C program, which leaves each signal its default
				// action (a Go one dumps its goroutines on SIGQUIT
				// and exits 2).
				p := startCorral(t, fx, runOpts{args: []string{"/bin/sleep", "60"}})
				time.Sleep(300 * time.Millisecond)
				if err := p.cmd.Process.Signal(sig); err != nil {
					t.Fatal(err)
				}
				r := p.wait()
				if r.code != 128+int(sig) || r.elapsed > 10*time.Second {
					t.Fatalf("want exit %d soon after %v\n%s", 128+int(sig), sig, r)
				}
			})
		}
	})
}

func TestState(t *testing.T) {
	t.Parallel()
	forEachMode(t, true, func(t *testing.T, m *mode) {
		t.Run("ephemeral", func(t *testing.T) {
			t.Parallel()
			fx := newFixture(t, m)
			pol := systemPolicy("state: ephemeral\n")
			r := runCorral(t, fx, runOpts{args: []string{fx.attack, "write", "/scratch/f", "hello"}, policy: pol})
			if r.code != 0 {
				t.Fatalf("/scratch is not writable with state: ephemeral\n%s", r)
			}
			id := r.sandboxID(t)
			if _, err := os.Lstat(filepath.Join(fx.state, "run", id)); err == nil {
				t.Fatalf("ephemeral scratch of %s left on the host", id)
			}
			r = runCorral(t, fx, runOpts{args: []string{fx.attack, "read", "/scratch/f"}, policy: pol})
			requireBlocked(t, r, "ENOENT")
		})
		t.Run("scratch-session", func(t *testing.T) {
			t.Parallel()
			fx := newFixture(t, m)
			pol := systemPolicy("state: scratch\n")
			session := "e2e-" + uniq + "-" + m.name
			sess := []string{"--session", session}
			r := runCorral(t, fx, runOpts{args: []string{fx.attack, "write", "/scratch/keep", "kept"}, policy: pol, flags: sess})
			if r.code != 0 {
				t.Fatalf("/scratch is not writable with state: scratch\n%s", r)
			}
			if r.find("sandbox.start")[0]["session"] != session {
				t.Fatalf("audit events do not carry the session\n%s", r)
			}
			r = runCorral(t, fx, runOpts{args: []string{fx.attack, "read", "/scratch/keep"}, policy: pol, flags: sess})
			if r.code != 0 || !strings.Contains(r.stdout, `"kept"`) {
				t.Fatalf("the file written to /scratch in the same session is gone\n%s", r)
			}
			r = runCorral(t, fx, runOpts{args: []string{fx.attack, "read", "/scratch/keep"}, policy: pol,
				flags: []string{"--session", session + "-other"}})
			requireBlocked(t, r, "ENOENT")
		})
	})
}

func TestUncaged(t *testing.T) {
	t.Parallel()
	forEachMode(t, true, func(t *testing.T, m *mode) {
		for _, c := range []struct {
			name, reason, policy string
			flags                []string
		}{
			{name: "flag", reason: "flag_no_sandbox", flags: []string{"--no-sandbox"}},
			{name: "policy", reason: "policy_disabled", policy: "version: 1\nsandbox: disabled\n"},
		} {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				fx := newFixture(t, m)
				secret := filepath.Join(newDir(t, m, "uncaged-"), "host.txt")
				if err := os.WriteFile(secret, []byte("host file\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				// Caged, the file does not exist ...
				r := runCorral(t, fx, runOpts{args: []string{fx.attack, "read", secret}})
				requireBlocked(t, r, "ENOENT")
				// ... uncaged it does, and the audit log says why.
				r = runCorral(t, fx, runOpts{args: []string{fx.attack, "read", secret}, policy: c.policy, flags: c.flags})
				if r.code != 0 || !strings.Contains(r.stdout, "host file") {
					t.Fatalf("uncaged run cannot read a host file\n%s", r)
				}
				r.requireEvent(t, "sandbox.start.uncaged", map[string]any{"reason": c.reason})
				if len(r.find("sandbox.start")) > 0 {
					t.Fatalf("an uncaged run logged a caged sandbox.start\n%s", r)
				}
				if !strings.Contains(strings.ToUpper(r.stderr), "WITHOUT") {
					t.Fatalf("no loud warning that the run is not sandboxed\n%s", r)
				}
				// The walltime still applies.
				r = runCorral(t, fx, runOpts{args: []string{fx.attack, "sleep", "60"}, policy: c.policy,
					flags: append([]string{"--timeout", "2s"}, c.flags...)})
				if r.code != 124 || r.elapsed < 2*time.Second || r.elapsed > 7*time.Second {
					t.Fatalf("want exit 124 2-7 s into an uncaged run with --timeout 2s\n%s", r)
				}
				r.requireEvent(t, "sandbox.killed", map[string]any{"reason": "walltime_exceeded"})
			})
		}
	})
}

// TestEnv: only a small safe set of corral's environment reaches the
// workload, plus what --env and --pass-env name.
func TestEnv(t *testing.T) {
	t.Parallel()
	allowed := []string{"PATH", "HOME", "TERM", "LANG", "TZ", "USER", "CORRAL_SANDBOX",
		// Harmless extras corral passes on.
		"LOGNAME", "COLORTERM",
		// Set by this test.
		"FOO", "PASSME", "FROMFILE", "HOSTPID", "SUPPID"}
	forEachMode(t, true, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		// In the suite's 0755 directory: rootless, corral runs as another user.
		envFile := filepath.Join(baseDir, "env-"+m.name)
		t.Cleanup(func() { os.Remove(envFile) })
		if err := os.WriteFile(envFile, []byte("# set from a file\nFROMFILE=a b=c\n\nFOO=overridden by --env\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		r := runCorral(t, fx, runOpts{
			args:  []string{fx.attack, "env"},
			flags: []string{"--env-file", envFile, "--env", "FOO=bar=baz", "--pass-env", "PASSME"},
			env: []string{"SECRET_TOKEN=s3cr3t-token", "AWS_SECRET_ACCESS_KEY=aws-s3cr3t", "SSH_AUTH_SOCK=/tmp/agent.sock",
				"PASSME=passed", "TZ=UTC", "LC_ALL=C.UTF-8", "TERM=dumb"},
		})
		if r.code != 0 {
			t.Fatalf("env failed\n%s", r)
		}
		env := map[string]string{}
		for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
			k, v, _ := strings.Cut(l, "=")
			env[k] = v
		}
		for k, v := range map[string]string{"FOO": "bar=baz", "FROMFILE": "a b=c", "PASSME": "passed", "CORRAL_SANDBOX": "1",
			"TZ": "UTC", "LC_ALL": "C.UTF-8", "TERM": "dumb"} {
			if env[k] != v {
				t.Errorf("workload has %s=%q, want %q", k, env[k], v)
			}
		}
		for k, v := range env {
			// The default policy's proxy mode points the proxy variables
			// at the sandbox's own capture address.
			if strings.HasSuffix(strings.ToLower(k), "_proxy") && (strings.Contains(v, "198.19.255.254") || strings.Contains(v, "localhost")) {
				continue
			}
			// ... and the CA variables at the sandbox's CA.
			if strings.HasPrefix(v, "/run/corral/") && slices.Contains([]string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "NODE_EXTRA_CA_CERTS"}, k) {
				continue
			}
			// ... and Java at the same roots as a trust store.
			if k == "JAVA_TOOL_OPTIONS" && strings.HasPrefix(v, "-Djavax.net.ssl.trustStore=/run/corral/") {
				continue
			}
			if !slices.Contains(allowed, k) && !strings.HasPrefix(k, "LC_") {
				t.Errorf("%s from corral's environment reached the workload", k)
			}
		}
		if strings.Contains(r.stdout, "s3cr3t") || strings.Contains(r.stdout, "agent.sock") {
			t.Errorf("a secret from corral's environment reached the workload")
		}
		if t.Failed() {
			t.Log(r)
		}
	})
}

func TestHostname(t *testing.T) {
	t.Parallel()
	forEachMode(t, true, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		r := runCorral(t, fx, runOpts{args: []string{fx.attack, "hostname"}})
		if want := "corral-" + r.sandboxID(t); r.code != 0 || strings.TrimSpace(r.stdout) != want {
			t.Fatalf("want hostname %s\n%s", want, r)
		}
	})
}

// TestExecuteOnlyBinary: a binary its user may execute but not read. The
// kernel shows such a process only to those privileged over the binary's
// owner, and the init reads the new workload's /proc status to verify its
// credentials: as root it runs; rootless (root's files are outside the
// sandbox's user namespace) it is refused, with the reason, never started
// unverified.
func TestExecuteOnlyBinary(t *testing.T) {
	t.Parallel()
	forEachMode(t, true, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		prog := filepath.Join(fx.W, "xonly")
		copyFile(t, "/bin/true", prog, 0o755)
		if err := os.Chown(prog, 0, 0); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(prog, 0o111); err != nil {
			t.Fatal(err)
		}
		r := runCorral(t, fx, runOpts{args: []string{prog}})
		if !m.rootless && r.code != 0 {
			t.Fatalf("an execute-only binary did not run\n%s", r)
		}
		if m.rootless && (r.code != 125 || !strings.Contains(r.stderr, "is execute-only for the sandbox's user")) {
			t.Fatalf("rootless: want exit 125 saying the binary is execute-only\n%s", r)
		}
	})
}

// TestIdentity: as root the workload runs as the workdir's owner, or as
// nobody when root owns the workdir; rootless, as the invoking user.
func TestIdentity(t *testing.T) {
	t.Parallel()
	forEachMode(t, true, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		r := runCorral(t, fx, runOpts{args: []string{fx.attack, "whoami"}})
		want := fmt.Sprintf("uid=%d euid=%d suid=%d", m.uid, m.uid, m.uid)
		if r.code != 0 || strings.TrimSpace(r.stdout) != want {
			t.Fatalf("want %s\n%s", want, r)
		}
		if m.rootless {
			return
		}
		if err := os.Chown(fx.W, 0, 0); err != nil {
			t.Fatal(err)
		}
		r = runCorral(t, fx, runOpts{args: []string{fx.attack, "whoami"}})
		if want := "uid=65534 euid=65534 suid=65534"; r.code != 0 || strings.TrimSpace(r.stdout) != want {
			t.Fatalf("root-owned workdir: want %s\n%s", want, r)
		}
	})
}

// TestInteractiveShell: `corral run -- bash -i` on a terminal gets a
// controlling terminal of its own and working job control.
func TestInteractiveShell(t *testing.T) {
	t.Parallel()
	forEachMode(t, true, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		p := startCorral(t, fx, runOpts{args: []string{"/bin/bash", "--norc", "--noprofile", "-i"}, pty: true, timeout: 30 * time.Second})
		send := func(s string) {
			if _, err := p.ptm.Write([]byte(s)); err != nil {
				t.Fatal(err)
			}
		}
		p.waitOutput("$ ", 10*time.Second)
		// Markers are computed by the shell so that the terminal's echo of
		// the typed line does not already match them.
		send("tty; echo TTY-$((40+2))\n")
		p.waitOutput("TTY-42", 10*time.Second)
		send("set -o monitor; echo \"FLAGS=$-\"\n")
		p.waitOutput("FLAGS=", 10*time.Second)
		send("sleep 100 &\n")
		send("jobs; echo JOBS-$((40+2))\n")
		p.waitOutput("JOBS-42", 10*time.Second)
		send("kill %1; exit 0\n")
		r := p.wait()
		out := r.stdout
		if r.code != 0 {
			t.Fatalf("bash -i did not exit 0\n%s", out)
		}
		if !regexp.MustCompile(`(?m)(^|\r)/dev/pts/\d+\r?$`).MatchString(out) {
			t.Errorf("tty did not print a /dev/pts path")
		}
		if strings.Contains(out, "no job control") || strings.Contains(out, "cannot set terminal process group") {
			t.Errorf("bash has no job control")
		}
		if !regexp.MustCompile(`FLAGS=[A-Za-z]*m`).MatchString(out) {
			t.Errorf("set -o monitor did not take effect")
		}
		if !regexp.MustCompile(`\[1\]\+?\s+Running\s+sleep 100`).MatchString(out) {
			t.Errorf("jobs does not list the background sleep")
		}
		if t.Failed() {
			t.Logf("terminal output:\n%s", out)
		}
	})
}

// TestControlSocketRefusesSandboxes: a policy that exposes corral's own
// state directory does not start; and a sandbox that reaches another
// sandbox's control socket (rootless both run with the user's uid, and
// the other one keeps its state elsewhere) is refused, so it cannot
// replace that sandbox's policy.
func TestControlSocketRefusesSandboxes(t *testing.T) {
	t.Parallel()
	forEachMode(t, true, func(t *testing.T, m *mode) {
		victim := newFixture(t, m)
		if err := os.MkdirAll(victim.state, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := chownTree(victim.state, m.uid, m.gid); err != nil {
			t.Fatal(err)
		}
		exposing := fmt.Sprintf(`version: 1
filesystem_policy:
  read_only: [/usr, /lib, /lib64, /bin, /sbin, /etc, %s]
network: {mode: block}
`, victim.state)

		own := runCorral(t, victim, runOpts{args: []string{"/bin/true"}, policy: exposing})
		if own.code == 0 || !strings.Contains(own.stderr, "holds corral's state directory") {
			t.Fatalf("a policy exposing the state directory must not start\n%s", own)
		}

		running := startCorral(t, victim, runOpts{args: []string{"/bin/sleep", "30"}, policy: systemPolicy("")})
		attacker := newFixture(t, m)
		script := `import glob, json, socket, sys, time
socks = glob.glob(sys.argv[1] + "/run/*/control.sock")
if not socks:
    print("NOSOCK")
for p in socks:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(p)
    except OSError as e:
        print("CONNECT-FAILED", e)
        continue
    try:
        s.sendall(json.dumps({"op": "set_policy", "policy": "version: 1\n"}).encode() + b"\n")
    except OSError:
        pass  # the refusal may already be written and the socket closed
    print("REPLY", s.recv(4096).decode().strip())
`
		writeOwned(t, m, filepath.Join(attacker.W, "ctl.py"), []byte(script), 0o644)
		r := runCorral(t, attacker, runOpts{args: []string{"/usr/bin/python3", filepath.Join(attacker.W, "ctl.py"), victim.state}, policy: exposing})
		_ = running.cmd.Process.Signal(syscall.SIGTERM)
		v := running.wait()
		if r.code != 0 {
			t.Fatalf("probe failed\n%s", r)
		}
		if strings.Contains(r.stdout, `"ok":true`) || len(v.find("policy.reloaded")) > 0 {
			t.Fatalf("a sandbox replaced another sandbox's policy through its control socket\n%s\nvictim:\n%s", r, v)
		}
		if m.rootless && !strings.Contains(r.stdout, "refused: a process inside a sandbox may not control one") {
			t.Fatalf("rootless: want the other sandbox's control socket reached and the request refused\n%s", r)
		}
	})
}

// initOf finds the sandbox's init: the child of corral that runs a carried
// init program or corral itself as one. The init is cloned from one of
// corral's threads, so every thread's children are looked at.
func initOf(t *testing.T, corral int) int {
	t.Helper()
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", corral))
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, field := range strings.Fields(string(b)) {
			pid, _ := strconv.Atoi(field)
			args, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if strings.HasPrefix(string(args), "corral-init\x00") {
				return pid
			}
		}
	}
	t.Fatalf("no init among the children of corral (pid %d)", corral)
	return 0
}
