// Package secrets implements masked secrets: credentials a workload may use
// but must never hold.
//
// corral reads each secret's real value at start (from its own environment,
// a host file, or the gateway's stream) and gives the workload a surrogate
// in its place: a random string of the same length, keeping any well-known
// token prefix and the per-position character class, so that client
// libraries which check a token's shape still accept it. The real value never enters the sandbox:
// the variable it came from is removed from the workload's environment and
// copies of it inside other variables are replaced by the surrogate.
//
// The L7 proxy, which terminates TLS for the secret's hosts, swaps the
// surrogate back for the real value, but only in the headers the policy
// names and only in requests to hosts the secret is scoped to. A surrogate
// sent anywhere else (another host, a body, a URL, an unnamed header) stays
// a surrogate, so a workload that is tricked into leaking its credentials
// leaks a string worthless outside the sandbox.
//
// Because the real values live in this package's memory, everything that
// holds one refuses to print it: Set and its parts implement fmt.Stringer,
// fmt.GoStringer and slog.LogValuer showing names only, and Redact scrubs
// real values from any text before it reaches a log.
package secrets

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unicode"
	"unicode/utf8"

	"github.com/corral-sandbox/corral/internal/hostpattern"
	"github.com/corral-sandbox/corral/internal/policy"
)

const (
	// A secret is a token, not a document; a larger file is more likely a
	// wrong path (a key ring, a log) than a credential.
	maxFileSize = 64 << 10

	// Anything shorter could plausibly occur in ordinary header text, and a
	// surrogate that short would be guessable.
	minValueLen = 8
)

// Set holds the real values and their surrogates for one sandbox.
//
// Its fields hold only pointers so that even printing a Set value (not a
// *Set, whose String method applies) through reflection shows addresses
// rather than real values.
type Set struct {
	// entries are the scopes, sorted by name; their real field is unset,
	// the values being in vals.
	entries []*entry
	// sources are the from_env variables, which must not reach the sandbox.
	sources map[string]*entry
	byName  map[string]*entry
	// vals is shared by this Set and every Set Rescope derives from it,
	// so that a new value from the gateway reaches whichever policy
	// version is in force, and a reload cannot undo it.
	vals *valueCell
}

// entry is one loaded secret.
type entry struct {
	name      string
	real      string
	surrogate string
	// gateway is the from_gateway name, "" for other sources.
	gateway string
	hosts   []hostpattern.Pattern
	headers []string // canonical
}

// valueCell holds the real values in force; writers are serialised, readers
// load one consistent values without a lock.
type valueCell struct {
	mu  sync.Mutex
	cur atomic.Pointer[values]
}

// values are the real values and what is derived from them.
type values struct {
	real map[string]string // by secret name
	// known are every value the secrets have held, current and replaced,
	// with their surrogates: redaction and scrubbing cover all of them,
	// since a request swapped just before a new value arrived can still
	// come back or be logged.
	known  []*entry
	redact *replacements
	scrub  *scrubber
}

func newValues(real map[string]string, known []*entry) *values {
	return &values{real: real, known: known, redact: redactions(known), scrub: newScrubber(known)}
}

// v returns the values in force; nil for a nil or empty Set.
func (s *Set) v() *values {
	if s == nil || s.vals == nil {
		return nil
	}
	return s.vals.cur.Load()
}

// Sources are where Load reads real values.
type Sources struct {
	// Getenv reads from_env variables: os.Getenv in production.
	Getenv func(string) string
	// Gateway returns the value of a from_gateway secret and whether the
	// gateway sent one; nil when the sandbox has no gateway.
	Gateway func(name string) (string, bool)
}

// Load reads each secret's real value (from_env via getenv — os.Getenv in
// production — or from_file, with one trailing "\n" or "\r\n" dropped) and
// generates its surrogate. Errors name the secret but never include a value.
func Load(scopes []policy.SecretScope, getenv func(string) string) (*Set, error) {
	return LoadFrom(scopes, Sources{Getenv: getenv})
}

