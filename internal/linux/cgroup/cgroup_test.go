package cgroup

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

const helperEnv = "CORRAL_CGROUP_TEST_HELPER"

// TestMain lets the test binary double as a child that allocates memory
// once the test has moved it into its cgroup.
func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "alloc" {
		var b [1]byte
		_, _ = os.Stdin.Read(b[:])
		buf := make([]byte, 100<<20)
		for i := 0; i < len(buf); i += 4096 {
			buf[i] = 1
		}
		fmt.Println("survived", len(buf))
		return
	}
	os.Exit(m.Run())
}

var seq atomic.Int64

func testID() string {
	return fmt.Sprintf("test-%d-%d", os.Getpid(), seq.Add(1))
}

func TestPlan(t *testing.T) {
	all := []string{Memory, Pids, CPU}
	v2 := Facts{Mode: ModeV2, Controllers: all, Writable: true, Unified: "/sys/fs/cgroup",
		Dirs: map[string]string{Memory: "/sys/fs/cgroup", Pids: "/sys/fs/cgroup", CPU: "/sys/fs/cgroup"}}
	v1 := Facts{Mode: ModeV1, Controllers: all, Writable: true,
		Dirs: map[string]string{Memory: "/sys/fs/cgroup/memory", Pids: "/sys/fs/cgroup/pids", CPU: "/sys/fs/cgroup/cpu"}}
	hybrid := Facts{Mode: ModeHybrid, Controllers: all, Writable: true, Unified: "/sys/fs/cgroup/unified",
		Dirs: map[string]string{Memory: "/sys/fs/cgroup/memory", Pids: "/sys/fs/cgroup/unified", CPU: "/sys/fs/cgroup/cpu"}}
	rootlessV2 := Facts{Mode: ModeV2, Controllers: []string{Memory, Pids}, Writable: true,
		Reason: "cgroup v2: cpu not in /sys/fs/cgroup/user.slice/cgroup.controllers"}
	none := Facts{Mode: ModeNone, Reason: "no cgroup filesystem is mounted"}
	nosocket := v2
	nosocket.NoSocketMemory = socketMemory(v2, "ro quiet cgroup.memory=nosocket")
	v1NotRoot := Facts{Mode: ModeV1, Reason: "cgroup v1: cannot create cgroups in /sys/fs/cgroup/memory, /sys/fs/cgroup/pids: permission denied"}

	full := Limits{MemoryBytes: 512 << 20, Pids: 256, CPUCores: 1.5}
	tests := []struct {
		name string
		f    Facts
		l    Limits
		want []string
	}{
		{"v2", v2, full, []string{
			"memory 512MiB → cgroup v2 memory.max (+ memory.swap.max=0 if swap is accounted)",
			"socket buffers 512MiB → charged to cgroup v2 memory.max with the rest of the sandbox's memory",
			"pids 256 → cgroup v2 pids.max",
			`cpu 1.5 cores → cgroup v2 cpu.max "150000 100000"`,
		}},
		{"v1", v1, full, []string{
			"memory 512MiB → cgroup v1 memory.limit_in_bytes (+ memory.memsw.limit_in_bytes if present, so swap cannot bypass it)",
			"socket buffers 512MiB → cgroup v1 memory.kmem.tcp.limit_in_bytes for TCP, counted apart from memory.limit_in_bytes (so TCP buffers can add as much again); unix socket buffers count in memory.limit_in_bytes",
			"pids 256 → cgroup v1 pids.max",
			"cpu 1.5 cores → cgroup v1 cpu.cfs_quota_us=150000 per cpu.cfs_period_us=100000",
		}},
		{"hybrid mixes versions per controller", hybrid, full, []string{
			"memory 512MiB → cgroup v1 memory.limit_in_bytes (+ memory.memsw.limit_in_bytes if present, so swap cannot bypass it)",
			"socket buffers 512MiB → cgroup v1 memory.kmem.tcp.limit_in_bytes for TCP, counted apart from memory.limit_in_bytes (so TCP buffers can add as much again); unix socket buffers count in memory.limit_in_bytes",
			"pids 256 → cgroup v2 pids.max",
			"cpu 1.5 cores → cgroup v1 cpu.cfs_quota_us=150000 per cpu.cfs_period_us=100000",
		}},
		{"unset limits", v2, Limits{Pids: 64}, []string{
			"memory → not limited",
			"pids 64 → cgroup v2 pids.max",
			"cpu → not limited",
		}},
		{"tiny cpu is rounded up to the kernel minimum", v1, Limits{CPUCores: 0.001}, []string{
			"memory → not limited",
			"pids → not limited",
			"cpu 0.001 cores → cgroup v1 cpu.cfs_quota_us=1000 per cpu.cfs_period_us=100000",
		}},
		{"missing controller", rootlessV2, full, []string{
			"memory 512MiB → cgroup v2 memory.max (+ memory.swap.max=0 if swap is accounted)",
			"socket buffers 512MiB → charged to cgroup v2 memory.max with the rest of the sandbox's memory",
			"pids 256 → cgroup v2 pids.max",
			"cpu 1.5 cores → NOT ENFORCED: no usable cpu controller (cgroup v2: cpu not in /sys/fs/cgroup/user.slice/cgroup.controllers)",
		}},
		{"none", none, Limits{MemoryBytes: 1000}, []string{
			"memory 1000B → NOT ENFORCED: no cgroup filesystem is mounted",
			"socket buffers 1000B → NOT ENFORCED: no memory cgroup (no cgroup filesystem is mounted)",
			"pids → not limited",
			"cpu → not limited",
		}},
		{"v1 not root", v1NotRoot, Limits{Pids: 10, MemoryBytes: 3 << 30}, []string{
			"memory 3GiB → NOT ENFORCED: cgroup v1: cannot create cgroups in /sys/fs/cgroup/memory, /sys/fs/cgroup/pids: permission denied",
			"socket buffers 3GiB → NOT ENFORCED: no memory cgroup (cgroup v1: cannot create cgroups in /sys/fs/cgroup/memory, /sys/fs/cgroup/pids: permission denied)",
			"pids 10 → NOT ENFORCED: cgroup v1: cannot create cgroups in /sys/fs/cgroup/memory, /sys/fs/cgroup/pids: permission denied",
			"cpu → not limited",
		}},
		{"v2 booted with nosocket", nosocket, Limits{MemoryBytes: 64 << 20}, []string{
			"memory 64MiB → cgroup v2 memory.max (+ memory.swap.max=0 if swap is accounted)",
			"socket buffers 64MiB → NOT ENFORCED: the kernel was booted with cgroup.memory=nosocket, so memory.max does not charge socket buffers",
			"pids → not limited",
			"cpu → not limited",
		}},
		{"invalid", v2, Limits{Pids: -1}, []string{
			"limits → INVALID: pids limit -1 is negative",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Plan(tt.f, tt.l)
			if !slices.Equal(got, tt.want) {
				t.Errorf("Plan =\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tt.want, "\n  "))
			}
		})
	}
}

func TestParseMountinfo(t *testing.T) {
	const mi = `30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:28 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct
34 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 30 0:36 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
40 30 0:37 /user.slice /sys/fs/cgroup/uni\040fied rw,relatime - cgroup2 cgroup2 rw,nsdelegate
`
	ms, err := parseMountinfo(strings.NewReader(mi))
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 4 {
		t.Fatalf("got %d cgroup mounts, want 4: %+v", len(ms), ms)
	}
	if ms[0].point != "/sys/fs/cgroup/cpu,cpuacct" || !slices.Contains(ms[0].super, CPU) {
		t.Errorf("cpu mount = %+v", ms[0])
	}
	if ms[3].point != "/sys/fs/cgroup/uni fied" || ms[3].root != "/user.slice" || ms[3].fstype != "cgroup2" {
		t.Errorf("cgroup2 mount = %+v", ms[3])
	}
	v2, err := parseProcCgroupV2(strings.NewReader("4:memory:/a\n0::/user.slice/x.scope\n"))
	if err != nil || v2 != "/user.slice/x.scope" {
		t.Errorf("parseProcCgroupV2 = %q, %v", v2, err)
	}
}

// TestDetectModes uses mount points that do not exist so the probes fail
// without touching the host.
func TestDetectModes(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope")
	v1 := func(c string) mount {
		return mount{root: "/", point: filepath.Join(missing, c), fstype: "cgroup", super: []string{"rw", c}}
	}
	v2 := mount{root: "/", point: missing, fstype: "cgroup2", super: []string{"rw"}}
	tests := []struct {
		name   string
		mounts []mount
		own    string
		euid   int
		mode   Mode
		reason string
	}{
		{"none", nil, "", 0, ModeNone, "no cgroup filesystem"},
		{"v1", []mount{v1(Memory), v1(Pids)}, "", 0, ModeV1, "no cpu controller mounted"},
		{"v2", []mount{v2}, "/", 0, ModeV2, "cannot create cgroups"},
		{"hybrid", []mount{v1(Memory), v1(Pids), v1(CPU), v2}, "/", 0, ModeHybrid, "cgroup v1: cannot create cgroups in " + filepath.Join(missing, Memory) + ", "},
		{"v2 rootless at top", []mount{v2}, "/", 1000, ModeV2, "no delegated parent"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := detect(tt.mounts, tt.own, tt.euid)
			if f.Mode != tt.mode || f.Writable || !strings.Contains(f.Reason, tt.reason) {
				t.Errorf("detect = %+v, want mode %s, not writable, reason containing %q", f, tt.mode, tt.reason)
			}
		})
	}
}

