package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// ParseAllowEntry parses one network.allow entry: "host[:port]",
// "ip[:port]", "cidr[:port]" or "[ipv6-or-cidr]:port". The port defaults to
// DefaultAllowPort (443) for every form, so plain-HTTP or database access
// needs an explicit port.
func ParseAllowEntry(s string) (Endpoint, error) {
	ep, msg, fix := parseAllow(s)
	if msg != "" {
		return Endpoint{}, errors.New(msg + " — " + fix)
	}
	return ep, nil
}

func parseAllow(s string) (ep Endpoint, msg, fix string) {
	const form = `write host[:port] or cidr[:port], e.g. "api.github.com:443" or "10.1.0.0/16:5432"`
	target, portStr := s, ""
	switch {
	case s == "":
		return ep, "empty entry", form
	case strings.HasPrefix(s, "["):
		end := strings.Index(s, "]")
		if end < 0 {
			return ep, fmt.Sprintf("%q has no closing ]", s), form
		}
		target, portStr = s[1:end], s[end+1:]
		if portStr != "" {
			if !strings.HasPrefix(portStr, ":") {
				return ep, fmt.Sprintf("%q has text after ]", s), form
			}
			portStr = portStr[1:]
			if portStr == "" {
				return ep, fmt.Sprintf("%q has an empty port", s), form
			}
		}
	case strings.Count(s, ":") == 1:
		target, portStr, _ = strings.Cut(s, ":")
		if portStr == "" {
			return ep, fmt.Sprintf("%q has an empty port", s), form
		}
	}
	ep.Port = DefaultAllowPort
	if portStr != "" {
		n, err := strconv.Atoi(portStr)
		if err != nil || !validPort(n) {
			return ep, fmt.Sprintf("%q has an invalid port %q", s, portStr), "use a port from 1 to 65535"
		}
		ep.Port = n
	}
	if looksLikeIP(target) {
		pfx, m, f := parseIPRange(target)
		if m != "" {
			return ep, m, f
		}
		ep.AllowedIPs = []string{pfx.String()}
		return ep, "", ""
	}
	if m, f := checkHost(target); m != "" {
		return ep, m, f
	}
	ep.Host = strings.ToLower(target)
	return ep, "", ""
}

// looksLikeIP routes an entry to IP parsing so that a mistyped address gets
// an IP error rather than a confusing host-name one.
func looksLikeIP(s string) bool {
	if strings.Contains(s, "/") || strings.Contains(s, ":") || strings.Trim(s, "0123456789.") == "" {
		return true
	}
	_, err := netip.ParseAddr(s)
	return err == nil
}
