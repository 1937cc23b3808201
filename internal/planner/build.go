// Package planner turns a policy and the facts of one host into a plan.
// Building a plan is a pure function so that `corral policy explain` shows
// precisely what `corral run` applies, and so the whole translation is
// table- and snapshot-tested without root.
package planner

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/corral-sandbox/corral/internal/inference"
	"github.com/corral-sandbox/corral/internal/linux/capture"
	"github.com/corral-sandbox/corral/internal/linux/cgroup"
	"github.com/corral-sandbox/corral/internal/linux/idmap"
	"github.com/corral-sandbox/corral/internal/linux/seccomp"
	"github.com/corral-sandbox/corral/internal/pathwalk"
	"github.com/corral-sandbox/corral/internal/plan"
	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/corral-sandbox/corral/internal/statedir"
)

// Context is what varies per run besides the policy and the host.
type Context struct {
	Workdir  string
	StateDir string
	// AuditLog is where the run's audit trail goes, when that is not
	// inside StateDir.
	AuditLog string
	ID       string
	Session  string
	// Path is the PATH the workload inherits; the plan keeps the entries
	// that exist inside the sandbox.
	Path string
}

// nobody is the identity used when nothing better is known; it owns nothing.
const nobody = 65534

// SandboxGID is the primary group of a workload that idmapped mounts grant
// someone else's files. No host process runs with it, so none passes the
// kernel's check for reaching the workload's processes (/proc/PID/root,
// ptrace), which wants its uid and its gid.
const SandboxGID = 0x7ffd0000

// Build computes the plan. It reads the host only through h, so the same
// inputs always give the same plan.
func Build(p *policy.Policy, c Context, h Host) (*plan.Plan, error) {
	if !filepath.IsAbs(c.Workdir) || filepath.Clean(c.Workdir) != c.Workdir {
		return nil, fmt.Errorf("workdir %q must be an absolute, clean path", c.Workdir)
	}
	if fi, err := h.FS.Lstat(c.Workdir); err != nil {
		return nil, fmt.Errorf("workdir %s: %w", c.Workdir, err)
	} else if fi.Type != TypeDir {
		return nil, fmt.Errorf("workdir %s is not a directory (symlinked workdirs must be given in resolved form)", c.Workdir)
	}
	if p.IncludeWorkdir() && c.Workdir == "/" {
		return nil, errors.New("the workdir is /, which cannot be mounted read-write; run from a project directory or set filesystem_policy.include_workdir: false")
	}
	b := &builder{p: p, c: c, h: h, pl: &plan.Plan{
		Caged:    !p.SandboxDisabled(),
		Workdir:  c.Workdir,
		Hostname: "corral-" + c.ID,
		Defaults: slices.Clone(p.Inherited),
	}}
	steps := []func() error{b.user, b.network, b.mounts, b.isolate, b.path, b.landlock, b.seccomp, b.limits}
	for _, step := range steps {
		if err := step(); err != nil {
			return nil, err
		}
	}
	return b.pl, nil
}

type builder struct {
	p  *policy.Policy
	c  Context
	h  Host
	pl *plan.Plan
	// places caches corralPlaces.
	places []corralPlace
}

func (b *builder) warn(format string, args ...any) {
	b.pl.Warnings = append(b.pl.Warnings, fmt.Sprintf(format, args...))
}

// user picks the workload's identity. It is never root: as root, corral runs
// the workload as the policy's user, else as the workdir's owner, else as
// nobody; without root, as the invoking user inside a user namespace.
func (b *builder) user() error {
	proc := b.p.Process
	u := &b.pl.User
	if b.h.EUID != 0 {
		b.pl.Rootless = true
		u.UID, u.GID, u.Why = b.h.EUID, b.h.EGID, "rootless: the invoking user, in a user namespace"
		if proc.RunAsUser != "" {
			a, err := b.lookupUser(proc.RunAsUser)
			if err != nil || a.UID != b.h.EUID {
				return fmt.Errorf("process.run_as_user %q: only root can run the sandbox as another user — run corral as root or remove run_as_user", proc.RunAsUser)
			}
		}
		if proc.RunAsGroup != "" {
			return fmt.Errorf("process.run_as_group %q: only root can choose the group — run corral as root or remove run_as_group", proc.RunAsGroup)
		}
		b.name(u)
		return nil
	}
	switch {
	case proc.RunAsUser != "":
		a, err := b.lookupUser(proc.RunAsUser)
		if err != nil {
			return fmt.Errorf("process.run_as_user %q: %w", proc.RunAsUser, err)
		}
		u.UID, u.GID, u.Groups, u.Name, u.Home = a.UID, a.GID, a.Groups, a.Name, a.Home
		u.Why = "process.run_as_user"
	default:
		fi, err := b.h.FS.Lstat(b.c.Workdir)
		if err != nil {
			return err
		}
		if fi.UID != 0 {
			u.UID, u.GID, u.Why = fi.UID, fi.GID, "owner of the workdir"
			if a, err := b.h.Users.User(strconv.Itoa(int(fi.UID))); err == nil {
				u.GID, u.Groups, u.Name, u.Home = a.GID, a.Groups, a.Name, a.Home
			}
		} else {
			u.UID, u.GID, u.Why = nobody, nobody, "the workdir is owned by root, so the workload runs as nobody"
		}
	}
	if proc.RunAsGroup != "" {
		gid, err := b.h.Users.Group(proc.RunAsGroup)
		if err != nil {
			n, perr := strconv.ParseUint(proc.RunAsGroup, 10, 32)
			if perr != nil {
				return fmt.Errorf("process.run_as_group %q: %w", proc.RunAsGroup, err)
			}
			gid = uint32(n)
		}
		u.GID, u.Groups = gid, nil
		u.Why += " with process.run_as_group"
	}
	if u.UID == 0 || u.GID == 0 {
		return fmt.Errorf("refusing to run the workload as root (uid %d, gid %d): set process.run_as_user/run_as_group to an unprivileged user", u.UID, u.GID)
	}
	groups := []uint32{u.GID}
	for _, g := range u.Groups {
		if g == 0 {
			b.warn("supplementary group 0 (root) of %s is dropped inside the sandbox", u.Name)
			continue
		}
		groups = append(groups, g)
	}
	slices.Sort(groups)
	u.Groups = slices.Compact(groups)
	b.name(u)
	return nil
}