// realFacts skips unless this process can create cgroups with the needed
// controllers.
func realFacts(t *testing.T, need ...string) Facts {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create cgroups")
	}
	f := Detect()
	t.Logf("facts: %+v", f)
	if !f.Writable {
		t.Skipf("cgroups not writable here: %s", f.Reason)
	}
	for _, c := range need {
		if !slices.Contains(f.Controllers, c) {
			t.Skipf("no usable %s controller: %s", c, f.Reason)
		}
	}
	return f
}

func create(t *testing.T, f Facts, l Limits) *Cgroup {
	t.Helper()
	cg, err := Create(f, testID(), l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cg.Kill(); err != nil {
			t.Error(err)
		}
		if err := cg.Delete(); err != nil {
			t.Error(err)
		}
	})
	t.Logf("paths: %v", cg.Paths())
	return cg
}

// startHeld starts cmd blocked on its stdin so it can be moved into the
// cgroup before it does anything; the returned func releases it.
func startHeld(t *testing.T, cmd *exec.Cmd) func() {
	t.Helper()
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return func() {
		_, _ = io.WriteString(in, "go\n")
		_ = in.Close()
	}
}

func readTrim(t *testing.T, dir, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func dirFor(t *testing.T, cg *Cgroup, ctrl string) groupDir {
	t.Helper()
	g, ok := cg.dirOf(ctrl)
	if !ok {
		t.Fatalf("no directory for %s in %v", ctrl, cg.Paths())
	}
	return g
}

func TestOOMKill(t *testing.T) {
	f := realFacts(t, Memory, Pids, CPU)
	cg := create(t, f, Limits{MemoryBytes: 32 << 20, Pids: 16, CPUCores: 0.5})

	mem, pids, cpu := dirFor(t, cg, Memory), dirFor(t, cg, Pids), dirFor(t, cg, CPU)
	if got := readTrim(t, pids.path, "pids.max"); got != "max" {
		t.Errorf("pids.max is %q before LimitPids, want max", got)
	}
	writePidsMax(t, cg, 16)
	checks := map[string]string{}
	if mem.v2 {
		checks[filepath.Join(mem.path, "memory.max")] = "33554432"
	} else {
		checks[filepath.Join(mem.path, "memory.limit_in_bytes")] = "33554432"
		if exists(mem.path, "memory.memsw.limit_in_bytes") {
			checks[filepath.Join(mem.path, "memory.memsw.limit_in_bytes")] = "33554432"
		}
		if f.NoSocketMemory == "" {
			checks[filepath.Join(mem.path, tcpLimitFile)] = "33554432"
		}
	}
	checks[filepath.Join(pids.path, "pids.max")] = "16"
	if cpu.v2 {
		checks[filepath.Join(cpu.path, "cpu.max")] = "50000 100000"
	} else {
		checks[filepath.Join(cpu.path, "cpu.cfs_quota_us")] = "50000"
		checks[filepath.Join(cpu.path, "cpu.cfs_period_us")] = "100000"
	}
	for p, want := range checks {
		if got := readTrim(t, filepath.Dir(p), filepath.Base(p)); got != want {
			t.Errorf("%s = %q, want %q", p, got, want)
		}
	}

	if oom, err := cg.OOMKilled(); err != nil || oom {
		t.Fatalf("OOMKilled before running = %v, %v", oom, err)
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"=alloc")
	var out strings.Builder
	cmd.Stdout = &out
	release := startHeld(t, cmd)
	if err := cg.AddProc(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	release()
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("helper was not killed: err=%v output=%q", err, out.String())
	}
	ws := ee.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("helper ended with %v, want SIGKILL", ws)
	}
	oom, err := cg.OOMKilled()
	if err != nil || !oom {
		t.Fatalf("OOMKilled = %v, %v; want true", oom, err)
	}
}

