package audit

import (
	"fmt"
	"log/slog"
	"unicode/utf8"
)

// truncate cuts s to at most max bytes (at a rune boundary) and appends
// "…[truncated N bytes]", N being the bytes cut. The marker is part of the
// log format: a reader can tell a cut value from a short one and by how much.
func truncate(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("…[truncated %d bytes]", len(s)-cut)
}

// attrs turns base and the alternating key/values of Emit into attributes
// (as slog would: a key without a value, or a value without a string key,
// is recorded under !BADKEY) with every value truncated.
func (c *config) attrs(base []slog.Attr, kv []any) []slog.Attr {
	out := make([]slog.Attr, 0, len(base)+len(kv)/2)
	out = append(out, base...)
	for len(kv) > 0 {
		switch k := kv[0].(type) {
		case slog.Attr:
			out = append(out, slog.Attr{Key: k.Key, Value: c.value(k.Value)})
			kv = kv[1:]
		case string:
			if len(kv) == 1 {
				out = append(out, slog.String("!BADKEY", truncate(k, c.maxField)))
				kv = nil
				break
			}
			out = append(out, slog.Attr{Key: k, Value: c.value(slog.AnyValue(kv[1]))})
			kv = kv[2:]
		default:
			out = append(out, slog.Attr{Key: "!BADKEY", Value: c.value(slog.AnyValue(k))})
			kv = kv[1:]
		}
	}
	return out
}

// value truncates the strings in v: strings, errors, string lists (also
// cut to maxItems elements, the last then saying how many were left out)
// and groups. Other values are small by type.
func (c *config) value(v slog.Value) slog.Value {
	v = v.Resolve()
	switch v.Kind() {
	case slog.KindString:
		if s := v.String(); len(s) > c.maxField {
			return slog.StringValue(truncate(s, c.maxField))
		}
		return v
	case slog.KindGroup:
		g := v.Group()
		out := make([]slog.Attr, len(g))
		for i, a := range g {
			out[i] = slog.Attr{Key: a.Key, Value: c.value(a.Value)}
		}
		return slog.GroupValue(out...)
	case slog.KindAny:
		switch x := v.Any().(type) {
		case error:
			return slog.StringValue(truncate(x.Error(), c.maxField))
		case []string:
			return slog.AnyValue(c.list(x))
		}
	}
	return v
}

func (c *config) list(x []string) []string {
	n := min(len(x), c.maxItems)
	out := make([]string, n, n+1)
	for i := range n {
		out[i] = truncate(x[i], c.maxField)
	}
	if len(x) > n {
		out = append(out, fmt.Sprintf("…[truncated %d items]", len(x)-n))
	}
	return out
}
