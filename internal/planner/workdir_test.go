package planner

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/internal/linux/idmap"
	"github.com/corral-sandbox/corral/internal/plan"
	"github.com/corral-sandbox/corral/internal/policy"
)

// testPolicy parses src, or returns the built-in default for "".
func testPolicy(t *testing.T, src string) *policy.Policy {
	t.Helper()
	if src == "" {
		return policy.Default()
	}
	p, err := policy.Parse([]byte(src), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func buildPlan(t *testing.T, src, workdir, path string, h Host) *plan.Plan {
	t.Helper()
	pl, err := Build(testPolicy(t, src), Context{Workdir: workdir, StateDir: "/var/lib/corral", ID: "x", Session: "s", Path: path}, h)
	if err != nil {
		t.Fatal(err)
	}
	return pl
}

func planMount(pl *plan.Plan, target string) *plan.Mount {
	for i := range pl.Mounts {
		if pl.Mounts[i].Target == target {
			return &pl.Mounts[i]
		}
	}
	return nil
}

func rootlessHost(h Host) Host {
	h.EUID, h.EGID, h.IDMap = 1000, 1000, nil
	return h
}

// A read_write path the workload cannot write and does not own is
// idmapped onto it where the host can; otherwise the plan warns and says
// why. Paths it can write already, or that an idmap would not make
// writable, are left alone.
func TestIDMapDecision(t *testing.T) {
	const writeWarning = "is read_write but not writable by uid"
	asNobody := &idmap.Mapping{DiskUID: 0, DiskGID: 0, UID: nobody, GID: SandboxGID}
	cases := []struct {
		name, policy, workdir, target string
		host                          func(*Host)
		want                          *idmap.Mapping
		warn                          string // a warning that must be there, "" for none about writing
	}{
		{name: "root-owned workdir", workdir: "/root/w", target: "/root/w", want: asNobody},
		{name: "workdir of its user", workdir: "/home/ada/proj", target: "/home/ada/proj"},
		{name: "root-owned read_write path, run as ada", workdir: "/home/ada/proj", target: "/srv/data",
			policy: "version: 1\nfilesystem_policy: {read_write: [/srv/data]}\nprocess: {run_as_user: ada}\n",
			want:   &idmap.Mapping{DiskUID: 0, DiskGID: 0, UID: 1000, GID: SandboxGID}},
		{name: "shared world-writable directory", workdir: "/home/ada/proj", target: "/srv/shared",
			policy: "version: 1\nfilesystem_policy: {read_write: [/srv/shared]}\n",
			host:   func(h *Host) { h.FS.(fakeFS)["/srv/shared"] = "owner=0:0 mode=0777" }},
		{name: "read-only for its owner too", workdir: "/srv/ro", target: "/srv/ro",
			host: func(h *Host) { h.FS.(fakeFS)["/srv/ro"] = "owner=0:0 mode=0555" },
			warn: "/srv/ro is read_write but not writable by uid 65534 (owner 0:0, mode 0555); set process.run_as_user or fix its ownership"},
		{name: "filesystem without idmap support", workdir: "/root/w", target: "/root/w",
			host: func(h *Host) {
				h.IDMap = fakeIDMapper{"/root/w": errors.New("the filesystem does not support idmapped mounts: invalid argument")}
			},
			warn: "/root/w is read_write but not writable by uid 65534 (owner 0:0, mode 0755) and cannot be idmapped onto it here (the filesystem does not support idmapped mounts: invalid argument); set process.run_as_user or fix its ownership"},
		{name: "seccomp relaxed", workdir: "/root/w", target: "/root/w", policy: "version: 1\nseccomp: relaxed\n",
			warn: "seccomp: relaxed would let the workload create set-user-ID files owned by uid 0 on the host — use seccomp: default"},
		{name: "rootless", workdir: "/home/ada/proj", target: "/srv/data",
			policy: "version: 1\nfilesystem_policy: {read_write: [/srv/data]}\n",
			host:   func(h *Host) { *h = rootlessHost(*h) },
			warn:   "/srv/data is read_write but not writable by uid 1000 (owner 0:0, mode 0755); set process.run_as_user or fix its ownership"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := debianHost()
			if tc.host != nil {
				tc.host(&h)
			}
			pl := buildPlan(t, tc.policy, tc.workdir, "", h)
			m := planMount(pl, tc.target)
			if m == nil {
				t.Fatalf("no mount at %s: %+v", tc.target, pl.Mounts)
			}
			if (m.IDMap == nil) != (tc.want == nil) || (m.IDMap != nil && *m.IDMap != *tc.want) {
				t.Errorf("idmap = %v, want %v", m.IDMap, tc.want)
			}
			var writeWarnings []string
			for _, w := range pl.Warnings {
				if strings.Contains(w, writeWarning) {
					writeWarnings = append(writeWarnings, w)
				}
			}
			switch {
			case tc.warn == "" && len(writeWarnings) > 0:
				t.Errorf("unexpected warnings %q", writeWarnings)
			case tc.warn != "" && (len(writeWarnings) != 1 || !strings.Contains(writeWarnings[0], tc.warn)):
				t.Errorf("warnings %q, want one containing %q", writeWarnings, tc.warn)
			}
		})
	}
}

// TestIdmappedWorkloadGetsSandboxGroup: a workload that idmapped mounts
// make another owner runs with corral's sandbox group as its primary
// group, so no host process sharing its uid can reach its mounts; one
// without idmaps keeps its own.
func TestIdmappedWorkloadGetsSandboxGroup(t *testing.T) {
	cases := []struct {
		name, workdir string
		host          func(*Host)
		gid           uint32
		groups        []uint32
	}{
		{name: "root-owned workdir", workdir: "/root/w", gid: SandboxGID, groups: []uint32{nobody}},
		{name: "workdir of its user", workdir: "/home/ada/proj", gid: 1000, groups: []uint32{27, 1000}},
		{name: "no idmap possible", workdir: "/root/w", gid: nobody, groups: []uint32{nobody},
			host: func(h *Host) { h.IDMap = fakeIDMapper{"/root/w": errors.New("unsupported")} }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := debianHost()
			if tc.host != nil {
				tc.host(&h)
			}
			u := buildPlan(t, "", tc.workdir, "", h).User
			if u.GID != tc.gid || !slices.Equal(u.Groups, tc.groups) {
				t.Errorf("gid %d groups %v, want gid %d groups %v (%s)", u.GID, u.Groups, tc.gid, tc.groups, u.Why)
			}
		})
	}
}