// LoadFrom is Load with from_gateway secrets read from src.Gateway.
func LoadFrom(scopes []policy.SecretScope, src Sources) (*Set, error) {
	s := &Set{
		sources: map[string]*entry{},
		byName:  map[string]*entry{},
		vals:    &valueCell{},
	}
	real := map[string]string{}
	var known []*entry
	for _, sc := range scopes {
		e, err := loadEntry(sc, src)
		if err != nil {
			return nil, fmt.Errorf("secret %s: %w", sc.Name, err)
		}
		if e.surrogate, err = newSurrogate(e.real, known); err != nil {
			return nil, fmt.Errorf("secret %s: %w", sc.Name, err)
		}
		known = append(known, &entry{name: e.name, real: e.real, surrogate: e.surrogate})
		real[e.name] = e.real
		e.real = ""
		s.entries = append(s.entries, e)
		s.byName[sc.Name] = e
		if src := sc.Source.FromEnv; src != "" {
			s.sources[src] = e
		}
	}
	s.vals.cur.Store(newValues(real, known))
	return s, nil
}

func loadEntry(sc policy.SecretScope, src Sources) (*entry, error) {
	e := &entry{name: sc.Name, headers: sc.Headers, hosts: sc.Hosts, gateway: sc.Source.FromGateway}
	spec := sc.Source
	getenv := src.Getenv
	// Validation has made sure exactly one source is set.
	switch {
	case spec.FromGateway != "":
		if src.Gateway == nil {
			return nil, fmt.Errorf("from_gateway %s: corral run has no --gateway to take it from", spec.FromGateway)
		}
		v, ok := src.Gateway(spec.FromGateway)
		if !ok {
			return nil, fmt.Errorf("from_gateway %s: the gateway sent no such secret; set it there (SecretService.Set) and start again", spec.FromGateway)
		}
		e.real = v
	case spec.FromEnv != "":
		// getenv cannot tell unset from empty, and an empty value is
		// unusable either way.
		if e.real = getenv(spec.FromEnv); e.real == "" {
			return nil, fmt.Errorf("from_env %s is not set in corral's environment", spec.FromEnv)
		}
	default:
		var err error
		if e.real, err = readValueFile(spec.FromFile); err != nil {
			return nil, err
		}
	}
	if err := checkValue(e.real); err != nil {
		return nil, err
	}
	return e, nil
}

func readValueFile(path string) (string, error) {
	// No regular-file check: a FIFO or /dev/fd path from a password
	// manager is a legitimate source. The size limit bounds those too.
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("from_file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return "", fmt.Errorf("from_file: %w", err)
	}
	if len(b) > maxFileSize {
		return "", fmt.Errorf("from_file %s is larger than %d KiB", path, maxFileSize>>10)
	}
	v := string(b)
	// Editors and `echo >` add one line ending; anything beyond that is
	// content and is left for checkValue to judge.
	if t, ok := strings.CutSuffix(v, "\r\n"); ok {
		v = t
	} else {
		v = strings.TrimSuffix(v, "\n")
	}
	if v == "" {
		return "", fmt.Errorf("from_file %s is empty", path)
	}
	return v, nil
}

// checkValue refuses values the header swap cannot handle safely. The
// messages give positions, never characters, so they cannot leak a value.
func checkValue(v string) error {
	if len(v) < minValueLen {
		return fmt.Errorf("the value is %d bytes; at least %d are needed, since a shorter surrogate could occur in ordinary header text", len(v), minValueLen)
	}
	if !utf8.ValidString(v) {
		return errors.New("the value is not valid UTF-8 and cannot be replaced safely in headers")
	}
	for i, r := range v {
		if unicode.IsControl(r) || unicode.IsSpace(r) {
			return fmt.Errorf("the value has a control character or space at byte %d; such values cannot be replaced safely in headers, where whitespace separates fields and control characters are forbidden", i)
		}
	}
	return nil
}

func (e *entry) matchesHost(host string) bool {
	return slices.ContainsFunc(e.hosts, func(p hostpattern.Pattern) bool { return p.Match(host) })
}

// Scoped reports whether some secret's real value may be sent to host:
// the responses of such requests are scrubbed.
func (s *Set) Scoped(host string) bool {
	if s == nil {
		return false
	}
	return slices.ContainsFunc(s.entries, func(e *entry) bool { return e.matchesHost(host) })
}

// Env returns NAME=surrogate for every secret, sorted by name.
func (s *Set) Env() []string {
	if s == nil || len(s.entries) == 0 {
		return nil
	}
	env := make([]string, len(s.entries))
	for i, e := range s.entries {
		env[i] = e.name + "=" + e.surrogate
	}
	return env
}

