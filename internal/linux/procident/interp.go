//go:build linux

package procident

import (
	"errors"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The script an interpreter runs binds a policy (`node /usr/local/bin/claude`
// is bound by claude, not by node), so finding it must follow the
// interpreter's own command-line grammar: `python3 -W /usr/bin/pydoc3
// evil.py` runs evil.py, with pydoc3 the value of -W. Only the interpreters
// below have a script slot; for any other program (the dynamic loader
// `ld-linux-x86-64.so.2 /usr/bin/curl` above all) argv names no script. An
// option a grammar does not know might take a value, so it ends the search
// with no script: a policy then binds the interpreter alone, never a file
// the command line merely mentions.

// grammar describes one interpreter family's options.
type grammar struct {
	// noScript are single-letter options after which the program comes
	// from the command line or stdin (-c, -e, -m ...), not a script file.
	noScript string
	// value are single-letter options that take a value: the rest of the
	// cluster, or the next argument when the cluster ends with them.
	value string
	// attached are single-letter options whose optional value can only be
	// attached (perl -l0, ruby -W2): they end the cluster.
	attached string
	// flags are single-letter options without a value.
	flags string
	// plus lets options start with '+' as well (set +o in shells).
	plus bool
	// longFlags and longValue are the long options without and with a
	// separate value; --name=value is always one argument.
	longFlags, longValue []string
	// longNoScript are long options that mean no script runs.
	longNoScript []string
	// anyLongValue accepts every --name=value, for interpreters with too
	// many options to list.
	anyLongValue bool
}

var (
	python = grammar{
		noScript:     "cmhV",
		value:        "WX",
		flags:        "bBdEiIOPqsSuvx?R",
		longValue:    []string{"--check-hash-based-pycs"},
		longNoScript: []string{"--help", "--help-env", "--help-xoptions", "--help-all", "--version"},
	}
	// Options that run code besides the script (a module to preload, a
	// loader, an environment file that may set NODE_OPTIONS, a debugger
	// any process in the sandbox can attach to) leave no script to bind.
	node = grammar{
		noScript: "epivhr",
		value:    "C",
		longFlags: []string{"--no-warnings", "--no-deprecation", "--trace-warnings", "--trace-deprecation",
			"--throw-deprecation", "--pending-deprecation", "--enable-source-maps", "--preserve-symlinks",
			"--preserve-symlinks-main", "--expose-gc", "--abort-on-uncaught-exception",
			"--experimental-vm-modules", "--experimental-strip-types",
			"--experimental-transform-types", "--no-experimental-strip-types", "--experimental-require-module",
			"--no-addons", "--frozen-intrinsics", "--use-openssl-ca", "--use-bundled-ca", "--trace-uncaught",
			"--jitless", "--no-global-search-paths", "--trace-exit", "--trace-sigint", "--zero-fill-buffers",
			"--openssl-legacy-provider", "--report-on-fatalerror", "--report-uncaught-exception", "--watch"},
		longValue: []string{"--conditions", "--input-type", "--title", "--redirect-warnings", "--icu-data-dir",
			"--openssl-config", "--unhandled-rejections", "--max-old-space-size", "--stack-size"},
		longNoScript: append([]string{"--eval", "--print", "--interactive", "--version", "--help", "--test", "--check", "--run"}, nodeLoaders...),
		anyLongValue: true,
	}
	shell = grammar{
		noScript:     "cs",
		value:        "oO",
		flags:        "abefhikmnprtuvxBCEHPTl",
		plus:         true,
		longFlags:    []string{"--login", "--noprofile", "--norc", "--posix", "--verbose", "--restricted", "--noediting", "--debugger"},
		longValue:    []string{"--rcfile", "--init-file"},
		longNoScript: []string{"--help", "--version"},
	}
	// -I, -M and -m (and ruby's -I and -r) load modules besides the
	// script, from where the workload may have put them.
	perl = grammar{
		noScript: "eEvhVIMm",
		attached: "xil0CdDF",
		flags:    "acnpstTuUwWXSg",
	}
	ruby = grammar{
		noScript:     "evhIr",
		value:        "CE",
		attached:     "xiWK0F",
		flags:        "acdlnpsSwy",
		longFlags:    []string{"--verbose", "--jit", "--yjit", "--disable-gems", "--disable-all", "--enable-all"},
		longValue:    []string{"--enable", "--disable", "--encoding", "--external-encoding", "--internal-encoding"},
		longNoScript: []string{"--version", "--help", "--dump"},
	}
)

// nodeLoaders are node's options that run code besides the script, on its
// command line or in NODE_OPTIONS.
var nodeLoaders = []string{"--require", "--import", "--loader", "--experimental-loader", "--env-file",
	"--env-file-if-exists", "--inspect", "--inspect-brk", "--inspect-wait", "--inspect-port"}

// codeVars are, by interpreter, the environment variables that make it
// load code from where they say before its script (a name ending in "_"
// is a prefix): a library path, startup options, a shell's startup file
// or exported functions.
var codeVars = map[*grammar][]string{
	&python: {"PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONSTARTUP"},
	&node:   {"NODE_OPTIONS"},
	&perl:   {"PERL5OPT", "PERL5LIB", "PERLLIB"},
	&ruby:   {"RUBYOPT", "RUBYLIB"},
	&shell:  {"BASH_ENV", "ENV", "BASH_FUNC_"},
}

var pythonName = regexp.MustCompile(`^python[0-9]*(\.[0-9]+)?$`)

// grammarOf picks the grammar for an executable by its file name.
func grammarOf(exe string) *grammar {
	name := path.Base(exe)
	switch {
	case pythonName.MatchString(name):
		return &python
	case name == "node" || name == "nodejs":
		return &node
	case name == "sh" || name == "bash" || name == "dash" || name == "zsh" || name == "ksh" || name == "mksh":
		return &shell
	case name == "perl" || strings.HasPrefix(name, "perl5"):
		return &perl
	case name == "ruby":
		return &ruby
	}
	return nil
}

// scriptArg returns the script that the interpreter exe runs with args
// (argv without argv[0]), or "" when it runs none or the command line
// cannot be read with certainty.
func scriptArg(exe string, args []string) string {
	g := grammarOf(exe)
	if g == nil {
		return ""
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			if i+1 < len(args) {
				return args[i+1]
			}
			return ""
		case a == "" || a == "-" || a == "+":
			return "" // stdin, or nothing a script can be
		case strings.HasPrefix(a, "--"):
			skip, ok := g.long(a)
			if !ok {
				return ""
			}
			i += skip
		case a[0] == '-' || (g.plus && a[0] == '+'):
			skip, ok := g.cluster(a[1:])
			if !ok {
				return ""
			}
			i += skip
		default:
			return a
		}
	}
	return ""
}

// long reads one long option: how many following arguments it consumes,
// and false when no script can be named after it.
func (g *grammar) long(a string) (int, bool) {
	name, _, hasValue := strings.Cut(a, "=")
	switch {
	case slices.Contains(g.longNoScript, name):
		return 0, false
	case slices.Contains(g.longFlags, name) && !hasValue:
		return 0, true
	case slices.Contains(g.longValue, name):
		if hasValue {
			return 0, true
		}
		return 1, true
	case hasValue && g.anyLongValue:
		return 0, true
	}
	return 0, false
}

// cluster reads a cluster of single-letter options (without its '-').
func (g *grammar) cluster(c string) (int, bool) {
	for j := 0; j < len(c); j++ {
		switch ch := c[j]; {
		case strings.IndexByte(g.noScript, ch) >= 0:
			return 0, false
		case strings.IndexByte(g.value, ch) >= 0:
			if j == len(c)-1 {
				return 1, true
			}
			return 0, true
		case strings.IndexByte(g.attached, ch) >= 0:
			// perl -le is -l then -e, perl -i.bak one option: when the
			// rest could be either, assume the worse.
			return 0, !strings.ContainsAny(c[j+1:], g.noScript)
		case strings.IndexByte(g.flags, ch) >= 0:
		default:
			return 0, false
		}
	}
	return 0, true
}

// envLoads reports why env, the environment an interpreter with grammar
// g started with, makes it run code besides its script, or "".
// NODE_OPTIONS counts only when it holds one of nodeLoaders (other options
// change nothing about what runs).
func envLoads(g *grammar, env []string) string {
	for _, kv := range env {
		name, value, _ := strings.Cut(kv, "=")
		for _, v := range codeVars[g] {
			if value == "" || (name != v && !(strings.HasSuffix(v, "_") && strings.HasPrefix(name, v))) {
				continue
			}
			if g != &node {
				return "its environment sets " + name
			}
			for _, opt := range strings.Fields(value) {
				opt, _, _ = strings.Cut(opt, "=")
				if slices.Contains(nodeLoaders, opt) || strings.HasPrefix(opt, "-r") {
					return "NODE_OPTIONS holds " + opt
				}
			}
		}
	}
	return ""
}

// execLoads reports why the interpreter exe, started as pid with args
// (argv without argv[0]) and env, runs code besides its script, or "".
func execLoads(pid int, exe string, args, env []string) (string, error) {
	g := grammarOf(exe)
	if g == nil {
		return "", nil
	}
	if why := envLoads(g, env); why != "" || g != &python {
		return why, nil
	}
	rootfd, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/root", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("procident: root of pid %d: %w", pid, err)
	}
	defer unix.Close(rootfd)
	if userSite(env, args, rootfd) {
		return "a user site directory (~/.local/lib) in its home may run code at start-up", nil
	}
	return "", nil
}

// userSite reports whether python, run with args, may import code from
// a user site directory (~/.local/lib/pythonX.Y/site-packages, where
// usercustomize.py and .pth files run at start-up): the sandbox's home is
// writable, so one there could be the workload's. -s, -I or
// PYTHONNOUSERSITE turn it off; a ~/.local/lib that is not there holds
// none. rootfd is pid's root directory.
func userSite(env, args []string, rootfd int) bool {
	for _, a := range args {
		if !strings.HasPrefix(a, "-") || strings.HasPrefix(a, "--") {
			break
		}
		if strings.ContainsAny(a[1:], "sI") {
			return false
		}
	}
	home := ""
	for _, kv := range env {
		name, value, _ := strings.Cut(kv, "=")
		switch name {
		case "PYTHONNOUSERSITE":
			if value != "" {
				return false
			}
		case "HOME":
			home = value
		}
	}
	if !path.IsAbs(home) {
		return false // python finds no user site without a home
	}
	fd, err := unix.Openat2(rootfd, path.Join(home, ".local/lib"), &unix.OpenHow{
		Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		return !errors.Is(err, unix.ENOENT)
	}
	unix.Close(fd)
	return true
}