func homeHost() Host {
	h := debianHost()
	fsys := h.FS.(fakeFS)
	fsys["/root/.gitconfig"] = "file owner=0:0 mode=0600"
	fsys["/root/.config"] = "owner=0:0"
	fsys["/root/.config/gh"] = "owner=0:0 mode=0700"
	fsys["/root/.npmrc"] = "->/srv/npmrc"
	fsys["/srv/npmrc"] = "file owner=0:0 mode=0644"
	return h
}

func TestHomeEntries(t *testing.T) {
	const pol = "version: 1\nfilesystem_policy:\n  read_only: [/usr]\n  home: [.gitconfig, .config/gh, .npmrc, .cargo/env]\n"
	t.Run("root", func(t *testing.T) {
		pl := buildPlan(t, pol, "/root/w", "", homeHost())
		asNobody := &idmap.Mapping{DiskUID: 0, DiskGID: 0, UID: nobody, GID: SandboxGID}
		for target, src := range map[string]string{
			"/home/65534/.gitconfig": "/root/.gitconfig",
			"/home/65534/.config/gh": "/root/.config/gh",
			"/home/65534/.npmrc":     "/srv/npmrc", // a link outside every writable path is followed
		} {
			m := planMount(pl, target)
			if m == nil || m.Kind != plan.KindBind || m.Source != src || !m.ReadOnly || m.IDMap == nil || *m.IDMap != *asNobody {
				t.Errorf("%s: got %+v, want a read-only bind of %s idmapped onto nobody", target, m, src)
			}
			if !slices.Contains(pl.Landlock.ReadOnly, target) {
				t.Errorf("%s is not in Landlock's read-only list %v", target, pl.Landlock.ReadOnly)
			}
		}
		if !slices.Contains(pl.Skipped, plan.Skipped{Path: "/root/.cargo/env", Reason: "does not exist on this host"}) {
			t.Errorf("missing entry not listed as skipped: %v", pl.Skipped)
		}
		// The home tmpfs comes first, so the entries land on top of it.
		if home, entry := planMountIndex(pl, "/home/65534"), planMountIndex(pl, "/home/65534/.gitconfig"); home < 0 || entry < home {
			t.Errorf("home tmpfs at %d, entry at %d: the entry must come after", home, entry)
		}
	})
	t.Run("planted link in the workdir", func(t *testing.T) {
		// The workdir is the home itself: a link there could be the
		// sandbox's own doing from an earlier run.
		h := homeHost()
		h.FS.(fakeFS)["/root"] = "owner=0:0 mode=0755"
		pl := buildPlan(t, pol, "/root", "", h)
		if m := planMount(pl, "/home/65534/.npmrc"); m != nil {
			t.Errorf("followed a link inside the writable workdir: %+v", m)
		}
		if !slices.ContainsFunc(pl.Warnings, func(w string) bool {
			return strings.Contains(w, "/root/.npmrc is not mounted: path passes through symlink /root/.npmrc -> /srv/npmrc")
		}) {
			t.Errorf("no warning about the refused link: %q", pl.Warnings)
		}
	})
	t.Run("rootless", func(t *testing.T) {
		h := rootlessHost(debianHost())
		h.Home = "/home/ada"
		h.FS.(fakeFS)["/home/ada/.gitconfig"] = "file owner=1000:1000 mode=0600"
		pl := buildPlan(t, pol, "/home/ada/proj", "", h)
		m := planMount(pl, "/home/ada/.gitconfig")
		if m == nil || m.Source != "/home/ada/.gitconfig" || !m.ReadOnly || m.IDMap != nil {
			t.Errorf("got %+v, want a plain read-only bind of the user's own file", m)
		}
	})
	t.Run("home is not private", func(t *testing.T) {
		pl := buildPlan(t, pol+"process: {run_as_user: ada}\n", "/home/ada", "", homeHost())
		if m := planMount(pl, "/home/ada/.gitconfig"); m != nil {
			t.Errorf("mounted into a home that is the read-write workdir: %+v", m)
		}
		if !slices.ContainsFunc(pl.Skipped, func(s plan.Skipped) bool {
			return s.Path == "/root/.gitconfig" && strings.Contains(s.Reason, "not a private home")
		}) {
			t.Errorf("entries not listed as skipped: %v", pl.Skipped)
		}
	})
}

