package sandbox

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"

	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/linux/capture"
	"github.com/corral-sandbox/corral/internal/linux/netthread"
	"github.com/corral-sandbox/corral/internal/plan"
	"github.com/corral-sandbox/corral/internal/policy"
)

// A launcher started ahead of the run serves the run only if it prepared
// what the plan asks for; otherwise the run gets a launcher of its own and
// the early one ends, its listeners closed.
func TestLauncherForPlan(t *testing.T) {
	requireRoot(t)
	cfg := capture.DefaultConfig
	capturePlan := &plan.Capture{DNSPort: cfg.DNSPort, TransparentPort: cfg.TransparentPort,
		HTTPProxyPort: cfg.HTTPProxyPort, SOCKSPort: cfg.SOCKSPort}
	ns := []string{"mount", "pid", "ipc", "uts", "cgroup", "net"}
	for _, tc := range []struct {
		name  string
		mode  string
		plan  plan.Plan
		keeps bool
		// prepares and captures describe the launcher the run gets.
		prepares, captures bool
	}{
		{"proxy as planned", policy.ModeProxy, plan.Plan{Namespaces: ns, Network: plan.Network{Capture: capturePlan}}, true, true, true},
		{"block as planned", policy.ModeBlock, plan.Plan{Namespaces: ns}, true, true, false},
		{"proxy, plan blocks", policy.ModeProxy, plan.Plan{Namespaces: ns}, false, true, false},
		{"block, plan captures", policy.ModeBlock, plan.Plan{Namespaces: ns, Network: plan.Network{Capture: capturePlan}}, false, true, true},
		{"proxy, plan rootless", policy.ModeProxy, plan.Plan{Rootless: true, Namespaces: append([]string{"user"}, ns...),
			Network: plan.Network{Capture: capturePlan}}, false, false, false},
		{"proxy, plan on other ports", policy.ModeProxy, plan.Plan{Namespaces: ns, Network: plan.Network{Capture: &plan.Capture{
			DNSPort: 5353, TransparentPort: 15002, HTTPProxyPort: 3129, SOCKSPort: 1081}}}, false, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			early := StartLauncher(tc.mode, nil)
			if early == nil {
				t.Fatal("no launcher started as root")
			}
			defer early.Stop()
			if <-early.l.netDone; early.l.netErr != nil {
				t.Fatal(early.l.netErr)
			}
			s := &supervisor{Options: Options{Plan: &tc.plan}}
			l := s.launcherFor(early)
			defer l.stop()
			if (l == early.l) != tc.keeps {
				t.Fatalf("kept the early launcher: %v, want %v", l == early.l, tc.keeps)
			}
			if l.prepares != tc.prepares || (l.capture != nil) != tc.captures {
				t.Fatalf("the run's launcher prepares %v with capture %v, want %v and %v", l.prepares, l.capture, tc.prepares, tc.captures)
			}
			if _, err := l.network(); err != nil {
				t.Fatal(err)
			}
			if !tc.keeps {
				if !early.l.stopped {
					t.Fatal("the early launcher was not stopped")
				}
				if ls := early.l.listeners; ls != nil {
					if _, err := ls.DNSUDP.Stat(); !errors.Is(err, os.ErrClosed) {
						t.Fatalf("the early launcher's listeners are still open: %v", err)
					}
				}
			}
		})
	}
}

// Nothing is started early rootless or on the host's network.
func TestNoEarlyLauncher(t *testing.T) {
	if StartLauncher(policy.ModeAllow, nil) != nil {
		t.Fatal("a launcher started for network mode allow")
	}
	if os.Geteuid() != 0 && StartLauncher(policy.ModeProxy, nil) != nil {
		t.Fatal("a launcher started rootless")
	}
	(*Launcher)(nil).Stop()
}

// The process the launcher starts is in the namespace it prepared, from
// its first instruction: the clone leaves out CLONE_NEWNET.
func TestLauncherStartsIntoItsNamespace(t *testing.T) {
	requireRoot(t)
	l := startLauncher(true, nil, nil)
	defer l.stop()
	cmd := exec.Command("/bin/readlink", "/proc/self/ns/net")
	var out bytes.Buffer
	cmd.Stdout = &out
	done := make(chan struct{})
	if err := l.start(cmd, slog.Default(), done); err != nil {
		t.Fatal(err)
	}
	<-done
	var st unix.Stat_t
	if err := unix.Fstat(int(l.ns), &st); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("net:[%d]", st.Ino); strings.TrimSpace(out.String()) != want {
		t.Fatalf("the started process is in %q, want %s", strings.TrimSpace(out.String()), want)
	}
	if netthread.In(l.ns, os.Getpid()) {
		t.Fatal("the prepared namespace is the test's own")
	}
}

// requireRoot skips a test that needs root (a network namespace and its
// capture), unless CORRAL_NO_SKIP asks for every skip to count as a
// failure (as CI does).
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CORRAL_NO_SKIP") != "" {
		t.Fatal("needs root (a network namespace and its capture); CORRAL_NO_SKIP is set")
	}
	t.Skip("needs root (a network namespace and its capture)")
}

// An init that is not in the namespace the launcher prepared is killed
// and the start fails: here the launcher is told its namespace is the
// test's own, which the init, cloned from the launcher's thread, is not in.
func TestLauncherRefusesAnInitElsewhere(t *testing.T) {
	requireRoot(t)
	l := startLauncher(true, nil, nil)
	defer l.stop()
	<-l.nsDone
	if l.nsErr != nil {
		t.Fatal(l.nsErr)
	}
	host, err := vns.GetFromPid(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	l.ns.Close()
	l.ns = host
	cmd := exec.Command("/bin/sleep", "30")
	done := make(chan struct{})
	err = l.start(cmd, slog.Default(), done)
	if err == nil || !strings.Contains(err.Error(), "not in the network namespace prepared for it") {
		t.Fatalf("got %v, want the start refused", err)
	}
	select {
	case <-done:
	default:
		t.Fatal("the init was left running")
	}
}
