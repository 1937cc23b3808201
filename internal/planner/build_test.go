package planner

import (
	"bytes"
	"encoding/json"
	"flag"
	"hash/fnv"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/internal/linux/cgroup"
	"github.com/corral-sandbox/corral/internal/linux/idmap"
	"github.com/corral-sandbox/corral/internal/plan"
	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/corral-sandbox/corral/internal/statedir"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// fakeFS is a host filesystem described by paths: a trailing "/" marks a
// directory, "->" a symlink. Every path is a file of its own (its inode a
// hash of the path) with one link, unless "ino=N" or "links=N" say
// otherwise.
type fakeFS map[string]string

func (f fakeFS) Lstat(p string) (FileInfo, error) {
	h := fnv.New64a()
	h.Write([]byte(p))
	if p == "/" {
		return FileInfo{Type: TypeDir, Perm: 0o755, Dev: 1, Ino: h.Sum64(), Nlink: 1}, nil
	}
	v, ok := f[p]
	if !ok {
		return FileInfo{}, &fs.PathError{Op: "lstat", Path: p, Err: fs.ErrNotExist}
	}
	fi := FileInfo{Type: TypeDir, Perm: 0o755, Dev: 1, Ino: h.Sum64(), Nlink: 1}
	if t, ok := strings.CutPrefix(v, "->"); ok && t != "" {
		fi.Type = TypeSymlink
	}
	if strings.HasPrefix(v, "file") {
		fi.Type = TypeFile
	}
	// "owner=UID:GID" sets ownership; "mode=0700" the permissions.
	for _, field := range strings.Fields(v) {
		if o, ok := strings.CutPrefix(field, "owner="); ok {
			u, g, _ := strings.Cut(o, ":")
			uid, _ := strconv.Atoi(u)
			gid, _ := strconv.Atoi(g)
			fi.UID, fi.GID = uint32(uid), uint32(gid)
		}
		if m, ok := strings.CutPrefix(field, "mode="); ok {
			n, _ := strconv.ParseUint(m, 8, 32)
			fi.Perm = fs.FileMode(n)
		}
		if n, ok := strings.CutPrefix(field, "ino="); ok {
			fi.Ino, _ = strconv.ParseUint(n, 10, 64)
		}
		if n, ok := strings.CutPrefix(field, "links="); ok {
			fi.Nlink, _ = strconv.ParseUint(n, 10, 64)
		}
	}
	return fi, nil
}

func (f fakeFS) Readlink(p string) (string, error) {
	t, ok := strings.CutPrefix(f[p], "->")
	if !ok {
		return "", &fs.PathError{Op: "readlink", Path: p, Err: fs.ErrInvalid}
	}
	return t, nil
}

type fakeUsers map[string]Account

func (u fakeUsers) User(s string) (Account, error) {
	if a, ok := u[s]; ok {
		return a, nil
	}
	for _, a := range u {
		if strconv.Itoa(int(a.UID)) == s {
			return a, nil
		}
	}
	return Account{}, fs.ErrNotExist
}

func (u fakeUsers) Group(s string) (uint32, error) {
	if s == "dev" {
		return 3000, nil
	}
	return 0, fs.ErrNotExist
}

func debianHost() Host {
	return Host{
		EUID: 0, EGID: 0, LandlockABI: 6,
		Cgroups: cgroup.Facts{Mode: cgroup.ModeHybrid, Controllers: []string{"memory", "pids", "cpu"}, Writable: true,
			Dirs: map[string]string{"memory": "/sys/fs/cgroup/memory", "pids": "/sys/fs/cgroup/pids", "cpu": "/sys/fs/cgroup/cpu"}},
		FS: fakeFS{
			"/usr": "", "/usr/lib": "", "/usr/lib64": "", "/lib": "->usr/lib", "/lib64": "->usr/lib64",
			"/bin": "->usr/bin", "/sbin": "->usr/sbin", "/usr/bin": "", "/usr/sbin": "", "/etc": "", "/opt": "",
			"/etc/ssl/certs/ca-certificates.crt": "file", "/etc/hosts": "file", "/etc/chromium": "",
			"/home": "", "/home/ada": "owner=1000:1000", "/home/ada/proj": "owner=1000:1000",
			"/home/ada/proj/link": "->/home/ada/.ssh", "/home/ada/.ssh": "owner=1000:1000 mode=0700",
			"/srv": "", "/srv/data": "owner=0:0 mode=0755", "/root": "owner=0:0 mode=0700", "/root/w": "owner=0:0",
		},
		Users:          fakeUsers{"ada": {UID: 1000, GID: 1000, Name: "ada", Home: "/home/ada", Groups: []uint32{1000, 27}}},
		Home:           "/root",
		IDMap:          fakeIDMapper{},
		NprocPerUserNS: true,
	}
}

// fakeIDMapper refuses to idmap the paths it lists, with their error.
type fakeIDMapper map[string]error

func (f fakeIDMapper) Probe(path string, _ idmap.Mapping) error { return f[path] }

func TestBuildGolden(t *testing.T) {
	rootless := debianHost()
	rootless.EUID, rootless.EGID = 1000, 1000
	rootless.Cgroups = cgroup.Facts{Mode: cgroup.ModeHybrid, Reason: "cgroup v1: permission denied"}
	noLandlock := debianHost()
	noLandlock.LandlockABI = 0

	cases := []struct {
		name    string
		policy  string
		workdir string
		host    Host
	}{
		{"default-root", "", "/home/ada/proj", debianHost()},
		{"default-rootless", "", "/home/ada/proj", rootless},
		{"root-owned-workdir", "", "/root/w", debianHost()},
		{"no-landlock", "", "/home/ada/proj", noLandlock},
		{"custom", `
version: 1
filesystem_policy:
  read_only: [/usr, /home/ada/proj/link, /does/not/exist, /proc/sys]
  read_write: [/srv/data]
process: {run_as_user: ada, run_as_group: dev}
seccomp: relaxed
state: scratch
limits: {memory: 512MiB, pids: 64, cpu: 0.5, walltime: 90s}
network: {mode: allow}
`, "/home/ada/proj", debianHost()},
		{"proxy", `
version: 1
network: {allow: ["api.github.com:443"]}
`, "/home/ada/proj", debianHost()},
		{"inspect", `
version: 1
filesystem_policy:
  read_only: [/usr, /etc]
network_policies:
  gh:
    endpoints:
      - {host: api.github.com, port: 443, protocol: rest, access: read-only}
secrets:
  GH_TOKEN: {from_env: GITHUB_TOKEN, hosts: [api.github.com]}
`, "/home/ada/proj", debianHost()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := testPolicy(t, tc.policy)
			pl, err := Build(p, Context{Workdir: tc.workdir, StateDir: "/var/lib/corral", ID: "test", Session: "s1"}, tc.host)
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			if err := pl.WriteText(&buf); err != nil {
				t.Fatal(err)
			}
			buf.WriteString("\nsummary: " + pl.Summary("test") + "\n")
			golden(t, filepath.Join("testdata", tc.name+".golden"), buf.Bytes())
			if _, err := json.Marshal(pl); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./internal/planner -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (run go test ./internal/planner -update and review the diff):\n--- got\n%s", path, got)
	}
}

func TestBuildErrors(t *testing.T) {
	// secretFrom is a policy masking T for api.example.com, read from path.
	secretFrom := func(path string) string {
		return "version: 1\nnetwork_policies: {a: {endpoints: [{host: api.example.com, port: 443, protocol: rest, access: full}]}}\nsecrets:\n  T: {from_file: " + path + ", hosts: [api.example.com]}\n"
	}
	cases := []struct {
		name, policy, workdir, want string
		host                        func(*Host)
	}{
		{"workdir missing", "", "/nope", "workdir /nope", nil},
		{"workdir is root", "", "/", "cannot be mounted read-write", nil},
		{"workdir relative", "", "home/ada", "absolute, clean path", nil},
		{"landlock hard but missing", "version: 1\nlandlock: {compatibility: hard_requirement}\n", "/home/ada/proj",
			"hard_requirement", func(h *Host) { h.LandlockABI = 0 }},
		{"rootless other user", "version: 1\nprocess: {run_as_user: \"4242\"}\n", "/home/ada/proj",
			"only root can run the sandbox as another user", func(h *Host) { h.EUID, h.EGID = 1000, 1000 }},
		{"symlinked workdir", "", "/lib", "not a directory", nil},
		{"secret file visible inside", "version: 1\nfilesystem_policy: {read_only: [/srv]}\nnetwork_policies: {a: {endpoints: [{host: api.example.com, port: 443, protocol: rest, access: full}]}}\nsecrets:\n  T: {from_file: /srv/data/token, hosts: [api.example.com]}\n",
			"/home/ada/proj", "the workload could read the real value", nil},
		{"secret file in the workdir", secretFrom("/home/ada/proj/.token"),
			"/home/ada/proj", "inside /home/ada/proj", nil},
		{"secret file through a symlink", secretFrom("/srv/vault/gh"),
			"/home/ada/proj", "secrets.T.from_file /srv/vault/gh resolves to /home/ada/proj/.secrets/gh, which is inside /home/ada/proj, which the sandbox mounts (workdir)",
			func(h *Host) {
				h.FS.(fakeFS)["/srv/vault"] = "->/home/ada/proj/.secrets"
				h.FS.(fakeFS)["/home/ada/proj/.secrets"] = "owner=1000:1000"
				h.FS.(fakeFS)["/home/ada/proj/.secrets/gh"] = "file owner=1000:1000"
			}},
		{"secret file through a host bind mount", secretFrom("/srv/alias/.token"),
			"/home/ada/proj", "is reached through /srv/alias, which has the device and inode of /home/ada/proj",
			func(h *Host) {
				h.FS.(fakeFS)["/srv/alias"] = "owner=1000:1000 ino=77"
				h.FS.(fakeFS)["/srv/alias/.token"] = "file owner=1000:1000"
				h.FS.(fakeFS)["/home/ada/proj"] = "owner=1000:1000 ino=77"
			}},
		{"secret file hard-linked", secretFrom("/srv/token"),
			"/home/ada/proj", "secrets.T.from_file /srv/token has 2 hard links", func(h *Host) { h.FS.(fakeFS)["/srv/token"] = "file links=2" }},
		{"inference key file in the workdir", "version: 1\nnetwork: {mode: proxy}\ninference:\n  routes:\n    - {name: hosted, base_url: https://api.openai.com/v1, protocols: [openai_chat_completions], api_key: {from_file: /home/ada/proj/.key}}\n",
			"/home/ada/proj", `inference.routes[0].api_key.from_file (route "hosted") /home/ada/proj/.key is inside /home/ada/proj, which the sandbox mounts (workdir): the workload could read the real value`, nil},
		{"inference key file through a symlink", "version: 1\nnetwork: {mode: proxy}\ninference:\n  routes:\n    - {name: hosted, base_url: https://api.openai.com/v1, protocols: [openai_chat_completions], api_key: {from_file: /srv/vault/openai}}\n",
			"/home/ada/proj", "resolves to /home/ada/proj/.secrets/openai, which is inside /home/ada/proj",
			func(h *Host) {
				h.FS.(fakeFS)["/srv/vault"] = "->/home/ada/proj/.secrets"
				h.FS.(fakeFS)["/home/ada/proj/.secrets"] = "owner=1000:1000"
				h.FS.(fakeFS)["/home/ada/proj/.secrets/openai"] = "file owner=1000:1000"
			}},
		{"policy path holds the CA directory", "version: 1\nfilesystem_policy: {read_only: [/run]}\nnetwork: {mode: proxy}\n", "/home/ada/proj",
			"would hold corral's CA directory /run/corral", func(h *Host) { h.FS.(fakeFS)["/run"] = "" }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := testPolicy(t, tc.policy)
			h := debianHost()
			if tc.host != nil {
				tc.host(&h)
			}
			_, err := Build(p, Context{Workdir: tc.workdir, StateDir: "/s", ID: "x", Session: "s"}, h)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// A symlink planted inside a writable path must never be followed, even
// when a later policy names the path through it.
func TestResolveRefusesPlantedSymlink(t *testing.T) {
	h := debianHost()
	_, err := resolve(h.FS, "/home/ada/proj/link", []string{"/home/ada/proj"})
	if _, ok := err.(*linkError); !ok {
		t.Fatalf("resolve through planted link: err = %v, want *linkError", err)
	}
	got, err := resolve(h.FS, "/lib", []string{"/home/ada/proj"})
	if err != nil || got != "/usr/lib" {
		t.Fatalf("resolve /lib = %q, %v; want /usr/lib", got, err)
	}
}

// A read_write path named through a symlink (/data -> srv/real) is its
// target too: a link the sandbox planted there is refused when another
// policy path reaches it by the target's spelling.
func TestPlantedLinkUnderAliasedReadWrite(t *testing.T) {
	h := debianHost()
	fs := h.FS.(fakeFS)
	fs["/data"] = "->srv/real"
	fs["/srv/real"], fs["/srv/real/cache"] = "", ""
	fs["/srv/real/cache/tool"] = "->/srv/data"
	pl := buildPlan(t, "version: 1\nfilesystem_policy: {read_write: [/data/cache], read_only: [/srv/real/cache/tool]}\n", "/home/ada/proj", "", h)
	if m := planMount(pl, "/srv/real/cache/tool"); m != nil {
		t.Errorf("followed a link inside a writable path: %+v", m)
	}
	if !slices.ContainsFunc(pl.Warnings, func(w string) bool {
		return strings.Contains(w, "path passes through symlink /srv/real/cache/tool -> /srv/data")
	}) {
		t.Errorf("no warning about the refused link: %q", pl.Warnings)
	}
}

// TestRefusesPathsReachingCorralState: any policy path that holds corral's
// state directory or audit log, or lies inside them, read-only or not,
// fails the plan; naming the policy field and the way out.
func TestRefusesPathsReachingCorralState(t *testing.T) {
	for _, tc := range []struct {
		name, policy, workdir, auditLog, want string
	}{
		{name: "read_write holds it", policy: "filesystem_policy: {read_write: [/srv]}", workdir: "/home/ada/proj",
			want: "filesystem_policy.read_write /srv holds corral's state directory /srv/data/corral"},
		{name: "read_only holds it", policy: "filesystem_policy: {read_only: [/srv]}", workdir: "/home/ada/proj",
			want: "filesystem_policy.read_only /srv holds corral's state directory /srv/data/corral"},
		{name: "inside it", policy: "filesystem_policy: {read_only: [/srv/data/corral/run]}", workdir: "/home/ada/proj",
			want: "lies inside corral's state directory"},
		{name: "workdir holds it", policy: "", workdir: "/srv",
			want: "workdir /srv holds corral's state directory /srv/data/corral, which no sandbox may reach: run from another directory"},
		{name: "through a symlink", policy: "filesystem_policy: {read_only: [/lib]}", workdir: "/home/ada/proj", auditLog: "/usr/lib/audit.log",
			want: "filesystem_policy.read_only /lib holds corral's audit log /usr/lib/audit.log"},
		{name: "home entry", policy: "filesystem_policy: {home: [.ssh]}", workdir: "/home/ada/proj", auditLog: "/root/.ssh/audit.log",
			want: "filesystem_policy.home /root/.ssh holds corral's audit log"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := policy.Parse([]byte("version: 1\n"+tc.policy+"\n"), "t.yaml")
			if err != nil {
				t.Fatal(err)
			}
			h := debianHost()
			h.FS.(fakeFS)["/root/.ssh"] = "owner=0:0 mode=0700"
			h.FS.(fakeFS)["/srv/data/corral"] = "owner=0:0 mode=0700"
			h.FS.(fakeFS)["/srv/data/corral/run"] = "owner=0:0 mode=0700"
			_, err = Build(p, Context{Workdir: tc.workdir, StateDir: "/srv/data/corral", AuditLog: tc.auditLog, ID: "x", Session: "s"}, h)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to say %q", err, tc.want)
			}
		})
	}
}

// TestKeyFilesOutsideMountsAllowed: a key file no mounted tree reaches,
// under its own name or another, starts the sandbox; so does one no path
// leads to (a pipe handed over as /dev/fd/N), which the sandbox cannot
// reach either.
func TestKeyFilesOutsideMountsAllowed(t *testing.T) {
	p := testPolicy(t, "version: 1\nnetwork: {mode: proxy}\nnetwork_policies: {a: {endpoints: [{host: api.example.com, port: 443, protocol: rest, access: full}]}}\n"+
		"secrets:\n  T: {from_file: /srv/keys/gh, hosts: [api.example.com]}\n  P: {from_file: /dev/fd/63, hosts: [api.example.com]}\n"+
		"inference:\n  routes:\n    - {name: hosted, base_url: https://api.openai.com/v1, protocols: [openai_chat_completions], api_key: {from_file: /srv/vault/openai}}\n")
	h := debianHost()
	h.FS.(fakeFS)["/srv/keys"] = "owner=0:0 mode=0700"
	h.FS.(fakeFS)["/srv/keys/gh"] = "file owner=0:0 mode=0600"
	h.FS.(fakeFS)["/srv/vault"] = "->keys"
	h.FS.(fakeFS)["/srv/keys/openai"] = "file owner=0:0 mode=0600"
	if _, err := Build(p, Context{Workdir: "/home/ada/proj", StateDir: "/s", ID: "x", Session: "s"}, h); err != nil {
		t.Fatal(err)
	}
}

// A read-only path inside a writable one has each directory between them
// bound onto itself, so the workload cannot rename one away with the
// read-only mount inside and build its own path in its place.
func TestNestedReadOnlyParentsPinned(t *testing.T) {
	h := debianHost()
	fs := h.FS.(fakeFS)
	fs["/home/ada/proj/ci"], fs["/home/ada/proj/ci/deploy"], fs["/home/ada/proj/ci/deploy/prod"] = "owner=1000:1000", "owner=1000:1000", "owner=1000:1000"
	pl := buildPlan(t, "version: 1\nfilesystem_policy: {read_only: [/usr, /home/ada/proj/ci/deploy/prod]}\n", "/home/ada/proj", "", h)
	work := planMount(pl, "/home/ada/proj")
	for _, d := range []string{"/home/ada/proj/ci", "/home/ada/proj/ci/deploy"} {
		m := planMount(pl, d)
		if m == nil || m.Kind != plan.KindBind || m.ReadOnly || m.Source != d || work == nil || m.IDMap != work.IDMap {
			t.Errorf("%s: %+v; want a writable bind of itself mapped as the workdir (%+v)", d, m, work)
		}
	}
	if m := planMount(pl, "/home/ada/proj/ci/deploy/prod"); m == nil || !m.ReadOnly {
		t.Errorf("the read-only path itself: %+v", m)
	}
	if planMount(pl, "/usr/lib") != nil {
		t.Error("a read-only path outside every writable one got pins")
	}
}

// The sandbox's hostname resolves through its own /etc/hosts wherever the
// sandbox sees /etc; a policy that lists the file itself keeps it as it is.
func TestEtcHosts(t *testing.T) {
	// hostsMount is corral's cover of /etc/hosts, if the plan has one.
	hostsMount := func(pl *plan.Plan) *plan.Mount {
		for i, m := range pl.Mounts {
			if m.Source == statedir.Hosts("/var/lib/corral", "x") {
				if m.Target != "/etc/hosts" || m.Kind != plan.KindBind || !m.ReadOnly {
					t.Errorf("got %+v, want a read-only bind on /etc/hosts", m)
				}
				return &pl.Mounts[i]
			}
		}
		return nil
	}
	const etc = "version: 1\nfilesystem_policy:\n  read_only: [/usr, /etc]\n"
	if hostsMount(buildPlan(t, etc, "/home/ada/proj", "", debianHost())) == nil {
		t.Errorf("/etc is visible but /etc/hosts is not covered")
	}
	if m := hostsMount(buildPlan(t, "version: 1\nfilesystem_policy:\n  read_only: [/usr]\n", "/home/ada/proj", "", debianHost())); m != nil {
		t.Errorf("/etc is not visible, yet /etc/hosts is mounted: %+v", m)
	}
	if m := hostsMount(buildPlan(t, "version: 1\nfilesystem_policy:\n  read_only: [/usr, /etc/hosts]\n", "/home/ada/proj", "", debianHost())); m != nil {
		t.Errorf("the policy lists /etc/hosts itself, yet corral covers it: %+v", m)
	}
	h := debianHost()
	delete(h.FS.(fakeFS), "/etc/hosts")
	pl := buildPlan(t, etc, "/home/ada/proj", "", h)
	if hostsMount(pl) != nil || !slices.ContainsFunc(pl.Skipped, func(s plan.Skipped) bool { return s.Path == "/etc/hosts" }) {
		t.Errorf("the host has no /etc/hosts: want it skipped and said so, got mounts %v skipped %v", pl.Mounts, pl.Skipped)
	}
}

// In proxy mode a browser configuration directory the host has is covered
// by the supervisor's copy (which trusts the sandbox CA); one the host
// lacks, block mode, and a directory the policy lists itself are left be.
func TestBrowserConfig(t *testing.T) {
	browser := func(pl *plan.Plan) []string {
		var out []string
		for _, m := range pl.Mounts {
			if strings.HasPrefix(m.Source, statedir.Browser("/var/lib/corral", "x")+"/") {
				if m.Source != statedir.Browser("/var/lib/corral", "x")+m.Target || !m.ReadOnly || m.Kind != plan.KindBind {
					t.Errorf("got %+v, want a read-only bind of the copy", m)
				}
				out = append(out, m.Target)
			}
		}
		return out
	}
	const proxy = "version: 1\nfilesystem_policy:\n  read_only: [/usr, /etc]\nnetwork:\n  mode: proxy\n"
	if got := browser(buildPlan(t, proxy, "/home/ada/proj", "", debianHost())); !slices.Equal(got, []string{"/etc/chromium"}) {
		t.Errorf("proxy mode: covered %v, want /etc/chromium only (the host has no /etc/opt/chrome)", got)
	}
	if got := browser(buildPlan(t, strings.Replace(proxy, "proxy\n", "block\n", 1), "/home/ada/proj", "", debianHost())); len(got) != 0 {
		t.Errorf("block mode: covered %v, want nothing (there is no CA)", got)
	}
	if got := browser(buildPlan(t, strings.Replace(proxy, "/etc]", "/etc, /etc/chromium]", 1), "/home/ada/proj", "", debianHost())); len(got) != 0 {
		t.Errorf("a policy listing /etc/chromium: covered %v, want it as the policy says", got)
	}
}

// TestPidsByRlimitWhereNoCgroup: rootless without a pids cgroup, the pids
// limit is held by RLIMIT_NPROC in the sandbox's user namespace, where the
// kernel counts per namespace; as root (the host's user namespace) or on a
// kernel that counts host-wide it stays NOT ENFORCED, and with a pids
// cgroup the cgroup holds it.
func TestPidsByRlimitWhereNoCgroup(t *testing.T) {
	p := testPolicy(t, "version: 1\nlimits:\n  pids: 64\n")
	noCgroup := cgroup.Facts{Mode: cgroup.ModeHybrid, Reason: "cgroup v1: permission denied"}
	for _, tc := range []struct {
		name      string
		host      func(*Host)
		wantNproc int64
	}{
		{"rootless", func(h *Host) { h.EUID, h.EGID, h.Cgroups = 1000, 1000, noCgroup }, 64},
		{"rootless, old kernel", func(h *Host) { h.EUID, h.EGID, h.Cgroups, h.NprocPerUserNS = 1000, 1000, noCgroup, false }, 0},
		{"root", func(h *Host) { h.Cgroups = noCgroup }, 0},
		{"rootless with cgroup", func(h *Host) { h.EUID, h.EGID = 1000, 1000 }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := debianHost()
			tc.host(&h)
			pl, err := Build(p, Context{Workdir: "/home/ada/proj", StateDir: "/s", ID: "x", Session: "s"}, h)
			if err != nil {
				t.Fatal(err)
			}
			l := pl.Limits
			if l.NprocMax != tc.wantNproc {
				t.Errorf("nproc_max %d, want %d", l.NprocMax, tc.wantNproc)
			}
			pids := strings.Join(slices.DeleteFunc(slices.Clone(l.Enforcement), func(s string) bool { return !strings.HasPrefix(s, "pids ") }), "")
			unenforced := strings.Contains(strings.Join(l.NotEnforced, "\n"), "pids")
			switch {
			case tc.wantNproc > 0 && (!strings.Contains(pids, "RLIMIT_NPROC") || unenforced):
				t.Errorf("pids line %q, not enforced %q: want RLIMIT_NPROC and pids enforced", pids, l.NotEnforced)
			case tc.wantNproc == 0 && strings.Contains(pids, "RLIMIT_NPROC"):
				t.Errorf("pids line %q names RLIMIT_NPROC", pids)
			case tc.wantNproc == 0 && h.Cgroups.Unusable(cgroup.Pids) != "" && !unenforced:
				t.Errorf("pids missing from not enforced %q", l.NotEnforced)
			}
		})
	}
}

func TestKernelAtLeast(t *testing.T) {
	for release, want := range map[string]bool{
		"5.14.0": true, "5.14": true, "6.1.0-18-amd64": true, "6.18.0": true, "5.15.0-91-generic": true,
		"5.13.19": false, "4.19.0-27-amd64": false, "5.4.0-200-generic": false, "5": false, "": false, "x.y": false,
		"5.14rc1": true, "10.0": true,
	} {
		if got := kernelAtLeast(release, 5, 14); got != want {
			t.Errorf("kernelAtLeast(%q, 5, 14) = %v, want %v", release, got, want)
		}
	}
}
