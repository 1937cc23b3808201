package secrets

import (
	"encoding/base64"
	"log/slog"
	"strconv"
	"strings"
)

// replacements is a set of substitutions applied in a single left-to-right
// pass. One pass matters: substituting secrets one after another could
// rewrite text that an earlier substitution inserted, e.g. a real value
// that happens to contain another secret's surrogate.
type replacements struct {
	pairs []pair
}

type pair struct{ old, new string }

// add ignores an old string already present, so the first secret (by name)
// wins when two secrets share a real value.
func (r *replacements) add(old, repl string) {
	if old == "" {
		return
	}
	for _, p := range r.pairs {
		if p.old == old {
			return
		}
	}
	r.pairs = append(r.pairs, pair{old, repl})
}

func (r *replacements) replace(s string) string {
	out, _ := r.replaceCount(s)
	return out
}

// replaceCount substitutes the earliest match first and, at one position,
// the longest, so a full base64 form wins over a fragment of it.
func (r *replacements) replaceCount(s string) (string, int) {
	if r == nil || len(r.pairs) == 0 {
		return s, 0
	}
	// next caches each old string's next occurrence; -1 means none left,
	// and a value below pos means it must be searched for again.
	next := make([]int, len(r.pairs))
	for i := range next {
		next[i] = -2
	}
	var b strings.Builder
	pos, n := 0, 0
	for {
		best := -1
		for i, p := range r.pairs {
			if next[i] == -1 {
				continue
			}
			if next[i] < pos {
				j := strings.Index(s[pos:], p.old)
				if j < 0 {
					next[i] = -1
					continue
				}
				next[i] = pos + j
			}
			if best < 0 || next[i] < next[best] ||
				next[i] == next[best] && len(p.old) > len(r.pairs[best].old) {
				best = i
			}
		}
		if best < 0 {
			break
		}
		if n == 0 {
			b.Grow(len(s))
		}
		b.WriteString(s[pos:next[best]])
		b.WriteString(r.pairs[best].new)
		pos = next[best] + len(r.pairs[best].old)
		n++
	}
	if n == 0 {
		return s, 0
	}
	b.WriteString(s[pos:])
	return b.String(), n
}

// String and LogValue exist because the old strings are real values.
func (r *replacements) String() string {
	if r == nil {
		return "replacements(0)"
	}
	return "replacements(" + strconv.Itoa(len(r.pairs)) + ")"
}

func (r *replacements) GoString() string { return r.String() }

func (r *replacements) LogValue() slog.Value { return slog.StringValue(r.String()) }

// redactions covers each real value raw, base64-encoded whole, and as the
// base64 run it produces at each of the three byte alignments inside a
// longer encoded string: "Authorization: Basic" carries "user:password"
// encoded, where the password rarely starts on a 3-byte boundary. Fragments
// are at least 8 characters (48 bits of the value), so they do not match
// ordinary text by chance.
func redactions(entries []*entry) *replacements {
	r := &replacements{}
	for _, e := range entries {
		mark := "[REDACTED:" + e.name + "]"
		r.add(e.real, mark)
		r.add(base64.StdEncoding.EncodeToString([]byte(e.real)), mark)
		for _, f := range base64Fragments(e.real) {
			r.add(f, mark)
		}
	}
	return r
}

// base64Fragments returns, for each alignment a of v in an encoded stream,
// the base64 characters determined by v's bytes alone.
func base64Fragments(v string) []string {
	var out []string
	for a := range 3 {
		skip := (3 - a) % 3
		if skip >= len(v) {
			continue
		}
		rest := v[skip:]
		rest = rest[:len(rest)/3*3]
		if len(rest) < 6 {
			continue
		}
		out = append(out, base64.RawStdEncoding.EncodeToString([]byte(rest)))
	}
	return out
}
