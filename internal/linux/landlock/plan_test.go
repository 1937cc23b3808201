//go:build linux

package landlock

import (
	"fmt"
	"io/fs"
	"reflect"
	"strings"
	"testing"
)

// fakeFS is a stat function over a fixed set of paths: true = directory.
func fakeFS(entries map[string]bool, errs map[string]error) func(string) (bool, error) {
	return func(path string) (bool, error) {
		if err, ok := errs[path]; ok {
			return false, err
		}
		isDir, ok := entries[path]
		if !ok {
			return false, &fs.PathError{Op: "stat", Path: path, Err: fs.ErrNotExist}
		}
		return isDir, nil
	}
}

func TestPlan(t *testing.T) {
	stat := fakeFS(map[string]bool{
		"/usr": true, "/etc/hosts": false, "/tmp": true, "/work": true, "/dev/null": false,
	}, map[string]error{
		"/root": &fs.PathError{Op: "stat", Path: "/root", Err: fs.ErrPermission},
	})
	cases := []struct {
		name    string
		cfg     Config
		abi     int
		want    Result
		wantErr string
	}{{
		name: "dirs and files",
		cfg:  Config{ReadOnly: []string{"/usr", "/etc/hosts"}, ReadWrite: []string{"/tmp", "/dev/null"}, Compat: HardRequirement},
		abi:  7,
		want: Result{ABI: 7, Rules: []string{"ro /usr", "ro /etc/hosts (file)", "rw /tmp", "rw /dev/null (file)"}},
	}, {
		name: "best effort skips missing",
		cfg:  Config{ReadOnly: []string{"/usr", "/opt/missing"}, ReadWrite: []string{"/tmp"}, Compat: BestEffort},
		abi:  3,
		want: Result{ABI: 3, Rules: []string{"ro /usr", "rw /tmp"},
			Skipped: []Skipped{{Path: "/opt/missing", Reason: "does not exist"}}},
	}, {
		name: "empty compat is best effort",
		cfg:  Config{ReadWrite: []string{"/nope"}},
		abi:  1,
		want: Result{ABI: 1, Skipped: []Skipped{{Path: "/nope", Reason: "does not exist"}}},
	}, {
		name:    "hard requirement names the missing path",
		cfg:     Config{ReadOnly: []string{"/usr"}, ReadWrite: []string{"/opt/missing"}, Compat: HardRequirement},
		abi:     7,
		wantErr: "rw path /opt/missing: does not exist",
	}, {
		name: "best effort skips unreadable with the error",
		cfg:  Config{ReadOnly: []string{"/root"}, Compat: BestEffort},
		abi:  7,
		want: Result{ABI: 7, Skipped: []Skipped{{Path: "/root", Reason: "stat /root: permission denied"}}},
	}, {
		name:    "hard requirement fails on unreadable",
		cfg:     Config{ReadOnly: []string{"/root"}, Compat: HardRequirement},
		abi:     7,
		wantErr: "ro path /root: stat /root: permission denied",
	}, {
		name: "unavailable best effort",
		cfg:  Config{ReadOnly: []string{"/usr"}, Compat: BestEffort},
		abi:  0,
		want: Result{ABI: 0, Skipped: []Skipped{{Reason: "landlock unavailable on this kernel: kernel reports no Landlock ABI"}}},
	}, {
		name:    "unavailable hard requirement",
		cfg:     Config{ReadOnly: []string{"/usr"}, Compat: HardRequirement},
		abi:     0,
		wantErr: "landlock is required by policy (landlock.compatibility: hard_requirement) but unavailable: kernel reports no Landlock ABI",
	}, {
		name: "newer kernel capped to known ABI",
		cfg:  Config{ReadOnly: []string{"/usr"}, Compat: HardRequirement},
		abi:  42,
		want: Result{ABI: maxABI, Rules: []string{"ro /usr"}},
	}, {
		name: "paths cleaned and deduplicated",
		cfg:  Config{ReadOnly: []string{"/usr/", "/usr", "/usr/./"}, ReadWrite: []string{"/work//"}},
		abi:  7,
		want: Result{ABI: 7, Rules: []string{"ro /usr", "rw /work"}},
	}, {
		name:    "relative path",
		cfg:     Config{ReadOnly: []string{"usr"}},
		abi:     7,
		wantErr: `path "usr" is not absolute`,
	}, {
		name:    "relative path even when unavailable",
		cfg:     Config{ReadWrite: []string{"./x"}},
		abi:     0,
		wantErr: "not absolute",
	}, {
		name:    "unknown compatibility",
		cfg:     Config{Compat: "sometimes"},
		abi:     7,
		wantErr: `unknown compatibility "sometimes"`,
	}, {
		name: "nothing listed denies everything",
		cfg:  Config{Compat: HardRequirement},
		abi:  7,
		want: Result{ABI: 7},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := Plan(c.cfg, c.abi, stat)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("got  %#v\nwant %#v", got, c.want)
			}
		})
	}
}

func TestPlanExtraRights(t *testing.T) {
	stat := fakeFS(map[string]bool{"/usr": true, "/work": true, "/dev/tty": false}, nil)
	cfg := Config{ReadOnly: []string{"/usr"}, ReadWrite: []string{"/work", "/dev/tty"}}
	for _, c := range []struct {
		abi                                int
		refer, ioctl, resolveUnix, roExtra bool
	}{
		{abi: 1},
		{abi: 2, refer: true},
		{abi: 4, refer: true},
		{abi: 5, refer: true, ioctl: true},
		{abi: 9, refer: true, ioctl: true, resolveUnix: true},
	} {
		p, err := plan(cfg, c.abi, nil, stat)
		if err != nil {
			t.Fatal(err)
		}
		rules := p.rules(false)
		if len(rules) != 3 {
			t.Fatalf("abi %d: %d rules, want 3 (ro dirs, rw dirs, rw files)", c.abi, len(rules))
		}
		ro, rwDirs, rwFiles := fmt.Sprint(rules[0]), fmt.Sprint(rules[1]), fmt.Sprint(rules[2])
		check := func(what, rule, right string, want bool) {
			if strings.Contains(rule, right) != want {
				t.Errorf("abi %d: %s %q has %s = %v, want %v", c.abi, what, rule, right, !want, want)
			}
		}
		check("rw dirs", rwDirs, "refer", c.refer)
		check("rw files", rwFiles, "refer", false) // REFER is a directory-only right
		check("rw dirs", rwDirs, "ioctl_dev", c.ioctl)
		check("rw files", rwFiles, "ioctl_dev", c.ioctl)
		check("rw dirs", rwDirs, "resolve_unix", c.resolveUnix)
		check("rw files", rwFiles, "resolve_unix", c.resolveUnix)
		for _, right := range []string{"refer", "ioctl_dev", "resolve_unix", "write_file"} {
			check("ro dirs", ro, right, false)
		}
	}
}
