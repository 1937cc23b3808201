package e2e

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/linux/idmap"
	"github.com/corral-sandbox/corral/internal/planner"
)

// workdirPolicy has the system directories read-only and brings the
// invoking user's .gitconfig (and a .npmrc that does not exist) into the
// sandbox's home.
const workdirPolicy = `version: 1
filesystem_policy:
  read_only: [/usr, /lib, /lib64, /lib32, /bin, /sbin, /etc, /opt]
  home: [.gitconfig, .npmrc]
network: {mode: block}
`

// ownedWorkdir is a fixture whose workdir belongs, in root mode, to root,
// as a checkout made by root does; corral then runs the workload as nobody
// and must idmap the workdir for it to be writable. Rootless, the workdir
// is the invoking user's as before. It returns the owner's uid and gid.
func ownedWorkdir(t *testing.T, m *mode) (*fixture, int, int) {
	t.Helper()
	fx := newFixture(t, m)
	if m.rootless {
		return fx, m.uid, m.gid
	}
	if err := chownTree(fx.W, 0, 0); err != nil {
		t.Fatal(err)
	}
	requireIDMap(t, fx.W)
	return fx, 0, 0
}

// requireIDMap skips unless dir's filesystem takes the idmapped mount a
// root-owned workdir gets.
func requireIDMap(t *testing.T, dir string) {
	t.Helper()
	mp := idmap.Mapping{DiskUID: 0, DiskGID: 0, UID: nobody, GID: planner.SandboxGID}
	if err := idmap.Probe(dir, mp); err != nil {
		requireFeature(t, "idmapped mounts of the workdir's filesystem: "+err.Error())
	}
}