// ScrubEnv returns a copy of env (KEY=VALUE entries) that cannot carry a
// real value into the sandbox: a secret's source variable is dropped, a
// variable named like a secret gets its surrogate, and a real value (in any
// form the scrubber knows) inside any other value is replaced by its
// surrogate in the same form.
func (s *Set) ScrubEnv(env []string) []string {
	if s == nil || len(s.entries) == 0 {
		return env
	}
	scrub := s.v().scrub
	out := make([]string, 0, len(env))
	for _, kv := range env {
		k, v, hasEq := strings.Cut(kv, "=")
		if !hasEq {
			// Not a variable, but still scrubbed: it may reach the
			// workload all the same.
			out = append(out, scrub.replace(kv))
			continue
		}
		if e, ok := s.byName[k]; ok {
			out = append(out, k+"="+e.surrogate)
			continue
		}
		if _, ok := s.sources[k]; ok {
			continue
		}
		out = append(out, k+"="+scrub.replace(v))
	}
	return out
}

// Swap replaces surrogates with real values in h, in place, for a request
// to host (a port, if present, is ignored). Only secrets whose hosts match
// are considered, and each only in its own headers. A "Basic" credential is
// base64-decoded, swapped inside "user:password" and re-encoded. Swap
// returns the number of replacements made.
func (s *Set) Swap(host string, h http.Header) int {
	if s == nil || len(s.entries) == 0 || len(h) == 0 {
		return 0
	}
	if hh, _, err := net.SplitHostPort(host); err == nil {
		host = hh
	}
	host = strings.Trim(host, "[]")
	var scoped []*entry
	for _, e := range s.entries {
		if e.matchesHost(host) {
			scoped = append(scoped, e)
		}
	}
	if len(scoped) == 0 {
		return 0
	}
	real := s.v().real
	n := 0
	// Keys are canonicalised here rather than looked up, because a header
	// map built by hand may hold non-canonical keys that still go on the
	// wire.
	for key, vals := range h {
		ck := http.CanonicalHeaderKey(key)
		var r replacements
		for _, e := range scoped {
			if slices.Contains(e.headers, ck) {
				r.add(e.surrogate, real[e.name])
			}
		}
		if len(r.pairs) == 0 {
			continue
		}
		for i, v := range vals {
			if nv, k := swapValue(v, &r); k > 0 {
				vals[i] = nv
				n += k
			}
		}
	}
	return n
}

func swapValue(v string, r *replacements) (string, int) {
	if prefix, cred, ok := basicCredential(v); ok {
		if dec, err := base64.StdEncoding.DecodeString(cred); err == nil {
			if out, k := r.replaceCount(string(dec)); k > 0 {
				return prefix + base64.StdEncoding.EncodeToString([]byte(out)), k
			}
		}
	}
	return r.replaceCount(v)
}

// basicCredential splits "Basic <b64>" (scheme case-insensitive, RFC 7235)
// into the part kept verbatim and the encoded credential.
func basicCredential(v string) (prefix, cred string, ok bool) {
	const scheme = "basic"
	if len(v) <= len(scheme) || !strings.EqualFold(v[:len(scheme)], scheme) || v[len(scheme)] != ' ' {
		return "", "", false
	}
	rest := strings.TrimLeft(v[len(scheme):], " ")
	cred = strings.TrimRight(rest, " ")
	if cred == "" {
		return "", "", false
	}
	return v[:len(v)-len(rest)], cred, true
}

// Redact replaces every real value in text, raw or base64-encoded, with
// "[REDACTED:<NAME>]". Everything headed for a log goes through it, since
// after Swap a request carries real values.
func (s *Set) Redact(text string) string {
	if s == nil || len(s.entries) == 0 {
		return text
	}
	return s.v().redact.replace(text)
}

// Names returns the secret names, sorted.
func (s *Set) Names() []string {
	if s == nil || len(s.entries) == 0 {
		return nil
	}
	names := make([]string, len(s.entries))
	for i, e := range s.entries {
		names[i] = e.name
	}
	return names
}

// Len returns the number of secrets.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.entries)
}

// String lists the names only, so that %v and %+v cannot print a value.
func (s *Set) String() string {
	return "secrets[" + strings.Join(s.Names(), " ") + "]"
}

// GoString covers %#v, which bypasses String.
func (s *Set) GoString() string { return s.String() }

// LogValue keeps slog from reflecting into the Set.
func (s *Set) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Int("count", s.Len()),
		slog.Any("names", s.Names()),
	)
}

func (e *entry) String() string   { return "secret " + e.name }
func (e *entry) GoString() string { return e.String() }
func (e *entry) LogValue() slog.Value {
	return slog.GroupValue(slog.String("name", e.name))
}
