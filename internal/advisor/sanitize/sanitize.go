// Package sanitize removes credentials from command lines before the
// policy advisor stores or shows them. A denied process's argv is the
// best hint a person has about what wanted the connection, and also where
// agents put tokens (curl -H "Authorization: Bearer …", git clone
// https://user:token@…, FOO_TOKEN=… sh -c …). What survives here ends up
// in draft files, `corral draft show` and policy.local answers, so the
// rules err on the side of redacting too much.
package sanitize

import (
	"path"
	"regexp"
	"strings"
	"sync"
	"unicode/utf8"
)

// Redacted replaces every credential.
const Redacted = "[REDACTED]"

// MaxLine bounds Line's result in bytes; a command line is a hint, not a
// record, and a huge one (a script passed with -c) would bloat drafts.
const MaxLine = 1024

// Flags whose value (next argument or after "=") is a secret.
var secretFlags = map[string]bool{
	"--password": true, "--passwd": true, "--pass": true, "--token": true,
	"--api-key": true, "--apikey": true, "--api_key": true, "--secret": true,
	"--client-secret": true, "--access-token": true, "--auth-token": true,
	"--private-token": true, "--oauth2-bearer": true, "--bearer": true,
	"--cookie": true, "-b": true, "--proxy-pass": true, "--tlspassword": true,
}

// Flags whose value is user:password; only the password goes.
var userFlags = map[string]bool{"-u": true, "--user": true, "-U": true, "--proxy-user": true}

// Flags whose value is one "Name: value" header.
var headerFlags = map[string]bool{"-H": true, "--header": true, "--proxy-header": true}

// Header names whose values are credentials.
const secretHeaders = `authorization|proxy-authorization|cookie|set-cookie|x-api-key|api-key|apikey|x-auth-token|x-access-token|private-token|x-goog-api-key|x-amz-security-token`

// Each pattern keeps its first submatch (the part that says what the
// secret is, for a person reading the line) and redacts the rest. They are
// compiled on first use: every stage of every sandbox links this package,
// and few ever sanitise anything.
var patterns = sync.OnceValue(func() []*regexp.Regexp {
	return []*regexp.Regexp{
		// Header lines inside one argument or a shell string.
		regexp.MustCompile(`(?i)((?:^|[\s"'])(?:` + secretHeaders + `)\s*:\s*)[^\r\n"']+`),
		// Authorization schemes outside a header name.
		regexp.MustCompile(`(?i)(\b(?:bearer|basic|token)\s+)[A-Za-z0-9._~+/=-]{8,}`),
		// Passwords in URLs: scheme://user:password@host.
		regexp.MustCompile(`(?i)(\b[a-z][a-z0-9+.-]*://[^/@\s:]*:)[^/@\s]+(@)`),
		// Secrets in query strings.
		regexp.MustCompile(`(?i)([?&](?:access_token|token|api_key|apikey|key|secret|password|passwd|sig|signature|auth|client_secret|x-amz-signature|x-amz-credential|x-amz-security-token)=)[^&\s#"']+`),
		// KEY=VALUE assignments whose name says secret.
		regexp.MustCompile(`(?i)(\b[A-Za-z_][A-Za-z0-9_]*(?:token|secret|passwd|password|pwd|api_?key|access_?key|private_?key|auth|credentials?|cookie|session)[A-Za-z0-9_]*=)(?:"[^"]*"|'[^']*'|[^\s;&|"']+)`),
		// Secret flags written inside a shell string: --token=x, --token x.
		regexp.MustCompile(`(?i)((?:^|\s)--(?:password|passwd|pass|token|api-key|apikey|api_key|secret|client-secret|access-token|auth-token|private-token|oauth2-bearer)(?:=|\s+))[^\s"']+`),
		// mysql's attached password inside a shell string: -psecret.
		regexp.MustCompile(`((?:^|\s)-p)[^\s\d"'][^\s"']*`),
		// Well-known token shapes, wherever they appear, glued to other
		// text too (only sk- needs a word start: "task-…", "disk-…").
		regexp.MustCompile(`()gh[pousr]_[A-Za-z0-9]{20,}`),
		regexp.MustCompile(`()github_pat_[A-Za-z0-9_]{20,}`),
		regexp.MustCompile(`()\bsk-[A-Za-z0-9_-]{16,}`),
		regexp.MustCompile(`()xox[abposre]-[A-Za-z0-9-]{10,}`),
		regexp.MustCompile(`()(?:AKIA|ASIA)[0-9A-Z]{16}`),
		regexp.MustCompile(`()eyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*`),
		regexp.MustCompile(`()glpat-[A-Za-z0-9_-]{20,}`),
		regexp.MustCompile(`()npm_[A-Za-z0-9]{36}`),
		regexp.MustCompile(`()AIza[0-9A-Za-z_-]{35}`),
		regexp.MustCompile(`()hf_[A-Za-z0-9]{30,}`),
	}
})