// testHome is a home directory for corral with a .gitconfig: root's
// (mode 0600, so only an idmapped mount makes it readable to nobody) in
// root mode, the invoking user's rootless.
func testHome(t *testing.T, m *mode, owner, group int) string {
	t.Helper()
	home := newDir(t, m, "home-")
	cfg := filepath.Join(home, ".gitconfig")
	if err := os.WriteFile(cfg, []byte("[user]\n\tname = Corral Test\n\temail = corral@example.com\n[init]\n\tdefaultBranch = main\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := chownTree(home, owner, group); err != nil {
		t.Fatal(err)
	}
	return home
}

// TestRootOwnedWorkdir runs the README's set-up: corral as root in a
// root-owned checkout. The workload (nobody) writes the workdir, commits
// with the user's .gitconfig, and everything it made is root's on the host.
func TestRootOwnedWorkdir(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("git"); err != nil {
		requireFeature(t, "git is not installed")
	}
	forEachMode(t, true, func(t *testing.T, m *mode) {
		fx, owner, group := ownedWorkdir(t, m)
		home := testHome(t, m, owner, group)
		env := []string{"HOME=" + home}
		r := runCorral(t, fx, runOpts{policy: workdirPolicy, env: env, args: []string{"/bin/sh", "-c",
			`set -e; id -u; touch made; mkdir sub; echo data > sub/file
			git init -q; git add -A; git commit -qm first; git log --format='author=%an <%ae>'`}})
		if r.code != 0 || !strings.Contains(r.stdout, "author=Corral Test <corral@example.com>") {
			t.Fatalf("want the workload to write the workdir and commit as the .gitconfig's user\n%s", r)
		}
		if strings.Contains(r.stderr, "not writable by uid") {
			t.Errorf("corral still warns that the workdir is not writable\n%s", r)
		}
		for _, name := range []string{"made", "sub", "sub/file", ".git", ".git/HEAD", ".git/index"} {
			requireOwner(t, filepath.Join(fx.W, name), owner, group)
		}
		requireNoSetID(t, fx.W)

		r = runCorral(t, fx, runOpts{policy: workdirPolicy, env: env, args: []string{"git", "status"}})
		if r.code != 0 || !strings.Contains(r.stdout, "nothing to commit, working tree clean") {
			t.Fatalf("want git status to accept the repository inside (no dubious ownership)\n%s", r)
		}

		if !m.rootless {
			explain := exec.Command(corralBin, "policy", "explain", "--workdir", fx.W, fx.writePolicy(t, workdirPolicy))
			explain.Env = []string{"HOME=" + home, "PATH=/usr/bin:/bin"}
			out, err := explain.CombinedOutput()
			for _, want := range []string{
				fmt.Sprintf("bind  rw %s nosuid,nodev,idmap(0:0 on disk as %d:%d)  (workdir)", fx.W, nobody, planner.SandboxGID),
				fmt.Sprintf("/.gitconfig from %s/.gitconfig nosuid,nodev,idmap(0:0 on disk as %d:%d)  (filesystem_policy.home)", home, nobody, planner.SandboxGID),
				fmt.Sprintf("skipped %s/.npmrc: does not exist on this host", home),
			} {
				if err != nil || !strings.Contains(string(out), want) {
					t.Errorf("explain: want %q (err %v)\n%s", want, err, out)
				}
			}
		}
	})
}

// TestSetIDAttacks tries every way to leave a set-user-ID, set-group-ID or
// file-capability binary in the workdir, which in root mode is an idmapped
// root-owned directory: such a file would be root's on the host, for any
// host user to run. Run outside a sandbox as root, each variant succeeds
// (the positive control).
func TestSetIDAttacks(t *testing.T) {
	t.Parallel()
	// variant → what the refusal must say.
	want := map[string]string{
		"fchmod": "EPERM", "fchmodat": "EPERM", "fchmodat-sgid": "EPERM", "fchmodat-hibits": "EPERM", "fchmodat2": "EPERM",
		"openat": "EPERM", "tmpfile": "EPERM", "mkdirat": "EPERM", "mknodat": "EPERM",
		// The filter cannot read openat2's mode; ENOSYS sends libc to openat.
		"openat2": "ENOSYS",
		"cp-p":    "cp -p",
		// Hard links cannot cross into another mount.
		"link": "EXDEV",
		// Writing file capabilities needs CAP_SETFCAP, which nothing inside has.
		"fcap": "EPERM",
	}
	if runtime.GOARCH == "amd64" {
		for _, v := range []string{"chmod", "open", "creat", "mkdir", "mknod"} {
			want[v] = "EPERM"
		}
	}
	t.Run("control", func(t *testing.T) {
		requireRoot(t)
		dir := t.TempDir()
		for v := range want {
			if v == "mkdir" || v == "mkdirat" {
				continue // the kernel ignores set-id bits in mkdir's mode; refused inside all the same
			}
			out, err := exec.Command(attackBin, "setid", v, dir).CombinedOutput()
			if err != nil || !strings.HasPrefix(string(out), "ESCAPED: "+v+":") {
				t.Errorf("outside the sandbox as root, setid %s should succeed: %v\n%s", v, err, out)
			}
		}
	})
	forEachMode(t, true, func(t *testing.T, m *mode) {
		fx, owner, group := ownedWorkdir(t, m)
		existing := filepath.Join(fx.W, "existing-setuid")
		copyFile(t, attackBin, existing, 0o755)
		sgdir := filepath.Join(fx.W, "setgid-dir")
		if err := os.Mkdir(sgdir, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := chownTree(fx.W, owner, group); err != nil {
			t.Fatal(err)
		}
		for p, mode := range map[string]os.FileMode{existing: 0o755 | os.ModeSetuid, sgdir: 0o777 | os.ModeSetgid} {
			if err := os.Chmod(p, mode); err != nil {
				t.Fatal(err)
			}
		}
		script := "cd " + fx.W + "\n"
		for v := range want {
			script += "./attack setid " + v + " " + fx.W + "\n"
		}
		script += "./attack setid write-existing " + existing + "\n./attack setid inherit " + sgdir + "\n"
		r := runCorral(t, fx, runOpts{policy: systemPolicy(""), args: []string{"/bin/sh", "-c", script}})
		if strings.Contains(r.stdout, "ESCAPED") {
			t.Errorf("a set-id attack succeeded\n%s", r)
		}
		for v, reason := range want {
			if !hasLine(r.stdout, "BLOCKED: "+v+": ", reason) {
				t.Errorf("setid %s: want a refusal with %s\n%s", v, reason, r)
			}
		}
		for _, v := range []string{"write-existing", "inherit"} {
			if !hasLine(r.stdout, "BLOCKED: "+v+": ", "has no set-id bit") {
				t.Errorf("setid %s: want the kernel to leave no set-id bit\n%s", v, r)
			}
		}
		requireNoSetID(t, fx.W)
		err := filepath.WalkDir(fx.W, func(p string, d fs.DirEntry, err error) error {
			if err == nil && strings.HasPrefix(d.Name(), "setid-") {
				requireOwner(t, p, owner, group)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}

func hasLine(out, prefix, contains string) bool {
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, prefix) && strings.Contains(line, contains) {
			return true
		}
	}
	return false
}

func requireOwner(t *testing.T, path string, uid, gid int) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if int(st.Uid) != uid || int(st.Gid) != gid {
		t.Errorf("%s is owned by %d:%d on the host, want the workdir's owner %d:%d", path, st.Uid, st.Gid, uid, gid)
	}
}

// requireNoSetID fails for any set-user-ID or set-group-ID file below dir
// (a set-group-ID directory is only a group default, not a privilege).
func requireNoSetID(t *testing.T, dir string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
			t.Errorf("%s has mode %v on the host", p, fi.Mode())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestRememberedIdmapProbeFailsClosed: corral remembers that the workdir's
// mount takes an idmapping. When that stops holding (a filesystem that
// cannot be idmapped is mounted below the workdir since), the run fails
// with the idmapped mount instead of starting with a workdir the workload
// cannot write or one mounted without the mapping.
func TestRememberedIdmapProbeFailsClosed(t *testing.T) {
	requireRoot(t)
	m := getMode(t, &rootMode)
	fx, _, _ := ownedWorkdir(t, m)
	r := runCorral(t, fx, runOpts{policy: workdirPolicy, args: []string{"/bin/sh", "-c", "touch made"}})
	if r.code != 0 {
		t.Fatalf("first run\n%s", r)
	}
	probes, err := os.ReadDir(filepath.Join(fx.state, "idmap-probes"))
	if err != nil || len(probes) == 0 {
		t.Fatalf("the workdir's successful probe was not remembered: %v", err)
	}
	sub := filepath.Join(fx.W, "proc")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	// procfs refuses idmapped mounts; the workdir's tree now holds it.
	if err := syscall.Mount("proc", sub, "proc", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(sub, syscall.MNT_DETACH) })
	r = runCorral(t, fx, runOpts{policy: workdirPolicy, args: []string{"/bin/sh", "-c", "echo WORKLOAD RAN"}})
	if r.code != 125 || strings.Contains(r.stdout, "WORKLOAD RAN") || !strings.Contains(r.stderr, "idmap") {
		t.Fatalf("want the run to fail at the idmapped mount (exit 125) without running the workload\n%s", r)
	}
}

// TestPlantedSymlinkAsWorkdir: a workload makes a link in its working
// directory to a directory it must never write (here one in aux standing
// for the home); the user later runs from the link (cd pkg && corral
// run). That run must refuse to start rather than mount the link's target
// read-write, and naming the target itself with --workdir still works.
func TestPlantedSymlinkAsWorkdir(t *testing.T) {
	forEachMode(t, true, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		target := filepath.Join(fx.aux, "home")
		if err := os.Mkdir(target, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := chownTree(target, m.uid, m.gid); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(fx.W, "pkg")
		r := runCorral(t, fx, runOpts{args: []string{"/bin/ln", "-s", target, link}})
		if r.code != 0 {
			t.Fatalf("control: the workload could not make a link in its working directory\n%s", r)
		}
		r = runCorral(t, fx, runOpts{args: []string{"/bin/sh", "-c", "echo planted > marker"}, flags: []string{"--workdir", link}})
		if r.code != 125 || !strings.Contains(r.stderr, "an earlier sandbox could write there") {
			t.Errorf("a working directory reached through a planted link: want a refusal to start\n%s", r)
		}
		if _, err := os.Stat(filepath.Join(target, "marker")); err == nil {
			t.Errorf("the workload wrote the link's target")
		}
		r = runCorral(t, fx, runOpts{args: []string{"/bin/true"}, flags: []string{"--workdir", target}})
		if r.code != 0 {
			t.Errorf("the target named itself: want the run to start\n%s", r)
		}
	})
}

// TestNestedReadOnlyCannotBeSwapped: a read_only path inside the writable
// workdir cannot be replaced by renaming a directory above it away and
// building the path again: the host keeps the original for later runs and
// host tools.
func TestNestedReadOnlyCannotBeSwapped(t *testing.T) {
	forEachMode(t, true, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		prot := filepath.Join(fx.W, "ci", "protected")
		if err := os.MkdirAll(prot, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(prot, "deploy.sh"), []byte("trusted\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := chownTree(fx.W, m.uid, m.gid); err != nil {
			t.Fatal(err)
		}
		pol := strings.Replace(systemPolicy(""), "/etc, /opt]", "/etc, /opt, "+prot+"]", 1)
		script := `echo x >> ci/protected/deploy.sh 2>/dev/null && echo DIRECT-WRITE-OK
mv ci ci-old 2>/dev/null && mkdir -p ci/protected && echo evil > ci/protected/deploy.sh && echo SWAPPED
touch ci/new-file && echo ci-writable=ok
cat ci/protected/deploy.sh`
		r := runCorral(t, fx, runOpts{policy: pol, args: []string{"/bin/sh", "-c", script}})
		if strings.Contains(r.stdout, "DIRECT-WRITE-OK") || strings.Contains(r.stdout, "SWAPPED") {
			t.Errorf("the workload changed or swapped the read_only path\n%s", r)
		}
		if !strings.Contains(r.stdout, "ci-writable=ok") {
			t.Errorf("control: the directory holding the read_only path is no longer writable\n%s", r)
		}
		if b, _ := os.ReadFile(filepath.Join(prot, "deploy.sh")); string(b) != "trusted\n" {
			t.Errorf("the host's %s now holds %q\n%s", prot, b, r)
		}
	})
}

// TestHostUserCannotEnterIdmappedWorkdir: the workload in a root-owned
// workdir runs as nobody and, through the idmapped mount, acts as root
// there. A host process of uid nobody must not be able to do the same
// through /proc/<workload pid>/root: the workload's primary group is
// corral's sandbox group, which no host process has, and the kernel wants
// both ids to match before it lets one process into another's root.
func TestHostUserCannotEnterIdmappedWorkdir(t *testing.T) {
	m := getRootMode(t)
	fx := newFixture(t, m)
	wd, err := os.MkdirTemp(baseDir, "rootwd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(wd) })
	if err := os.Chmod(wd, 0o700); err != nil {
		t.Fatal(err)
	}
	requireIDMap(t, wd)
	if err := os.WriteFile(filepath.Join(wd, "root-secret"), []byte("ROOT ONLY\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tag := strconv.FormatInt(time.Now().UnixNano()%100000, 10)
	p := startCorral(t, fx, runOpts{args: []string{"/bin/sh", "-c", "id; echo ready; exec sleep 3" + tag}, flags: []string{"--workdir", wd}})
	p.waitOutput("ready", 30*time.Second)
	var pid int
	for i := 0; i < 100 && pid == 0; i++ {
		if ps := hostProcs("sleep", "3"+tag); len(ps) > 0 {
			pid = ps[0]
		}
		time.Sleep(20 * time.Millisecond)
	}
	if pid == 0 {
		t.Fatal("workload not found on the host")
	}
	dropped := filepath.Join(wd, "dropped-by-host-nobody")
	// root, cwd and environ take the kernel's ptrace check, as ptrace does.
	script := fmt.Sprintf("ls /proc/%[1]d/root/ >/dev/null && echo ENTERED; ls /proc/%[1]d/cwd/ >/dev/null && echo ENTERED-CWD; "+
		"cat /proc/%[1]d/environ >/dev/null && echo READ-ENVIRON; cat /proc/%[1]d/root%[2]s/root-secret; echo hi > /proc/%[1]d/root%[3]s && echo WROTE", pid, wd, dropped)
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody, Groups: []uint32{}}}
	out, _ := cmd.CombinedOutput()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	r := p.wait()
	if !strings.Contains(r.stdout, fmt.Sprintf("uid=%d(nobody) gid=%d", nobody, planner.SandboxGID)) {
		t.Errorf("want the workload to run as nobody in the sandbox group\n%s", r)
	}
	if strings.Contains(string(out), "ENTERED") || strings.Contains(string(out), "READ-ENVIRON") || strings.Contains(string(out), "ROOT ONLY") || strings.Contains(string(out), "WROTE") {
		t.Errorf("host uid 65534 entered the sandbox's root through /proc/%d/root:\n%s", pid, out)
	}
	if _, err := os.Stat(dropped); err == nil {
		t.Errorf("host uid 65534 created %s through /proc/%d/root", dropped, pid)
	}
}