// isolate gives the workload corral's own primary group when an idmapped
// mount lets it act as another owner. The workload's uid is a host uid
// other processes share (nobody, or the user it runs as), and such a
// process could otherwise enter the sandbox's mounts through
// /proc/<workload pid>/root and there act as that owner too: write a
// root-owned workdir as root, read root's 0600 files in a home entry.
// Files the workload creates through an idmapped mount still land on disk
// owned by the path's owner; elsewhere they get this group. Its old
// primary group stays a supplementary one, so group permissions hold.
func (b *builder) isolate() error {
	u := &b.pl.User
	if b.pl.Rootless || !slices.ContainsFunc(b.pl.Mounts, func(m plan.Mount) bool { return m.IDMap != nil }) {
		return nil
	}
	old := u.GID
	u.GID = SandboxGID
	u.Groups = append(u.Groups, old)
	slices.Sort(u.Groups)
	u.Groups = slices.Compact(u.Groups)
	u.Why += fmt.Sprintf(", in corral's sandbox group %d because idmapped mounts grant it others' files", SandboxGID)
	for i := range b.pl.Mounts {
		if mp := b.pl.Mounts[i].IDMap; mp != nil && mp.GID == old {
			c := *mp
			c.GID = SandboxGID
			b.pl.Mounts[i].IDMap = &c
		}
	}
	return nil
}

// lookupUser accepts a name or a numeric uid; an unknown number is allowed
// (its group is then the same number) because images often lack passwd entries.
func (b *builder) lookupUser(nameOrID string) (Account, error) {
	a, err := b.h.Users.User(nameOrID)
	if err == nil {
		return a, nil
	}
	n, perr := strconv.ParseUint(nameOrID, 10, 32)
	if perr != nil {
		return Account{}, fmt.Errorf("no such user on this host: %w", err)
	}
	return Account{UID: uint32(n), GID: uint32(n)}, nil
}

// name fills the user name and a usable home directory.
func (b *builder) name(u *plan.User) {
	if u.Name == "" || u.Home == "" {
		if a, err := b.h.Users.User(strconv.Itoa(int(u.UID))); err == nil {
			u.Name, u.Home = a.Name, a.Home
		}
	}
	if u.Name == "" {
		u.Name = strconv.Itoa(int(u.UID))
	}
	switch u.Home {
	case "", "/", "/nonexistent", "/dev/null":
		u.Home = "/home/" + u.Name
	}
}