func planMountIndex(pl *plan.Plan, target string) int {
	return slices.IndexFunc(pl.Mounts, func(m plan.Mount) bool { return m.Target == target })
}

func TestPathFilter(t *testing.T) {
	h := debianHost()
	h.FS.(fakeFS)["/usr/local"] = ""
	h.FS.(fakeFS)["/usr/local/bin"] = ""
	in := []string{
		"/root/.cargo/bin",          // a host home: not mounted
		"/usr/local/bin",            // inside a read-only bind, exists
		"/usr/local/go/bin",         // inside a read-only bind, missing on the host
		"/bin",                      // a mount target
		"/home",                     // leads to the private home
		"/home/65534/.local/bin",    // the private home: the workload may create it
		"/root/w/node_modules/.bin", // the read-write workdir: likewise
		"/proc/self",                // procfs holds no host directory
		"bin",                       // relative: kept
		"",                          // the current directory: kept
	}
	pl := buildPlan(t, "", "/root/w", strings.Join(in, ":"), h)
	wantKept := "/usr/local/bin:/bin:/home:/home/65534/.local/bin:/root/w/node_modules/.bin:bin:"
	wantDropped := []string{"/root/.cargo/bin", "/usr/local/go/bin", "/proc/self"}
	if pl.Path != wantKept || !slices.Equal(pl.PathDropped, wantDropped) {
		t.Errorf("PATH %q, dropped %q\nwant %q, dropped %q", pl.Path, pl.PathDropped, wantKept, wantDropped)
	}
	if pl := buildPlan(t, "", "/root/w", "", h); pl.Path != "" || pl.PathDropped != nil {
		t.Errorf("without an inherited PATH the plan sets none, got %q %q", pl.Path, pl.PathDropped)
	}
}
