package cgroup

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Limits for one sandbox. Zero means no limit.
type Limits struct {
	MemoryBytes int64
	Pids        int64
	CPUCores    float64
}

// cpuPeriodUS is the CFS period. 100ms is the kernel default, so the quota
// reads as "microseconds of CPU per 100ms" in both v1 and v2.
const cpuPeriodUS = 100_000

// minQuotaUS is the smallest quota both cgroup versions accept.
const minQuotaUS = 1000

// NotEnforced starts the explanation of every Plan line whose limit the
// kernel will not enforce, so callers can turn those lines into warnings.
const NotEnforced = "NOT ENFORCED"

// ErrNotWritable is returned by Create when the facts say no sandbox cgroup
// can be made; callers report it as "limits not enforced" and carry on.
var ErrNotWritable = errors.New("cgroup limits not enforced")

// Validate rejects limits the kernel files cannot express.
func (l Limits) Validate() error {
	if l.MemoryBytes < 0 {
		return fmt.Errorf("memory limit %d is negative", l.MemoryBytes)
	}
	if l.Pids < 0 {
		return fmt.Errorf("pids limit %d is negative", l.Pids)
	}
	if l.CPUCores < 0 || math.IsNaN(l.CPUCores) || math.IsInf(l.CPUCores, 0) || l.CPUCores > 1<<20 {
		return fmt.Errorf("cpu limit %v cores is not a usable number", l.CPUCores)
	}
	return nil
}

func (l Limits) needs(c string) bool {
	switch c {
	case Memory:
		return l.MemoryBytes > 0
	case Pids:
		return l.Pids > 0
	case CPU:
		return l.CPUCores > 0
	}
	return false
}

// quotaUS rounds up to the kernel minimum rather than failing, because a
// tiny CPU share is still the closest thing to what was asked.
func quotaUS(cores float64) int64 {
	return max(int64(math.Round(cores*cpuPeriodUS)), minQuotaUS)
}

// isV2 tells whether controller c is driven through cgroup2 files.
func (f Facts) isV2(c string) bool {
	switch f.Mode {
	case ModeV2:
		return true
	case ModeHybrid:
		d, ok := f.Dirs[c]
		return ok && f.Unified != "" && d == f.Unified
	}
	return false
}

// Plan says, one line per limit, how the limit will be enforced on a host
// with these facts. It does no I/O.
func Plan(f Facts, l Limits) []string {
	type item struct {
		ctrl, what string
	}
	items := []item{
		{Memory, "memory " + formatBytes(l.MemoryBytes)},
		{Pids, "pids " + strconv.FormatInt(l.Pids, 10)},
		{CPU, "cpu " + strconv.FormatFloat(l.CPUCores, 'g', -1, 64) + " cores"},
	}
	if err := l.Validate(); err != nil {
		return []string{"limits → INVALID: " + err.Error()}
	}
	out := make([]string, 0, len(items)+1)
	for _, it := range items {
		if !l.needs(it.ctrl) {
			out = append(out, it.ctrl+" → not limited")
			continue
		}
		why := f.Unusable(it.ctrl)
		if why == "" {
			out = append(out, it.what+" → "+howEnforced(f.isV2(it.ctrl), it.ctrl, l))
		} else {
			out = append(out, it.what+" → "+NotEnforced+": "+why)
		}
		if it.ctrl == Memory {
			out = append(out, socketPlan(f, l, why))
		}
	}
	return out
}

// Unusable says why controller c cannot enforce a limit, or "".
func (f Facts) Unusable(c string) string {
	switch {
	case !f.Writable:
		return orDefault(f.Reason, "cgroups are not writable")
	case !slices.Contains(f.Controllers, c):
		why := "no usable " + c + " controller"
		if f.Reason != "" {
			why += " (" + f.Reason + ")"
		}
		return why
	}
	return ""
}

// socketPlan is the line for the memory limit's hold on socket buffers,
// which the kernel fills for a workload that merely stops reading; it gets
// its own line because a host can bound memory and still not them.
func socketPlan(f Facts, l Limits, memWhy string) string {
	what := "socket buffers " + formatBytes(l.MemoryBytes)
	switch {
	case memWhy != "":
		return what + " → " + NotEnforced + ": no memory cgroup (" + memWhy + ")"
	case f.NoSocketMemory != "":
		return what + " → " + NotEnforced + ": " + f.NoSocketMemory
	case f.isV2(Memory):
		return what + " → charged to cgroup v2 memory.max with the rest of the sandbox's memory"
	}
	return what + " → cgroup v1 " + tcpLimitFile + " for TCP, counted apart from memory.limit_in_bytes (so TCP buffers can add as much again); unix socket buffers count in memory.limit_in_bytes"
}

