// Package hostpattern compiles the host names and wildcard patterns that
// policies write (api.example.com, *.example.com, **.example.com,
// api-*.example.com) into matchers. The egress decision index, policy
// validation and the L7 secret scopes all read patterns through it, so a
// pattern cannot mean one thing to one of them and another to the next.
package hostpattern

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
)

// Pattern is one compiled host pattern.
type Pattern struct {
	// Host is the pattern normalised: lower-case, no trailing dot, an IP
	// address in canonical form.
	Host string
	// Regexp matches exactly the names the pattern stands for.
	Regexp *regexp.Regexp
	// Rest is what follows the wildcard label ("" for an exact name); an
	// index can bucket patterns by it.
	Rest string
	// AnyDepth is set for "**.rest", which covers one or more labels.
	AnyDepth bool
}

// Wildcard reports whether the pattern stands for more than one name.
func (p Pattern) Wildcard() bool { return p.Rest != "" }

// Match reports whether host (any case, trailing dot ignored) is one of the
// names the pattern stands for.
func (p Pattern) Match(host string) bool {
	host = Normalise(host)
	if !p.Wildcard() {
		return host == p.Host
	}
	return p.Regexp.MatchString(host)
}

// Normalise lower-cases a host name and drops a trailing dot.
func Normalise(h string) string {
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

// A wildcard stands for label characters only, so a name carrying other
// bytes (from a forged SNI or Host header) can never match a pattern.
const labelChars = `[a-z0-9_-]`

var patternChars = regexp.MustCompile(`^[a-z0-9_.*-]+$`)

// Compile normalises h and compiles it. Patterns that would match every
// name or a whole top-level domain are refused even where validation was
// skipped, since matching is the last line of defence.
func Compile(h string) (Pattern, error) {
	h = Normalise(h)
	if a, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil {
		h = a.Unmap().WithZone("").String()
		return Pattern{Host: h, Regexp: regexp.MustCompile("^" + regexp.QuoteMeta(h) + "$")}, nil
	}
	if !patternChars.MatchString(h) {
		return Pattern{}, fmt.Errorf("host %q has characters a host name cannot contain", h)
	}
	labels := strings.Split(h, ".")
	if slices.Contains(labels, "") {
		return Pattern{}, fmt.Errorf("host %q has an empty label", h)
	}
	if !strings.Contains(h, "*") {
		return Pattern{Host: h, Regexp: regexp.MustCompile("^" + regexp.QuoteMeta(h) + "$")}, nil
	}
	first, rest := labels[0], strings.Join(labels[1:], ".")
	switch {
	case strings.Contains(rest, "*"):
		return Pattern{}, fmt.Errorf("host %q has a wildcard outside the first label", h)
	case len(labels) < 3:
		return Pattern{}, fmt.Errorf("host %q covers a whole top-level domain", h)
	case first == "**":
		re := regexp.MustCompile(`^` + labelChars + `+(?:\.` + labelChars + `+)*\.` + regexp.QuoteMeta(rest) + `$`)
		return Pattern{Host: h, Regexp: re, Rest: rest, AnyDepth: true}, nil
	case strings.Contains(first, "**"):
		return Pattern{}, fmt.Errorf("host %q uses ** inside a label", h)
	}
	var expr string
	if first == "*" {
		expr = labelChars + `+`
	} else {
		parts := strings.Split(first, "*")
		for i, s := range parts {
			parts[i] = regexp.QuoteMeta(s)
		}
		expr = strings.Join(parts, labelChars+`*`)
	}
	return Pattern{Host: h, Regexp: regexp.MustCompile(`^` + expr + `\.` + regexp.QuoteMeta(rest) + `$`), Rest: rest}, nil
}

// MayBeAddr is false for a host that cannot be an IP literal: an IPv4
// address is digits and dots only, an IPv6 address has a colon. It keeps
// names, the common case on every decision and leaf lookup, off the
// address parsers, which allocate an error for each name they refuse.
func MayBeAddr(host string) bool {
	if strings.IndexByte(host, ':') >= 0 {
		return true
	}
	for i := 0; i < len(host); i++ {
		if c := host[i]; c != '.' && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}