// String redacts the credentials inside one free-form string: an
// argument, a header, a URL or a whole shell command.
func String(s string) string {
	for _, re := range patterns() {
		if !re.MatchString(s) {
			continue
		}
		s = re.ReplaceAllString(s, "${1}"+Redacted+"${2}")
	}
	return s
}

// Args returns a copy of argv with every credential replaced by Redacted.
func Args(argv []string) []string {
	out := make([]string, len(argv))
	prog := ""
	if len(argv) > 0 {
		prog = path.Base(argv[0])
	}
	for i := 0; i < len(argv); i++ {
		a := argv[i]
		out[i] = String(a)
		name, value, hasValue := strings.Cut(a, "=")
		if !strings.HasPrefix(a, "-") {
			continue
		}
		if hasValue && strings.HasPrefix(a, "--") {
			switch {
			case secretFlags[name]:
				out[i] = name + "=" + Redacted
			case userFlags[name]:
				out[i] = name + "=" + userValue(value)
			case headerFlags[name]:
				out[i] = name + "=" + String(value)
			}
			continue
		}
		next := func(f func(string) string) {
			if i+1 < len(argv) {
				i++
				out[i] = f(argv[i])
			}
		}
		switch {
		case secretFlags[a], a == "-a" && prog == "redis-cli":
			next(func(string) string { return Redacted })
		case userFlags[a]:
			next(userValue)
		case headerFlags[a]:
			next(String)
		case a == "-p":
			// A port for ssh and psql, a password nearly everywhere else.
			next(func(v string) string {
				if isPort(v) {
					return v
				}
				return Redacted
			})
		case strings.HasPrefix(a, "-p") && !strings.HasPrefix(a, "--") && !isPort(a[2:]):
			out[i] = "-p" + Redacted
		case strings.HasPrefix(a, "-H") && len(a) > 2:
			out[i] = "-H" + String(a[2:])
		case strings.HasPrefix(a, "-u") && len(a) > 2 && strings.Contains(a, ":"):
			out[i] = "-u" + userValue(a[2:])
		}
	}
	return out
}

// unsafe reports a rune that makes an argument need quoting to be read
// back by a shell; brackets pass so that [REDACTED] stays readable.
func unsafe(r rune) bool {
	return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_@%+=:,./-[]", r))
}

// userValue keeps the user name of user:password.
func userValue(v string) string {
	if u, _, ok := strings.Cut(v, ":"); ok {
		return u + ":" + Redacted
	}
	return String(v)
}

func isPort(s string) bool {
	if s == "" || len(s) > 5 {
		return false
	}
	return strings.Trim(s, "0123456789") == ""
}

// Line returns argv sanitised and joined for display, arguments with
// spaces or quotes single-quoted, at most MaxLine bytes.
func Line(argv []string) string {
	var b strings.Builder
	for i, a := range Args(argv) {
		if i > 0 {
			b.WriteByte(' ')
		}
		if a == "" || strings.IndexFunc(a, unsafe) >= 0 {
			b.WriteString("'" + strings.ReplaceAll(a, "'", `'\''`) + "'")
		} else {
			b.WriteString(a)
		}
	}
	s := b.String()
	if len(s) <= MaxLine {
		return s
	}
	cut := MaxLine
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
