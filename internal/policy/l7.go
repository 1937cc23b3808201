package policy

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// checkPathSelector validates an endpoint's path selector. Without a
// protocol nothing reads the request, so the selector (like the other L7
// fields) cannot take effect.
func checkPathSelector(r *report, at string, ep Endpoint) {
	if ep.Path != "" {
		switch {
		case ep.Path != "**" && !strings.HasPrefix(ep.Path, "/"):
			r.errorf(at+".path", fmt.Sprintf(`write it as %q, or "**" for any path`, "/"+ep.Path), "path %q does not start with /", ep.Path)
		default:
			if msg, fix := checkGlob(ep.Path, true); msg != "" {
				r.errorf(at+".path", fix, "%s", msg)
			}
		}
		if ep.Protocol == "" {
			r.warnf(at+".path", "add protocol: rest, or remove path", "a path selector has no effect without protocol")
		}
	}
	if ep.AllowEncodedSlash && ep.Protocol == "" {
		r.warnf(at+".allow_encoded_slash", "add protocol: rest, or remove allow_encoded_slash", "has no effect without protocol")
	}
}

// checkGlob checks a rule path or endpoint path selector: glob syntax (see
// lexGlob), and ** only as a whole segment, since inside one it would
// silently cross "/" where the author meant *. A "?" followed by "=" is
// almost always a query string pasted into the path, which could never
// match because the proxy compares paths without their query.
func checkGlob(p string, selector bool) (msg, fix string) {
	if i := strings.IndexByte(p, '?'); i >= 0 && strings.Contains(p[i+1:], "=") {
		if selector {
			return fmt.Sprintf("path %q contains a query string", p),
				fmt.Sprintf("write %q; the path selector matches only the path", p[:i])
		}
		return fmt.Sprintf("path %q contains a query string", p),
			fmt.Sprintf("write path: %q and put the parameters under query:, e.g. query: {%s}", p[:i], queryExample(p[i+1:]))
	}
	toks, problem, fix := lexGlob(p)
	if problem != "" {
		return fmt.Sprintf("path %q %s", p, problem), fix
	}
	for i, t := range toks {
		if t == globSuper && (i > 0 && toks[i-1] != globSep || i+1 < len(toks) && toks[i+1] != globSep) {
			return fmt.Sprintf("path %q uses ** inside a segment", p),
				"use ** only as a whole segment to match across segments (/repos/**), and * to match within one"
		}
	}
	return "", ""
}

// checkQueryGlob checks one query value glob; ** has no special meaning in
// a value, so only the syntax matters.
func checkQueryGlob(r *report, at, g string) {
	if _, problem, fix := lexGlob(g); problem != "" {
		r.errorf(at, fix, "glob %q %s", g, problem)
	}
}

// Glob tokens, as far as validation needs to tell them apart.
const (
	globLit   = iota // a literal character or a character class
	globSep          // a literal "/"
	globAny          // *
	globSuper        // **
	globOther        // ?, and the braces and commas of {a,b}
)