func howEnforced(v2 bool, ctrl string, l Limits) string {
	switch {
	case ctrl == Memory && v2:
		return "cgroup v2 memory.max (+ memory.swap.max=0 if swap is accounted)"
	case ctrl == Memory:
		return "cgroup v1 memory.limit_in_bytes (+ memory.memsw.limit_in_bytes if present, so swap cannot bypass it)"
	case ctrl == Pids && v2:
		return "cgroup v2 pids.max"
	case ctrl == Pids:
		return "cgroup v1 pids.max"
	case ctrl == CPU && v2:
		return fmt.Sprintf("cgroup v2 cpu.max %q", fmt.Sprintf("%d %d", quotaUS(l.CPUCores), cpuPeriodUS))
	default:
		return fmt.Sprintf("cgroup v1 cpu.cfs_quota_us=%d per cpu.cfs_period_us=%d", quotaUS(l.CPUCores), cpuPeriodUS)
	}
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func formatBytes(n int64) string {
	units := []struct {
		size int64
		name string
	}{{1 << 40, "TiB"}, {1 << 30, "GiB"}, {1 << 20, "MiB"}, {1 << 10, "KiB"}}
	for _, u := range units {
		if n >= u.size && n%u.size == 0 {
			return strconv.FormatInt(n/u.size, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}

// Cgroup is one sandbox's group: a directory per hierarchy it lives in.
type Cgroup struct {
	id   string
	dirs []groupDir
}

type groupDir struct {
	path        string
	v2          bool
	controllers []string
}

// Create makes corral/<id> in every hierarchy needed for l, writes the
// memory and CPU limits and returns the handle; the pids limit is the
// caller's to write through PidsMaxFile, once the processes it moves in
// first are running.
// Limits whose controller is not in f.Controllers are skipped; Plan is what
// tells the user so. A hybrid host's controller-less
// cgroup2 group is best effort since it only speeds up Kill. On any error
// everything created is removed again.
func Create(f Facts, id string, l Limits) (*Cgroup, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	if err := l.Validate(); err != nil {
		return nil, err
	}
	if !f.Writable {
		return nil, fmt.Errorf("%w: %s", ErrNotWritable, orDefault(f.Reason, "cgroups are not writable"))
	}

	byBase := map[string]*groupDir{}
	var order []string
	for _, c := range wanted {
		base, ok := f.Dirs[c]
		if !l.needs(c) || !ok || !slices.Contains(f.Controllers, c) {
			continue
		}
		g := byBase[base]
		if g == nil {
			g = &groupDir{path: filepath.Join(base, parentName, id), v2: f.isV2(c)}
			byBase[base] = g
			order = append(order, base)
		}
		g.controllers = append(g.controllers, c)
	}
	optional := ""
	if f.Unified != "" && byBase[f.Unified] == nil {
		byBase[f.Unified] = &groupDir{path: filepath.Join(f.Unified, parentName, id), v2: true}
		order = append(order, f.Unified)
		if f.Mode == ModeHybrid {
			optional = f.Unified
		}
	}

	cg := &Cgroup{id: id}
	for _, base := range order {
		g := byBase[base]
		err := cg.make(*g, l)
		if err != nil && base == optional {
			continue
		}
		if err != nil {
			if derr := cg.Delete(); derr != nil {
				err = errors.Join(err, derr)
			}
			return nil, err
		}
	}
	return cg, nil
}

func validID(id string) error {
	if id == "" || len(id) > 128 || id[0] == '.' {
		return fmt.Errorf("invalid cgroup id %q", id)
	}
	for _, r := range id {
		ok := r == '-' || r == '_' || r == '.' || (r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')
		if !ok {
			return fmt.Errorf("invalid cgroup id %q: only letters, digits, '.', '_' and '-' are allowed", id)
		}
	}
	return nil
}

// make creates one directory and writes its limits. The directory joins
// cg.dirs as soon as it exists so a failed limit write still cleans it up.
func (cg *Cgroup) make(g groupDir, l Limits) error {
	parent := filepath.Dir(g.path)
	base := filepath.Dir(parent)
	if err := os.Mkdir(parent, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create %s: %w", parent, err)
	}
	if g.v2 {
		for _, dir := range []string{base, parent} {
			if err := enableControllers(dir, g.controllers); err != nil {
				return err
			}
		}
	}
	if err := os.Mkdir(g.path, 0o755); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("create %s: already exists (left over from a crashed run? Sweep removes it): %w", g.path, err)
		}
		return fmt.Errorf("create %s: %w", g.path, err)
	}
	cg.dirs = append(cg.dirs, g)
	for _, c := range g.controllers {
		var err error
		switch {
		case c == Memory && g.v2:
			err = writeFile(g.path, "memory.max", strconv.FormatInt(l.MemoryBytes, 10))
			if err == nil && exists(g.path, "memory.swap.max") {
				err = writeFile(g.path, "memory.swap.max", "0")
			}
		case c == Memory:
			err = setMemoryV1(g.path, l.MemoryBytes)
		case c == CPU && g.v2:
			err = writeFile(g.path, "cpu.max", fmt.Sprintf("%d %d", quotaUS(l.CPUCores), cpuPeriodUS))
		case c == CPU:
			err = writeFile(g.path, "cpu.cfs_period_us", strconv.Itoa(cpuPeriodUS))
			if err == nil {
				err = writeFile(g.path, "cpu.cfs_quota_us", strconv.FormatInt(quotaUS(l.CPUCores), 10))
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// tcpLimitFile is cgroup v1's only limit on TCP socket buffers; v1 charges
// them nowhere else, so without it a workload that leaves its own loopback
// connections unread holds any amount of kernel memory.
const tcpLimitFile = "memory.kmem.tcp.limit_in_bytes"

// setMemoryV1 writes the RAM limit before the RAM+swap one because the
// kernel requires memsw >= limit at every step, and a fresh group starts with
// both unlimited.
func setMemoryV1(dir string, limit int64) error {
	v := strconv.FormatInt(limit, 10)
	if err := writeFile(dir, "memory.limit_in_bytes", v); err != nil {
		return err
	}
	if exists(dir, "memory.memsw.limit_in_bytes") {
		if err := writeFile(dir, "memory.memsw.limit_in_bytes", v); err != nil {
			return err
		}
	}
	// Plan promised the TCP limit whenever the file exists, so failing to
	// set it fails the start rather than running without it.
	if exists(dir, tcpLimitFile) {
		if err := setTCPLimit(dir, limit); err != nil {
			return err
		}
	}
	// A group inherits oom_kill_disable from its parent; with it set, a
	// sandbox over its limit would hang instead of being killed.
	kv, err := readKV(filepath.Join(dir, "memory.oom_control"))
	if err == nil && kv["oom_kill_disable"] != 0 {
		return writeFile(dir, "memory.oom_control", "0")
	}
	return nil
}

// setTCPLimit writes the TCP buffer limit and reads it back: the kernel
// rounds it down to whole pages, and a kernel that dropped the feature may
// accept the write and keep the group unlimited.
func setTCPLimit(dir string, limit int64) error {
	if err := writeFile(dir, tcpLimitFile, strconv.FormatInt(limit, 10)); err != nil {
		return fmt.Errorf("limit TCP socket buffers: %w", err)
	}
	got, err := readInt(filepath.Join(dir, tcpLimitFile))
	if err != nil {
		return fmt.Errorf("limit TCP socket buffers: %w", err)
	}
	if got > limit || got < limit-int64(os.Getpagesize()) {
		return fmt.Errorf("limit TCP socket buffers: %s/%s reads %d after writing %d", dir, tcpLimitFile, got, limit)
	}
	return nil
}

func enableControllers(dir string, ctrls []string) error {
	if len(ctrls) == 0 {
		return nil
	}
	have, err := readWords(filepath.Join(dir, "cgroup.subtree_control"))
	if err != nil {
		return err
	}
	// One write per controller so an error names the one that failed.
	for _, c := range ctrls {
		if slices.Contains(have, c) {
			continue
		}
		if err := writeFile(dir, "cgroup.subtree_control", "+"+c); err != nil {
			return err
		}
	}
	return nil
}

// PidsMaxFile opens the group's pids.max, which Create leaves unlimited,
// for writing; nil without a pids controller. The limit counts every
// task in the group, and a Go program in it dies of a thread it cannot
// start, so whoever runs the group's first process writes it when that
// process starts what the limit is for, not before.
func (cg *Cgroup) PidsMaxFile() (*os.File, error) {
	g, ok := cg.dirOf(Pids)
	if !ok {
		return nil, nil
	}
	return os.OpenFile(filepath.Join(g.path, "pids.max"), os.O_WRONLY, 0)
}

// PidsMax reads the group's pids.max ("max" when unlimited); "" without
// a pids controller.
func (cg *Cgroup) PidsMax() (string, error) {
	g, ok := cg.dirOf(Pids)
	if !ok {
		return "", nil
	}
	b, err := os.ReadFile(filepath.Join(g.path, "pids.max"))
	return strings.TrimSpace(string(b)), err
}

// dirOf is the group's directory in controller c's hierarchy.
func (cg *Cgroup) dirOf(c string) (groupDir, bool) {
	for _, g := range cg.dirs {
		if slices.Contains(g.controllers, c) {
			return g, true
		}
	}
	return groupDir{}, false
}

// AddProc moves pid into the group in every hierarchy.
func (cg *Cgroup) AddProc(pid int) error {
	for _, g := range cg.dirs {
		if err := writeFile(g.path, "cgroup.procs", strconv.Itoa(pid)); err != nil {
			return err
		}
	}
	return nil
}

// Unified returns the group's cgroup2 directory, or "" when it has none.
func (cg *Cgroup) Unified() string {
	for _, g := range cg.dirs {
		if g.v2 {
			return g.path
		}
	}
	return ""
}

// Paths returns the group's directories.
func (cg *Cgroup) Paths() []string {
	out := make([]string, len(cg.dirs))
	for i, g := range cg.dirs {
		out[i] = g.path
	}
	return out
}

// OOMKilled reports whether the kernel OOM killer killed a process of the
// group. Without a memory controller there is nothing to count, so false.
func (cg *Cgroup) OOMKilled() (bool, error) {
	g, ok := cg.dirOf(Memory)
	if !ok {
		return false, nil
	}
	if g.v2 {
		kv, err := readKV(filepath.Join(g.path, "memory.events"))
		if err != nil {
			return false, err
		}
		return kv["oom_kill"] > 0, nil
	}
	kv, err := readKV(filepath.Join(g.path, "memory.oom_control"))
	if err != nil {
		return false, err
	}
	if n, ok := kv["oom_kill"]; ok {
		return n > 0, nil
	}
	// Before Linux 4.13 there is no kill counter; having hit the limit
	// while the OOM handler is engaged is the closest evidence.
	fc, err := readInt(filepath.Join(g.path, "memory.failcnt"))
	if err != nil {
		return false, err
	}
	return fc > 0 && kv["under_oom"] > 0, nil
}

// TCPOverLimit reports how many bytes of TCP socket buffers the group holds
// beyond its v1 limit. The kernel charges past the limit on purpose, one
// buffer per socket so every connection makes progress, and thousands of
// sockets turn that into hundreds of MiB; the caller decides when that is
// too much. It is always 0 where socket buffers share memory.max (v2),
// since there the overdraft pushes the group into its OOM killer.
func (cg *Cgroup) TCPOverLimit() (int64, error) {
	g, ok := cg.dirOf(Memory)
	if !ok || g.v2 || !exists(g.path, tcpLimitFile) {
		return 0, nil
	}
	usage, err := readInt(filepath.Join(g.path, "memory.kmem.tcp.usage_in_bytes"))
	if err != nil {
		return 0, err
	}
	limit, err := readInt(filepath.Join(g.path, tcpLimitFile))
	if err != nil {
		return 0, err
	}
	return max(usage-limit, 0), nil
}

const (
	killTimeout   = 5 * time.Second
	deleteTimeout = 2 * time.Second
)

// Kill SIGKILLs every process in the group and waits until none is left.
// cgroup.kill is atomic against forks; the signal loop is for v1 and for
// kernels before 5.14, and is repeated because a process may fork between
// reading cgroup.procs and signalling.
func (cg *Cgroup) Kill() error {
	for _, g := range cg.dirs {
		if !g.v2 {
			continue
		}
		err := writeFile(g.path, "cgroup.kill", "1")
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	self := os.Getpid()
	deadline := time.Now().Add(killTimeout)
	delay := time.Millisecond
	for {
		pids, err := cg.procs()
		if err != nil {
			return err
		}
		pids = slices.DeleteFunc(pids, func(p int) bool { return p == self })
		if len(pids) == 0 {
			return nil
		}
		for _, p := range pids {
			_ = unix.Kill(p, unix.SIGKILL) // ESRCH: already gone
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup corral/%s: %d processes still present after %v (first %d)", cg.id, len(pids), killTimeout, pids[0])
		}
		time.Sleep(delay)
		delay = min(2*delay, 100*time.Millisecond)
	}
}

// procs lists the processes of the group and of any group the sandbox made
// below it.
func (cg *Cgroup) procs() ([]int, error) {
	var out []int
	for _, g := range cg.dirs {
		err := filepath.WalkDir(g.path, func(p string, d os.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, os.ErrNotExist) {
					return nil
				}
				return err
			}
			if !d.IsDir() {
				return nil
			}
			pids, err := readPids(filepath.Join(p, "cgroup.procs"))
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
			for _, pid := range pids {
				if !slices.Contains(out, pid) {
					out = append(out, pid)
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Delete removes the group's directories, children first. rmdir fails with
// EBUSY for a moment after the last process died, hence the retry.
func (cg *Cgroup) Delete() error {
	var errs []error
	var left []groupDir
	for i := len(cg.dirs) - 1; i >= 0; i-- {
		if err := removeTree(cg.dirs[i].path); err != nil {
			errs = append(errs, err)
			left = append(left, cg.dirs[i])
		}
	}
	slices.Reverse(left)
	cg.dirs = left
	return errors.Join(errs...)
}

func removeTree(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() {
			if err := removeTree(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	deadline := time.Now().Add(deleteTimeout)
	for {
		err := unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: %w", dir, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Sweep removes corral/<id> groups whose id is not live, killing what is left
// in them first, and returns the ids it removed. live must say true for every
// sandbox that any supervisor on this host still runs, not only this one's.
func Sweep(f Facts, live func(id string) bool) ([]string, error) {
	var bases []string
	for _, c := range wanted {
		if d, ok := f.Dirs[c]; ok && !slices.Contains(bases, d) {
			bases = append(bases, d)
		}
	}
	if f.Unified != "" && !slices.Contains(bases, f.Unified) {
		bases = append(bases, f.Unified)
	}
	stale := map[string]*Cgroup{}
	var ids []string
	var errs []error
	for _, base := range bases {
		entries, err := os.ReadDir(filepath.Join(base, parentName))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, e := range entries {
			id := e.Name()
			if !e.IsDir() || validID(id) != nil || live(id) {
				continue
			}
			cg := stale[id]
			if cg == nil {
				cg = &Cgroup{id: id}
				stale[id] = cg
				ids = append(ids, id)
			}
			cg.dirs = append(cg.dirs, groupDir{path: filepath.Join(base, parentName, id), v2: base == f.Unified})
		}
	}
	slices.Sort(ids)
	var removed []string
	for _, id := range ids {
		cg := stale[id]
		err := cg.Kill()
		if err == nil {
			err = cg.Delete()
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, id)
	}
	return removed, errors.Join(errs...)
}

func writeFile(dir, name, val string) error {
	p := filepath.Join(dir, name)
	fh, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = fh.WriteString(val)
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %q to %s: %w", val, p, err)
	}
	return nil
}

func exists(dir, name string) bool {
	_, err := os.Stat(filepath.Join(dir, name))
	return err == nil
}

func readKV(path string) (map[string]int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	kv := map[string]int64{}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
			kv[k] = n
		}
	}
	return kv, nil
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

func readPids(path string) ([]int, error) {
	words, err := readWords(path)
	if err != nil {
		return nil, err
	}
	out := make([]int, 0, len(words))
	for _, w := range words {
		if n, err := strconv.Atoi(w); err == nil {
			out = append(out, n)
		}
	}
	return out, nil
}
