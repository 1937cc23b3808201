//go:build linux

package procident

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestScriptArg(t *testing.T) {
	for _, tc := range []struct {
		exe, argv, want string
	}{
		{"/usr/bin/python3.11", "tool.py a b", "tool.py"},
		{"/usr/bin/python3.11", "-u -B tool.py", "tool.py"},
		{"/usr/bin/python3.11", "-uB tool.py", "tool.py"},
		// The values of -W and -X are not scripts.
		{"/usr/bin/python3.11", "-W /usr/bin/pydoc3 evil.py", "evil.py"},
		{"/usr/bin/python3.11", "-Wignore evil.py", "evil.py"},
		{"/usr/bin/python3.11", "-X dev -W /usr/bin/pydoc3 evil.py", "evil.py"},
		{"/usr/bin/python3.11", "-uW /usr/bin/pydoc3 evil.py", "evil.py"},
		{"/usr/bin/python3.11", "--check-hash-based-pycs always evil.py", "evil.py"},
		{"/usr/bin/python3.11", "-- tool.py", "tool.py"},
		// Programs from stdin, a string or a module have no script.
		{"/usr/bin/python3.11", "- /usr/bin/curl", ""},
		{"/usr/bin/python3.11", "-c print(1) /usr/bin/pydoc3", ""},
		{"/usr/bin/python3.11", "-m http.server /usr/bin/pydoc3", ""},
		{"/usr/bin/python3.11", "-Ic x /usr/bin/pydoc3", ""},
		// An option the grammar does not know may take a value.
		{"/usr/bin/python3.11", "-Z /usr/bin/pydoc3", ""},
		{"/usr/bin/python3.11", "--frobnicate /usr/bin/pydoc3", ""},
		{"/usr/bin/node", "/usr/local/bin/claude -p hi", "/usr/local/bin/claude"},
		{"/usr/bin/node", "--no-warnings --max-old-space-size=4096 /usr/local/bin/claude", "/usr/local/bin/claude"},
		// Code loaded besides the script leaves no script to bind.
		{"/usr/bin/node", "-r /usr/local/bin/claude evil.js", ""},
		{"/usr/bin/node", "--require /usr/local/bin/claude evil.js", ""},
		{"/usr/bin/node", "--import=/usr/local/bin/claude evil.js", ""},
		{"/usr/bin/node", "-r /tmp/evil.js /usr/local/bin/claude", ""},
		{"/usr/bin/node", "--inspect /usr/local/bin/claude", ""},
		{"/usr/bin/node", "--env-file=/tmp/e /usr/local/bin/claude", ""},
		{"/usr/bin/node", "--conditions=dev /usr/local/bin/claude", "/usr/local/bin/claude"},
		{"/usr/bin/node", "-e x /usr/local/bin/claude", ""},
		{"/usr/bin/node", "--eval=x /usr/local/bin/claude", ""},
		{"/usr/bin/node", "--some-new-flag /usr/local/bin/claude", ""},
		{"/usr/bin/bash", "-e /usr/local/bin/tool.sh", "/usr/local/bin/tool.sh"},
		{"/usr/bin/bash", "-o pipefail /usr/local/bin/tool.sh", "/usr/local/bin/tool.sh"},
		{"/usr/bin/bash", "-eo /usr/local/bin/tool.sh evil.sh", "evil.sh"},
		{"/usr/bin/bash", "+x --norc tool.sh", "tool.sh"},
		{"/usr/bin/bash", "--rcfile /usr/local/bin/tool.sh evil.sh", "evil.sh"},
		{"/usr/bin/bash", "-c x /usr/local/bin/tool.sh", ""},
		{"/usr/bin/bash", "-s /usr/local/bin/tool.sh", ""},
		{"/usr/bin/dash", "- /usr/local/bin/tool.sh", ""},
		{"/usr/bin/perl", "-w /usr/bin/tool.pl", "/usr/bin/tool.pl"},
		{"/usr/bin/perl", "-I /usr/bin/tool.pl evil.pl", ""},
		{"/usr/bin/perl", "-Mevil /usr/bin/tool.pl", ""},
		{"/usr/bin/perl", "-Ilib -l evil.pl", ""},
		{"/usr/bin/perl", "-le print /usr/bin/tool.pl", ""},
		{"/usr/bin/ruby", "-r /usr/bin/tool.rb evil.rb", ""},
		{"/usr/bin/ruby", "-revil /usr/bin/tool.rb", ""},
		{"/usr/bin/ruby", "-W2 tool.rb", "tool.rb"},
		// Not an interpreter: the loader runs its argument, but what runs
		// is the loader, and argv binds nothing.
		{"/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", "/usr/bin/curl", ""},
		{"/usr/bin/env", "/usr/bin/curl", ""},
		{"/usr/bin/curl", "/usr/local/bin/claude", ""},
	} {
		if got := scriptArg(tc.exe, strings.Fields(tc.argv)); got != tc.want {
			t.Errorf("%s %s: script %q, want %q", tc.exe, tc.argv, got, tc.want)
		}
	}
}