// lexGlob tokenises a glob the way the egress matcher (gobwas/glob, through
// Rego's glob.match) does, and describes the first construct it would
// refuse. The matcher only finds out when a request is evaluated, so
// anything accepted here must compile there. Beyond * ** ? and classes it
// also knows {a,b} alternatives and \ escapes.
func lexGlob(g string) (toks []int, problem, fix string) {
	if !utf8.ValidString(g) {
		return nil, "is not valid UTF-8", "remove the invalid bytes"
	}
	rs := []rune(g)
	depth := 0
	for i := 0; i < len(rs); i++ {
		switch r := rs[i]; {
		case r == '\\':
			i++
			if i == len(rs) {
				return nil, `ends with a lone \`, `write \\ to match a literal \, or remove it`
			}
			toks = append(toks, globLit)
		case r == '{':
			depth++
			toks = append(toks, globOther)
		case r == '}' && depth > 0:
			depth--
			toks = append(toks, globOther)
		case r == ',' && depth > 0:
			toks = append(toks, globOther)
		case r == '?':
			toks = append(toks, globOther)
		case r == '*':
			if i+1 < len(rs) && rs[i+1] == '*' {
				i++
				toks = append(toks, globSuper)
			} else {
				toks = append(toks, globAny)
			}
		case r == '[':
			end, problem, fix := lexClass(rs, i+1)
			if problem != "" {
				return nil, problem, fix
			}
			i = end
			toks = append(toks, globLit)
		case r == '/':
			toks = append(toks, globSep)
		default:
			toks = append(toks, globLit)
		}
	}
	if depth > 0 {
		return nil, "has a { without a closing }", "close the group, e.g. {a,b}; write [{] to match a literal {"
	}
	return toks, "", ""
}

// lexClass reads a character class whose "[" precedes rs[i] and returns
// the index of its "]". The matcher accepts [abc], [!abc] and a single
// range [a-z] or [!a-z]; unlike fnmatch it has no [a-zA-Z] and no leading
// "]" member, so neither may pass here.
func lexClass(rs []rune, i int) (end int, problem, fix string) {
	const unclosed = "has a [ without a closing ]"
	const unclosedFix = "close the character class, e.g. [a-z]; write [[] to match a literal ["
	if i < len(rs) && rs[i] == '!' {
		i++
	}
	if i+1 < len(rs) && rs[i+1] == '-' {
		if i+3 >= len(rs) {
			return 0, unclosed, unclosedFix
		}
		lo, hi := rs[i], rs[i+2]
		if rs[i+3] != ']' {
			return 0, "has a character class mixing a range with other characters",
				"a class holds either characters [abc] or one range [a-z]; combine them with braces, e.g. {[a-z],[0-9],_}"
		}
		if hi < lo {
			return 0, fmt.Sprintf("has a reversed range %c-%c", lo, hi), fmt.Sprintf("write it as %c-%c", hi, lo)
		}
		return i + 3, "", ""
	}
	start := i
	for ; i < len(rs) && rs[i] != ']'; i++ {
		if rs[i] == '\\' {
			i++
		}
	}
	switch {
	case i >= len(rs):
		return 0, unclosed, unclosedFix
	case i == start:
		return 0, "has an empty character class", "put at least one character between [ and ], e.g. [abc]"
	}
	return i, "", ""
}

func queryExample(q string) string {
	var parts []string
	for pair := range strings.SplitSeq(q, "&") {
		k, v, _ := strings.Cut(pair, "=")
		if k != "" {
			parts = append(parts, fmt.Sprintf("%s: %q", k, v))
		}
	}
	return strings.Join(parts, ", ")
}

// queryAny is the only key of a query matcher mapping.
const queryAny = "any"

// checkQuery validates query matchers: each value is a glob string or
// {any: [globs]}. The loader keeps them loosely typed, so shape errors are
// caught here rather than by the strict walker.
func checkQuery(r *report, at string, q map[string]any) {
	for _, name := range slices.Sorted(maps.Keys(q)) {
		qat := joinPath(at, name)
		if name == "" {
			r.errorf(qat, "name the parameter, e.g. page", "empty query parameter name")
		}
		switch v := q[name].(type) {
		case string:
			checkQueryGlob(r, qat, v)
		case map[string]any:
			checkQueryAny(r, qat, v)
		default:
			fix := `write a glob such as "v*", or any: ["a", "b"] to accept several values`
			switch v.(type) {
			case int, int64, uint64, float64, bool:
				fix = fmt.Sprintf("quote it: %q", fmt.Sprint(v))
			}
			r.errorf(qat, fix, "expected a glob string or a mapping with any:, got %s", describeValue(v))
		}
	}
}

func checkQueryAny(r *report, at string, m map[string]any) {
	keys := slices.Sorted(maps.Keys(m))
	for _, k := range keys {
		if k != queryAny {
			r.errorf(joinPath(at, k), unknownFix(k, []string{queryAny}), "unknown matcher key")
		}
	}
	v, ok := m[queryAny]
	if !ok {
		if len(keys) == 0 {
			r.errorf(at, `write any: ["a", "b"], or a single glob string`, "an empty matcher mapping")
		}
		return
	}
	aat := joinPath(at, queryAny)
	list, ok := v.([]any)
	switch {
	case !ok:
		r.errorf(aat, `write any: ["a", "b"]`, "expected a list of glob strings, got %s", describeValue(v))
	case len(list) == 0:
		r.errorf(aat, "list at least one glob, or remove the parameter", "an empty any list would match no value")
	}
	for i, item := range list {
		iat := fmt.Sprintf("%s[%d]", aat, i)
		if g, ok := item.(string); ok {
			checkQueryGlob(r, iat, g)
		} else {
			r.errorf(iat, `write a glob string; quote numbers, e.g. "100"`, "expected a glob string, got %s", describeValue(item))
		}
	}
}

// describeValue names a decoded YAML value the way describeNode names an
// undecoded one.
func describeValue(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case string:
		return "string " + strconv.Quote(v)
	case bool:
		return fmt.Sprintf("boolean %v", v)
	case int, int64, uint64, float64:
		return fmt.Sprintf("number %v", v)
	case []any:
		return "a list"
	case map[string]any:
		return "a mapping"
	}
	return fmt.Sprintf("%T", v)
}