// writePidsMax sets the limit as the sandbox's init does, through the
// file PidsMaxFile opened, and checks PidsMax reads it back.
func writePidsMax(t *testing.T, cg *Cgroup, n int) {
	t.Helper()
	f, err := cg.PidsMaxFile()
	if err != nil || f == nil {
		t.Fatalf("PidsMaxFile: %v, %v", f, err)
	}
	defer f.Close()
	if _, err := f.WriteString(strconv.Itoa(n)); err != nil {
		t.Fatal(err)
	}
	if got, err := cg.PidsMax(); err != nil || got != strconv.Itoa(n) {
		t.Fatalf("PidsMax = %q, %v; want %d", got, err, n)
	}
}

func TestPidsLimit(t *testing.T) {
	f := realFacts(t, Pids)
	t.Run("default", func(t *testing.T) { testPidsLimit(t, f) })
	if f.Mode == ModeHybrid && f.Unified != "" {
		// Without the controller-less cgroup2 group Kill has to fall back
		// to signalling every pid, which is what pure v1 hosts get.
		nov2 := f
		nov2.Unified = ""
		t.Run("v1 only", func(t *testing.T) { testPidsLimit(t, nov2) })
	}
}

func testPidsLimit(t *testing.T, f Facts) {
	cg := create(t, f, Limits{Pids: 16})
	writePidsMax(t, cg, 16)
	cmd := exec.Command("/bin/sh", "-c", `read x; i=0; while [ $i -lt 40 ]; do sleep 30 </dev/null >/dev/null 2>&1 & i=$((i+1)); done; echo started; wait`)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	release := startHeld(t, cmd)
	if err := cg.AddProc(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	release()
	err := cmd.Wait()
	if err == nil {
		t.Fatalf("shell forked 40 children under pids.max=16 without error")
	}
	t.Logf("shell: %v, stderr %q", err, stderr.String())
	procs, perr := cg.procs()
	if perr != nil {
		t.Fatal(perr)
	}
	if len(procs) == 0 || len(procs) > 16 {
		t.Errorf("%d processes in the cgroup, want 1..16", len(procs))
	}
	g := dirFor(t, cg, Pids)
	kv, kerr := readKV(filepath.Join(g.path, "pids.events"))
	if kerr == nil && kv["max"] == 0 {
		t.Errorf("pids.events max = 0, want fork refusals counted")
	}

	start := time.Now()
	if err := cg.Kill(); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed %d leftover processes in %v", len(procs), time.Since(start))
	paths := cg.Paths()
	if err := cg.Delete(); err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still exists after Delete (stat err %v)", p, err)
		}
	}
}

