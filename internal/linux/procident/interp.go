//go:build linux

package procident

import (
	"path"
	"regexp"
	"slices"
	"strings"
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
	node = grammar{
		noScript: "epivh",
		value:    "rC",
		longFlags: []string{"--no-warnings", "--no-deprecation", "--trace-warnings", "--trace-deprecation",
			"--throw-deprecation", "--pending-deprecation", "--enable-source-maps", "--preserve-symlinks",
			"--preserve-symlinks-main", "--expose-gc", "--abort-on-uncaught-exception", "--inspect",
			"--inspect-brk", "--inspect-wait", "--experimental-vm-modules", "--experimental-strip-types",
			"--experimental-transform-types", "--no-experimental-strip-types", "--experimental-require-module",
			"--no-addons", "--frozen-intrinsics", "--use-openssl-ca", "--use-bundled-ca", "--trace-uncaught",
			"--jitless", "--no-global-search-paths", "--trace-exit", "--trace-sigint", "--zero-fill-buffers",
			"--openssl-legacy-provider", "--report-on-fatalerror", "--report-uncaught-exception", "--watch"},
		longValue: []string{"--require", "--import", "--loader", "--experimental-loader", "--conditions",
			"--input-type", "--title", "--env-file", "--env-file-if-exists", "--redirect-warnings", "--icu-data-dir",
			"--openssl-config", "--inspect-port", "--unhandled-rejections", "--max-old-space-size", "--stack-size"},
		longNoScript: []string{"--eval", "--print", "--interactive", "--version", "--help", "--test", "--check", "--run"},
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
	perl = grammar{
		noScript: "eEvhV",
		value:    "IMm",
		attached: "xil0CdDF",
		flags:    "acnpstTuUwWXSg",
	}
	ruby = grammar{
		noScript:     "evh",
		value:        "IrCE",
		attached:     "xiWK0F",
		flags:        "acdlnpsSwy",
		longFlags:    []string{"--verbose", "--jit", "--yjit", "--disable-gems", "--disable-all", "--enable-all"},
		longValue:    []string{"--enable", "--disable", "--encoding", "--external-encoding", "--internal-encoding"},
		longNoScript: []string{"--version", "--help", "--dump"},
	}
)

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