func FuzzScriptArg(f *testing.F) {
	f.Add("/usr/bin/python3", "-W\x00/usr/bin/pydoc3\x00evil.py")
	f.Add("/usr/bin/node", "--require=x\x00--\x00a.js")
	f.Add("/usr/bin/bash", "-eo\x00x\x00-")
	f.Fuzz(func(t *testing.T, exe, argv string) {
		args := strings.Split(argv, "\x00")
		got := scriptArg(exe, args)
		if got == "" {
			return
		}
		// Whatever is named is one of the arguments, and never an option.
		found := false
		for _, a := range args {
			found = found || a == got
		}
		if !found {
			t.Fatalf("script %q is not among %q", got, args)
		}
	})
}

// An interpreter's environment can load code before its script: envLoads
// names what does, and only that (NODE_OPTIONS without a loader is fine).
func TestEnvLoads(t *testing.T) {
	for _, tc := range []struct {
		exe, env, want string
	}{
		{"/usr/bin/python3", "PYTHONPATH=/tmp/w", "its environment sets PYTHONPATH"},
		{"/usr/bin/python3", "PYTHONPATH=", ""},
		{"/usr/bin/python3", "PYTHONUNBUFFERED=1", ""},
		{"/usr/bin/node", "NODE_OPTIONS=--max-old-space-size=4096", ""},
		{"/usr/bin/node", "NODE_OPTIONS=--no-warnings --require /tmp/evil.js", "NODE_OPTIONS holds --require"},
		{"/usr/bin/node", "NODE_OPTIONS=-r/tmp/evil.js", "NODE_OPTIONS holds -r/tmp/evil.js"},
		{"/usr/bin/node", "NODE_OPTIONS=--import=/tmp/evil.mjs", "NODE_OPTIONS holds --import"},
		{"/usr/bin/bash", "BASH_ENV=/tmp/evil.sh", "its environment sets BASH_ENV"},
		{"/usr/bin/bash", "BASH_FUNC_curl%%=() {  python3 -c x; }", "its environment sets BASH_FUNC_curl%%"},
		{"/usr/bin/perl", "PERL5OPT=-Mevil", "its environment sets PERL5OPT"},
		{"/usr/bin/ruby", "RUBYOPT=-revil", "its environment sets RUBYOPT"},
		{"/usr/bin/curl", "PYTHONPATH=/tmp/w", ""},
	} {
		if got := envLoads(grammarOf(tc.exe), []string{tc.env}); got != tc.want {
			t.Errorf("%s with %q: %q, want %q", tc.exe, tc.env, got, tc.want)
		}
	}
}

// python imports usercustomize and .pth files from a user site directory
// in its home, which the sandbox can write; -s, -I and PYTHONNOUSERSITE
// turn that off.
func TestUserSite(t *testing.T) {
	home := t.TempDir()
	root, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(root)
	check := func(env []string, args string, want bool) {
		t.Helper()
		if got := userSite(env, strings.Fields(args), root); got != want {
			t.Errorf("env %q args %q: %v, want %v", env, args, got, want)
		}
	}
	check([]string{"HOME=" + home}, "/usr/bin/pydoc3", false)
	if err := os.MkdirAll(filepath.Join(home, ".local/lib/python3.11/site-packages"), 0o755); err != nil {
		t.Fatal(err)
	}
	check([]string{"HOME=" + home}, "/usr/bin/pydoc3", true)
	check([]string{"HOME=" + home, "PYTHONNOUSERSITE=1"}, "/usr/bin/pydoc3", false)
	check([]string{"HOME=" + home}, "-s /usr/bin/pydoc3", false)
	check([]string{"HOME=" + home}, "-uI /usr/bin/pydoc3", false)
	check([]string{"HOME=" + home}, "-u /usr/bin/pydoc3", true)
}