// TestDetectHost only checks that Detect is self-consistent, so it also runs
// unprivileged.
func TestDetectHost(t *testing.T) {
	f := Detect()
	t.Logf("euid %d facts: %+v", os.Geteuid(), f)
	for _, line := range Plan(f, Limits{MemoryBytes: 512 << 20, Pids: 256, CPUCores: 2}) {
		t.Log(line)
	}
	if !f.Writable && f.Reason == "" {
		t.Error("not writable but no reason given")
	}
	for _, c := range f.Controllers {
		if f.Dirs[c] == "" {
			t.Errorf("controller %s usable but has no directory", c)
		}
	}
}

func TestSweep(t *testing.T) {
	f := realFacts(t, Pids)
	l := Limits{Pids: 8}
	stale, err := Create(f, testID(), l)
	if err != nil {
		t.Fatal(err)
	}
	livecg := create(t, f, l)
	t.Cleanup(func() { _ = stale.Kill(); _ = stale.Delete() })

	cmd := exec.Command("/bin/sh", "-c", "read x; exec sleep 60")
	release := startHeld(t, cmd)
	if err := stale.AddProc(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	release()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	// Only this test's stale id counts as dead, so cgroups of anything else
	// running on the host are never touched.
	removed, err := Sweep(f, func(id string) bool { return id != stale.id })
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []string{stale.id}) {
		t.Fatalf("Sweep removed %v, want [%s]", removed, stale.id)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("process in the stale cgroup was not killed")
	}
	for _, p := range stale.Paths() {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("stale %s still exists", p)
		}
	}
	for _, p := range livecg.Paths() {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("live %s was removed: %v", p, err)
		}
	}
}

func TestCreateNotWritable(t *testing.T) {
	_, err := Create(Facts{Mode: ModeV1, Reason: "no root"}, "x", Limits{Pids: 1})
	if !errors.Is(err, ErrNotWritable) || !strings.Contains(err.Error(), "no root") {
		t.Fatalf("Create = %v, want ErrNotWritable naming the reason", err)
	}
	if _, err := Create(Facts{Writable: true}, "../x", Limits{}); err == nil {
		t.Fatal("Create accepted an id with a slash")
	}
}
