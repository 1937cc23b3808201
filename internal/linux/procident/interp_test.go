//go:build linux

package procident

import (
	"strings"
	"testing"
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
		{"/usr/bin/node", "-r /usr/local/bin/claude evil.js", "evil.js"},
		{"/usr/bin/node", "--require /usr/local/bin/claude evil.js", "evil.js"},
		{"/usr/bin/node", "--import=/usr/local/bin/claude evil.js", "evil.js"},
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
		{"/usr/bin/perl", "-I /usr/bin/tool.pl evil.pl", "evil.pl"},
		{"/usr/bin/perl", "-Ilib -l evil.pl", "evil.pl"},
		{"/usr/bin/perl", "-le print /usr/bin/tool.pl", ""},
		{"/usr/bin/ruby", "-r /usr/bin/tool.rb evil.rb", "evil.rb"},
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