func (b *builder) network() error {
	mode := b.p.NetworkMode()
	ns := []string{"mount", "pid", "ipc", "uts", "cgroup"}
	if b.pl.Rootless {
		ns = append([]string{"user"}, ns...)
	}
	switch mode {
	case policy.ModeAllow:
		b.pl.Network = plan.Network{Mode: mode, Description: "host network, NO egress filtering"}
		b.warn("network.mode is allow: the sandbox uses the host's network with no egress filtering")
	case policy.ModeProxy:
		ns = append(ns, "net")
		cfg := capture.DefaultConfig
		b.pl.Network = plan.Network{
			Mode: mode,
			Description: "private network namespace whose every TCP connection and DNS query is captured by corral's " +
				"listeners and decided per host, port and binary; everything else is dropped",
			Capture: &plan.Capture{Addr: capture.Addr.String(), DNSPort: cfg.DNSPort, TransparentPort: cfg.TransparentPort,
				HTTPProxyPort: cfg.HTTPProxyPort, SOCKSPort: cfg.SOCKSPort, Rules: capture.Rules(cfg)},
		}
	default:
		ns = append(ns, "net")
		b.pl.Network = plan.Network{Mode: mode, Description: "private network namespace with loopback only; inet sockets denied by seccomp"}
	}
	b.pl.Namespaces = ns
	if mode == policy.ModeProxy {
		c, err := b.p.Compile()
		if err != nil {
			return err
		}
		for _, g := range c.Grants {
			for _, t := range g.Targets {
				if t.Protocol != "" && t.TLS != policy.TLSPassthrough && t.TLS != policy.TLSSkip {
					continue
				}
				for _, port := range t.Ports {
					b.pl.Network.Uninspected = append(b.pl.Network.Uninspected, fmt.Sprintf("%s:%d", t.Host.Host, port))
				}
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(b.p.Secrets)) {
		sec := b.p.Secrets[name]
		b.pl.Network.Secrets = append(b.pl.Network.Secrets, plan.Secret{Name: name, Hosts: sec.Hosts, Headers: policy.SecretHeaders(sec)})
	}
	return nil
}

// bind is one policy path on its way to becoming a mount.
type bind struct {
	path     string
	readOnly bool
	why      string
}

func (b *builder) mounts() error {
	fsp := b.p.FilesystemPolicy
	var binds []bind
	for _, p := range fsp.ReadOnly {
		binds = append(binds, bind{p, true, "filesystem_policy.read_only"})
	}
	for _, p := range fsp.ReadWrite {
		binds = append(binds, bind{p, false, "filesystem_policy.read_write"})
	}
	writable := slices.Clone(fsp.ReadWrite)
	// A read_write path named through a symlink (/home -> var/home) is
	// also its target: a link planted there must be refused whichever
	// spelling a later path reaches it by.
	for _, p := range fsp.ReadWrite {
		if real, err := pathwalk.Resolve(walkFS{b.h.FS}, p, nil); err == nil && real != p {
			writable = append(writable, real)
		}
	}
	if b.p.IncludeWorkdir() {
		writable = append(writable, b.c.Workdir)
		if slices.Contains(fsp.ReadOnly, b.c.Workdir) {
			b.warn("the workdir %s is listed in filesystem_policy.read_only, so it stays read-only", b.c.Workdir)
		} else {
			binds = append(binds, bind{b.c.Workdir, false, "workdir"})
		}
	}

	// Each writable tmpfs may hold at most the memory limit, so it is
	// bounded even where no cgroup charges its pages to the sandbox.
	size := b.p.Limits.MemoryBytes()
	mounts := []plan.Mount{
		{Kind: plan.KindProc, Target: "/proc", Why: "fresh procfs for the sandbox's pid namespace, read-only once set-up is done"},
		{Kind: plan.KindDev, Target: "/dev", SizeBytes: size, Why: "minimal devices: null zero full random urandom tty, private pts and shm"},
	}
	targets := map[string]bool{}
	for _, bd := range binds {
		if under(bd.path, []string{"/proc", "/dev"}) {
			b.skip(bd.path, "corral mounts its own /proc and /dev")
			continue
		}
		src, err := resolve(b.h.FS, bd.path, writable)
		if err != nil {
			if bd.why == "workdir" {
				return fmt.Errorf("workdir %s: %w", bd.path, err)
			}
			b.skipUnresolved(bd.path, err)
			continue
		}
		if err := b.keepsCorralOut(bd.path, src, bd.why); err != nil {
			return err
		}
		targets[bd.path] = true
		m := plan.Mount{Kind: plan.KindBind, Source: src, Target: bd.path, ReadOnly: bd.readOnly, Why: bd.why}
		if !bd.readOnly {
			m.IDMap = b.writeAccess(bd.path, src)
		}
		mounts = append(mounts, m)
	}
	mounts = append(mounts, pinParents(mounts, targets)...)
	u := b.pl.User
	if !targets["/tmp"] {
		mounts = append(mounts, plan.Mount{Kind: plan.KindTmpfs, Target: "/tmp", SizeBytes: size, Mode: 0o1777, Why: "private /tmp"})
	}
	if !underAny(u.Home, targets) && !under(u.Home, []string{"/tmp"}) {
		mounts = append(mounts, plan.Mount{Kind: plan.KindTmpfs, Target: u.Home, SizeBytes: size, Mode: 0o700, UID: u.UID, GID: u.GID,
			Why: "private, empty home directory"})
		if err := b.homeEntries(&mounts, writable); err != nil {
			return err
		}
	} else {
		for _, e := range fsp.Home {
			b.skip(filepath.Join(b.h.Home, e), fmt.Sprintf("the sandbox's home %s is not a private home (a policy path or /tmp holds it); filesystem_policy.home fills only a private one", u.Home))
		}
	}
	if st := b.p.State; st != policy.StateNone {
		dir := statedir.Ephemeral(b.c.StateDir, b.c.ID)
		if st == policy.StateScratch {
			dir = statedir.Session(b.c.StateDir, b.c.Session)
		}
		b.pl.State = plan.State{Mode: st, HostDir: dir}
		mounts = append(mounts, plan.Mount{Kind: plan.KindBind, Source: dir, Target: "/scratch", Why: "state: " + st})
	} else {
		b.pl.State = plan.State{Mode: "none"}
	}
	b.etcHosts(&mounts, targets)
	if b.pl.Network.Capture != nil {
		b.resolvConf(&mounts)
		if err := b.caBundle(&mounts, targets); err != nil {
			return err
		}
		b.browserConfig(&mounts, targets)
	}
	if err := b.keyFilesHidden(mounts); err != nil {
		return err
	}
	// Parents before children, so /home/u/proj lands on top of /home/u.
	slices.SortStableFunc(mounts, func(x, y plan.Mount) int {
		if d := depth(x.Target) - depth(y.Target); d != 0 {
			return d
		}
		return strings.Compare(x.Target, y.Target)
	})
	b.pl.Mounts = mounts
	return nil
}

// resolvConf points the sandbox's resolver at the capture address. Queries
// to any other server are captured too, so when the host's file cannot be
// covered (it is a symlink, e.g. to systemd-resolved's stub) nothing breaks.
func (b *builder) resolvConf(mounts *[]plan.Mount) {
	const target = "/etc/resolv.conf"
	if fi, err := b.h.FS.Lstat(target); err == nil && fi.Type == TypeSymlink {
		b.skip(target, "the host's file is a symlink; DNS to any server is captured anyway")
		return
	}
	*mounts = append(*mounts, plan.Mount{Kind: plan.KindBind, Source: statedir.ResolvConf(b.c.StateDir, b.c.ID), Target: target,
		ReadOnly: true, Why: "resolver at the capture address"})
}

// etcHosts covers the host's /etc/hosts, where the sandbox sees it, with a
// copy that also names the sandbox's own hostname: git, Java's
// InetAddress.getLocalHost and Python's getfqdn look their host's name up,
// and without an entry that lookup would fail (or, in proxy mode, go to
// the DNS policy as if it were a host on the internet).
func (b *builder) etcHosts(mounts *[]plan.Mount, targets map[string]bool) {
	const target = "/etc/hosts"
	if targets[target] || !underAny(target, targets) {
		return
	}
	if fi, err := b.h.FS.Lstat(target); err != nil || fi.Type != TypeFile {
		b.skip(target, "the host's file is missing or not a regular file; the sandbox's own hostname does not resolve")
		return
	}
	*mounts = append(*mounts, plan.Mount{Kind: plan.KindBind, Source: statedir.Hosts(b.c.StateDir, b.c.ID), Target: target,
		ReadOnly: true, Why: "the host's entries and the sandbox's hostname"})
}

// caBundle mounts the directory holding the sandbox CA and covers each
// system CA bundle the sandbox can see with the combined one.
func (b *builder) caBundle(mounts *[]plan.Mount, targets map[string]bool) error {
	for t := range targets {
		if under(plan.TLSDir, []string{t}) {
			return fmt.Errorf("filesystem_policy lists %s, which would hold corral's CA directory %s in proxy mode; list narrower paths", t, plan.TLSDir)
		}
	}
	dir := statedir.TLS(b.c.StateDir, b.c.ID)
	*mounts = append(*mounts, plan.Mount{Kind: plan.KindBind, Source: dir, Target: plan.TLSDir, ReadOnly: true,
		Why: "sandbox CA for TLS inspection, alone and with the system roots"})
	for _, sys := range plan.SystemBundles {
		if !underAny(sys, targets) {
			continue
		}
		if fi, err := b.h.FS.Lstat(sys); err != nil || fi.Type != TypeFile {
			continue
		}
		*mounts = append(*mounts, plan.Mount{Kind: plan.KindBind, Source: filepath.Join(dir, "ca-bundle.pem"), Target: sys, ReadOnly: true,
			Why: "system CA bundle replaced by system roots + sandbox CA"})
	}
	return nil
}

// browserConfig covers each browser configuration directory the sandbox
// sees with the copy the supervisor makes, which adds a managed policy
// trusting the sandbox CA. A directory the host lacks cannot be added
// under the read-only /etc; the browser then does not trust the CA.
func (b *builder) browserConfig(mounts *[]plan.Mount, targets map[string]bool) {
	for _, dir := range plan.BrowserConfigDirs {
		if targets[dir] || !underAny(dir, targets) {
			continue
		}
		if fi, err := b.h.FS.Lstat(dir); err != nil || fi.Type != TypeDir {
			continue
		}
		*mounts = append(*mounts, plan.Mount{Kind: plan.KindBind, Source: filepath.Join(statedir.Browser(b.c.StateDir, b.c.ID), dir),
			Target: dir, ReadOnly: true, Why: "the host's browser configuration, plus a managed policy trusting the sandbox CA"})
	}
}

// keyFilesHidden refuses a masked secret's or an inference route key's
// from_file that the sandbox could read: the workload would hold the real
// value, not the surrogate, and corral would be promising otherwise.
func (b *builder) keyFilesHidden(mounts []plan.Mount) error {
	files := map[string]string{} // policy field → from_file
	for name, sec := range b.p.Secrets {
		if sec.FromFile != "" {
			files[fmt.Sprintf("secrets.%s.from_file", name)] = sec.FromFile
		}
	}
	if b.p.Inference != nil {
		maps.Copy(files, routeKeyFiles("inference.routes", b.p.Inference.Routes))
	}
	return checkKeyFiles(b.h.FS, mounts, files)
}

// RouteKeysHidden refuses routes whose api_key.from_file the sandbox pl
// plans could read, as Build does for the policy's own routes: routes
// from elsewhere (--inference-routes, the gateway) take the policy's
// place once the plan is built. origin names them in the error.
func RouteKeysHidden(pl *plan.Plan, h Host, origin string, routes []inference.Route) error {
	return checkKeyFiles(h.FS, pl.Mounts, routeKeyFiles(origin, routes))
}

// routeKeyFiles are the routes' key files by the field that names them.
func routeKeyFiles(origin string, routes []inference.Route) map[string]string {
	files := map[string]string{}
	for i, r := range routes {
		if r.APIKey.FromFile != "" {
			files[fmt.Sprintf("%s[%d].api_key.from_file (route %q)", origin, i, r.Name)] = r.APIKey.FromFile
		}
	}
	return files
}

// checkKeyFiles refuses the first of files (by field) that a bind of
// mounts lets the sandbox read.
func checkKeyFiles(fsys FileSystem, mounts []plan.Mount, files map[string]string) error {
	if len(files) == 0 {
		return nil
	}
	var binds []hostTree
	for _, m := range mounts {
		if m.Kind != plan.KindBind {
			continue
		}
		t := hostTree{Mount: m, src: m.Source}
		// corral's own sources (scratch, the CA directory) are not
		// resolved yet; policy paths are.
		if resolved, err := resolve(fsys, m.Source, nil); err == nil {
			t.src = resolved
		}
		if fi, err := fsys.Lstat(t.src); err == nil {
			t.fi = &fi
		}
		binds = append(binds, t)
	}
	for _, field := range slices.Sorted(maps.Keys(files)) {
		if err := keyFileHidden(fsys, files[field], binds); err != nil {
			return fmt.Errorf("%s %s %w; keep the file outside every path the policy exposes", field, files[field], err)
		}
	}
	return nil
}

// hostTree is a bind mount with its source resolved and, where it could
// be read, its device and inode.
type hostTree struct {
	plan.Mount
	src string
	fi  *FileInfo
}

// keyFileHidden says how the sandbox could read file, or nil. Comparing
// the path as written is not enough: a symlink (/home → /var/home, a link
// into the project) or another bind mount on the host reaches a mounted
// tree by another name, and so does a hard link. A path that cannot be
// resolved (not there yet, or a pipe a password manager hands over as
// /dev/fd/N) keeps the check of its written form: the sandbox cannot
// reach what no path leads to.
func keyFileHidden(fsys FileSystem, file string, binds []hostTree) error {
	resolved, err := resolve(fsys, file, nil)
	if err != nil {
		resolved = file
	}
	for _, t := range binds {
		for _, p := range []string{file, resolved} {
			if under(p, []string{t.Target}) || under(p, []string{t.src}) {
				how := "is"
				if p != file {
					how = "resolves to " + p + ", which is"
				}
				return fmt.Errorf("%s inside %s, which the sandbox mounts (%s): the workload could read the real value", how, t.Target, t.Why)
			}
		}
	}
	fi, err := fsys.Lstat(resolved)
	if err != nil {
		return nil
	}
	// The file, or a directory above it, may be a mounted tree reached
	// by another path: the same device and inode under another name.
	for d := resolved; ; d = filepath.Dir(d) {
		di, err := fsys.Lstat(d)
		if err != nil {
			break
		}
		for _, t := range binds {
			if t.fi != nil && t.fi.Dev == di.Dev && t.fi.Ino == di.Ino {
				return fmt.Errorf("is reached through %s, which has the device and inode of %s (a bind mount or hard link on the host), mounted in the sandbox at %s (%s): the workload could read the real value", d, t.src, t.Target, t.Why)
			}
		}
		if d == "/" {
			break
		}
	}
	// Another name of the file could sit in any mounted tree, and finding
	// it would mean searching them all. A warning would scroll past
	// while the workload reads the value, and a credential is rarely
	// hard-linked on purpose, so the run is refused; a copy is the cure.
	if fi.Type == TypeFile && fi.Nlink > 1 {
		return fmt.Errorf("has %d hard links, and corral cannot tell whether one lies inside a path the sandbox mounts, where the workload could read the real value: give the value a file of its own (cp %s NEW, then name NEW)", fi.Nlink, resolved)
	}
	return nil
}

func (b *builder) skip(path, reason string) {
	b.pl.Skipped = append(b.pl.Skipped, plan.Skipped{Path: path, Reason: reason})
}

// skipUnresolved records a policy path that resolve refused or could not
// find; a refused planted link is also a warning.
func (b *builder) skipUnresolved(path string, err error) {
	var le *linkError
	switch {
	case errors.As(err, &le):
		b.skip(path, le.Error())
		b.warn("%s is not mounted: %s", path, le.Error())
	case errors.Is(err, fs.ErrNotExist):
		b.skip(path, "does not exist on this host")
	default:
		b.skip(path, err.Error())
	}
}

// homeEntries mounts filesystem_policy.home read-only into the private
// home, each at its place relative to the invoking user's home. They are
// resolved like every policy path, so a symlink the sandbox could have
// planted in a writable directory is refused. An entry owned by someone
// other than the workload's user is idmapped onto it where possible, so
// a 0600 ~/.npmrc of root's is readable by the unprivileged workload.
func (b *builder) homeEntries(mounts *[]plan.Mount, writable []string) error {
	u := b.pl.User
	for _, e := range b.p.FilesystemPolicy.Home {
		if b.h.Home == "" {
			b.skip("~/"+e, "the invoking user has no home directory (set HOME)")
			continue
		}
		host := filepath.Join(b.h.Home, e)
		src, err := resolve(b.h.FS, host, writable)
		if err != nil {
			b.skipUnresolved(host, err)
			continue
		}
		if err := b.keepsCorralOut(host, src, "filesystem_policy.home"); err != nil {
			return err
		}
		m := plan.Mount{Kind: plan.KindBind, Source: src, Target: filepath.Join(u.Home, e), ReadOnly: true, Why: "filesystem_policy.home"}
		if fi, err := b.h.FS.Lstat(src); err == nil && fi.UID != u.UID {
			mp := idmap.Mapping{DiskUID: fi.UID, DiskGID: fi.GID, UID: u.UID, GID: u.GID}
			if b.idmapRefusal(src, mp, false) == "" {
				m.IDMap = &mp
			}
		}
		*mounts = append(*mounts, m)
	}
	return nil
}

// keepsCorralOut refuses a policy path that holds corral's state directory
// or audit log, or lies inside them. Through the state directory a
// workload reaches every sandbox's control socket and run directory and
// other sessions' scratch; rootless, it does so with corral's own uid. Even
// read-only it would read other sandboxes' audit trails. corral's own
// mounts from there (/scratch, resolv.conf, the CA bundle) are single
// entries chosen by corral, not policy paths, and are not checked here.
func (b *builder) keepsCorralOut(path, src, why string) error {
	drop := "remove it from the policy"
	if why == "workdir" {
		drop = "run from another directory (--workdir)"
	}
	for _, c := range b.corralPlaces() {
		switch {
		case under(c.path, []string{src}):
			return fmt.Errorf("%s %s holds corral's %s %s, which no sandbox may reach: %s, or %s", why, path, c.what, c.path, drop, c.elsewhere)
		case under(src, []string{c.path}):
			return fmt.Errorf("%s %s lies inside corral's %s %s, which no sandbox may reach: %s", why, path, c.what, c.path, drop)
		}
	}
	return nil
}

// corralPlace is a host path of corral's own that no sandbox may reach.
type corralPlace struct{ what, path, elsewhere string }

// corralPlaces resolves the state directory and the audit log (with its
// rotated generations, which hold the same trail) once per plan.
func (b *builder) corralPlaces() []corralPlace {
	if b.places != nil {
		return b.places
	}
	b.places = []corralPlace{}
	add := func(what, p, elsewhere string) {
		if p == "" {
			return
		}
		if real, err := resolve(b.h.FS, p, nil); err == nil {
			p = real
		}
		b.places = append(b.places, corralPlace{what, p, elsewhere})
	}
	add("state directory", b.c.StateDir, "keep corral's state elsewhere with --state-dir")
	if b.c.AuditLog != "" {
		for _, p := range []string{b.c.AuditLog, b.c.AuditLog + ".1", b.c.AuditLog + ".2"} {
			add("audit log", p, "write the audit log elsewhere with --audit-log")
		}
	}
	return b.places
}

// writeAccess decides how the workload writes a read_write path. Where it
// could not write it otherwise and does not own it, the path is idmapped:
// its owner appears as the workload's user, whose files land on disk owned
// by that owner, so a root-owned workdir is written as root would without
// the workload being root, and git finds the repository owned by whoever
// runs it. A path the workload can write already (a shared 1777
// directory) is left alone: being its owner would also let it delete other
// users' files there. Where no idmap is possible it warns, because the
// EACCES later would be baffling.
func (b *builder) writeAccess(path, src string) *idmap.Mapping {
	fi, err := b.h.FS.Lstat(src)
	if err != nil {
		return nil
	}
	u := b.pl.User
	if canWrite(fi, u) {
		return nil
	}
	if fi.UID != u.UID && !b.pl.Rootless {
		mp := idmap.Mapping{DiskUID: fi.UID, DiskGID: fi.GID, UID: u.UID, GID: u.GID}
		mapped := fi
		mapped.UID, mapped.GID = u.UID, u.GID
		switch why := b.idmapRefusal(src, mp, true); {
		case why != "":
			b.warn("%s is read_write but not writable by uid %d (owner %d:%d, mode %04o) and cannot be idmapped onto it here (%s); set process.run_as_user or fix its ownership",
				path, u.UID, fi.UID, fi.GID, fi.Perm, why)
			return nil
		case canWrite(mapped, u):
			return &mp
		}
	}
	b.warn("%s is read_write but not writable by uid %d (owner %d:%d, mode %04o); set process.run_as_user or fix its ownership",
		path, u.UID, fi.UID, fi.GID, fi.Perm)
	return nil
}

func canWrite(fi FileInfo, u plan.User) bool {
	switch {
	case fi.UID == u.UID:
		return fi.Perm&0o200 != 0
	case slices.Contains(u.Groups, fi.GID) || fi.GID == u.GID:
		return fi.Perm&0o020 != 0
	}
	return fi.Perm&0o002 != 0
}

// idmapRefusal says why src cannot be idmapped with mp here, or "" when it
// can. A writable idmapped mount is refused under seccomp: relaxed, which
// lets io_uring create files with modes seccomp never sees: a set-user-ID
// file the workload made would be owned on the host by the mapped owner,
// root for a root-owned workdir.
func (b *builder) idmapRefusal(src string, mp idmap.Mapping, writable bool) string {
	switch {
	case b.pl.Rootless || b.h.IDMap == nil:
		return "idmapped mounts need corral to run as root"
	case writable && b.p.SeccompProfile() != policy.SeccompDefault:
		return fmt.Sprintf("seccomp: %s would let the workload create set-user-ID files owned by uid %d on the host — use seccomp: default", b.p.SeccompProfile(), mp.DiskUID)
	}
	if err := b.h.IDMap.Probe(src, mp); err != nil {
		return err.Error()
	}
	return ""
}

// path keeps the PATH entries that can exist inside the sandbox. The
// host's PATH names host directories (root's ~/.cargo/bin, a pyenv shim
// directory, /snap/bin) that the sandbox does not have, and a shell would
// search them in vain. Relative entries are kept (they are relative to the
// workdir), and so are entries in writable places: the workload may create
// them (pip install --user makes ~/.local/bin).
func (b *builder) path() error {
	if b.c.Path == "" {
		return nil
	}
	var kept []string
	for _, dir := range filepath.SplitList(b.c.Path) {
		if filepath.IsAbs(dir) && !b.mayExistInside(filepath.Clean(dir)) {
			b.pl.PathDropped = append(b.pl.PathDropped, dir)
			continue
		}
		kept = append(kept, dir)
	}
	b.pl.Path = strings.Join(kept, string(filepath.ListSeparator))
	return nil
}

// mayExistInside reports whether dir exists in the sandbox's tree or can
// be created there. A mountpoint and the directories leading to one exist;
// below the deepest mount covering dir, a writable mount may get it, a
// read-only bind shows its host source, and procfs and /dev hold no
// directories of the host. A symlink on the host counts as existing: where
// it leads inside is not worth guessing.
func (b *builder) mayExistInside(dir string) bool {
	var cover *plan.Mount
	for i := range b.pl.Mounts {
		m := &b.pl.Mounts[i]
		if under(m.Target, []string{dir}) {
			return true
		}
		if under(dir, []string{m.Target}) && (cover == nil || depth(m.Target) > depth(cover.Target)) {
			cover = m
		}
	}
	switch {
	case cover == nil || cover.Kind == plan.KindProc || cover.Kind == plan.KindDev:
		return false
	case cover.Kind == plan.KindTmpfs || !cover.ReadOnly:
		return true
	}
	fi, err := b.h.FS.Lstat(filepath.Join(cover.Source, strings.TrimPrefix(dir, cover.Target)))
	return err == nil && (fi.Type == TypeDir || fi.Type == TypeSymlink)
}

func (b *builder) landlock() error {
	ll := plan.Landlock{Compatibility: policy.LandlockBestEffort, ABI: b.h.LandlockABI, ListOnly: []string{"/"}}
	if b.p.LandlockHard() {
		ll.Compatibility = policy.LandlockHardRequirement
	}
	for _, m := range b.pl.Mounts {
		switch {
		case m.Kind == plan.KindBind && m.ReadOnly:
			ll.ReadOnly = append(ll.ReadOnly, m.Target)
		default:
			ll.ReadWrite = append(ll.ReadWrite, m.Target)
		}
	}
	if ll.ABI == 0 {
		if b.p.LandlockHard() {
			return errors.New("landlock.compatibility is hard_requirement but this kernel has no Landlock (enable CONFIG_SECURITY_LANDLOCK and add landlock to the lsm= boot parameter, or use best_effort)")
		}
		b.warn("Landlock is unavailable on this kernel: the filesystem is confined by the mount namespace only")
	}
	b.pl.Landlock = ll
	return nil
}

func (b *builder) seccomp() error {
	profile := b.p.SeccompProfile()
	rules, err := seccomp.Rules(seccomp.Profile(profile), seccomp.NetMode(b.pl.Network.Mode))
	if err != nil {
		return fmt.Errorf("seccomp profile %s: %w", profile, err)
	}
	s := plan.Seccomp{Profile: profile, NetMode: b.pl.Network.Mode}
	for _, r := range rules {
		s.Rules = append(s.Rules, plan.SeccompRule{Syscalls: r.Syscalls, Action: r.Action, Condition: r.Condition, Reason: r.Reason})
	}
	b.pl.Seccomp = s
	return nil
}

// tunnelIdle closes a proxied connection that carried nothing either way
// for this long, so forgotten connections do not hold the supervisor's
// descriptors for the sandbox's whole life. Long enough for an idle
// interactive session; clients that stay connected longer send keep-alives.
const tunnelIdle = 15 * time.Minute

func (b *builder) limits() error {
	pl := b.p.Limits
	l := plan.Limits{
		MemoryBytes: pl.MemoryBytes(),
		Pids:        int64(pl.PidsMax()),
		CPUCores:    pl.CPUCores(),
		WalltimeMS:  pl.WalltimeDuration().Milliseconds(),
	}
	cl := cgroup.Limits{MemoryBytes: l.MemoryBytes, Pids: l.Pids, CPUCores: l.CPUCores}
	l.Enforcement = cgroup.Plan(b.h.Cgroups, cl)
	l.Enforced = b.h.Cgroups.Writable && (l.MemoryBytes > 0 || l.Pids > 0 || l.CPUCores > 0)
	b.nprocFallback(&l)
	for _, line := range l.Enforcement {
		if strings.Contains(line, cgroup.NotEnforced) {
			l.NotEnforced = append(l.NotEnforced, line)
			b.warn("limit %s", line)
		}
	}
	if l.MemoryBytes > 0 {
		l.Enforcement = append(l.Enforcement, fmt.Sprintf("tmpfs /tmp, home, /dev/shm → size=%s each, with or without cgroups", plan.FormatBytes(l.MemoryBytes)))
	}
	if b.pl.Network.Capture != nil {
		l.Connections = int64(pl.ConnectionsMax())
		l.TunnelIdleMS = tunnelIdle.Milliseconds()
		l.Enforcement = append(l.Enforcement, fmt.Sprintf("connections %d → supervisor: more at once are refused (HTTP 429, SOCKS5 general failure, TCP reset); a tunnel idle for %s is closed", l.Connections, strings.TrimSuffix(tunnelIdle.String(), "0s")))
	}
	if w := pl.WalltimeDuration(); w > 0 {
		l.Enforcement = append(l.Enforcement, fmt.Sprintf("walltime %s → watchdog: SIGTERM, %s grace, SIGKILL, exit 124", w, 5*time.Second))
	}
	b.pl.Limits = l
	return nil
}

// nprocFallback holds the pids limit with RLIMIT_NPROC where no pids
// cgroup can and the sandbox has a user namespace of its own (rootless):
// there the kernel counts the tasks of the sandbox's uid in that namespace
// alone, the init's threads among them as in a pids cgroup, and nothing
// inside may raise the limit (that takes CAP_SYS_RESOURCE in the initial
// namespace). As root the sandbox shares the host's user namespace, where
// the count would be every process of the workload's uid on the host.
func (b *builder) nprocFallback(l *plan.Limits) {
	why := b.h.Cgroups.Unusable(cgroup.Pids)
	if l.Pids <= 0 || why == "" || !b.pl.Rootless || !b.h.NprocPerUserNS {
		return
	}
	l.NprocMax = l.Pids
	prefix := "pids " + strconv.FormatInt(l.Pids, 10) + " → "
	for i, line := range l.Enforcement {
		if strings.HasPrefix(line, prefix) {
			l.Enforcement[i] = prefix + "RLIMIT_NPROC in the sandbox's own user namespace (no pids cgroup: " + why +
				"): forks and threads beyond it, the init's own included, fail with EAGAIN"
		}
	}
}

// pinParents returns, for each read-only bind inside a writable one, a
// bind of every directory between the two onto itself. The kernel
// refuses to rename or remove a mount point, but not a directory above
// one: without these the workload could move a directory holding the
// read-only path away, mount and all, and build its own path in its place,
// which the host and later runs would then find. targets gains the new
// mounts' targets.
func pinParents(mounts []plan.Mount, targets map[string]bool) []plan.Mount {
	var pins []plan.Mount
	for _, ro := range mounts {
		if ro.Kind != plan.KindBind || !ro.ReadOnly {
			continue
		}
		var w *plan.Mount
		for i := range mounts {
			m := &mounts[i]
			if m.Kind == plan.KindBind && !m.ReadOnly && m.Target != ro.Target && under(ro.Target, []string{m.Target}) &&
				(w == nil || len(m.Target) > len(w.Target)) {
				w = m
			}
		}
		if w == nil {
			continue
		}
		for d := filepath.Dir(ro.Target); d != w.Target && under(d, []string{w.Target}); d = filepath.Dir(d) {
			if targets[d] {
				continue
			}
			targets[d] = true
			rel, _ := filepath.Rel(w.Target, d)
			pins = append(pins, plan.Mount{Kind: plan.KindBind, Source: filepath.Join(w.Source, rel), Target: d, IDMap: w.IDMap,
				Why: "holds read-only " + ro.Target + " in place (a mount point cannot be renamed away)"})
		}
	}
	return pins
}

// linkError is a symlink corral refuses to follow.
type linkError struct{ link, target string }

func (e *linkError) Error() string {
	return fmt.Sprintf("path passes through symlink %s -> %s inside a writable directory, which the sandbox could have planted; refusing to follow it", e.link, e.target)
}

// resolve follows path on the host like the kernel would, except that it
// refuses any symlink that sits inside a writable path: the workload could
// have planted it in an earlier run to have a later run mount, say, ~/.ssh.
func resolve(fsys FileSystem, path string, writable []string) (string, error) {
	return pathwalk.Resolve(walkFS{fsys}, path, func(link, target string) error {
		if under(link, writable) {
			return &linkError{link, target}
		}
		return nil
	})
}

// PlantedLink refuses path if reaching it follows a symlink inside one of
// roots: directories a sandbox could write, where it could have planted
// the link.
func PlantedLink(h Host, path string, roots []string) error {
	_, err := resolve(h.FS, path, roots)
	var le *linkError
	if errors.As(err, &le) {
		return err
	}
	return nil
}

type walkFS struct{ FileSystem }

func (w walkFS) IsLink(p string) (bool, error) {
	fi, err := w.Lstat(p)
	return fi.Type == TypeSymlink, err
}

// under reports whether p is one of roots or below one of them.
func under(p string, roots []string) bool {
	for _, r := range roots {
		if p == r || strings.HasPrefix(p, strings.TrimSuffix(r, "/")+"/") {
			return true
		}
	}
	return false
}

func underAny(p string, set map[string]bool) bool {
	for r := range set {
		if under(p, []string{r}) {
			return true
		}
	}
	return false
}

func depth(p string) int {
	if p == "/" {
		return 0
	}
	return strings.Count(p, "/")
}
