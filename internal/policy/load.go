package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/corral-sandbox/corral/internal/yamlsafe"
)

// Load reads and parses the policy file at path. Every error is prefixed
// with "load policy PATH: "; validation failures unwrap to *ValidationError.
func Load(path string) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load policy %s: %w", path, err)
	}
	p, err := Parse(data, path)
	if err != nil {
		return nil, fmt.Errorf("load policy %s: %w", path, err)
	}
	return p, nil
}

// Parse decodes one YAML policy document strictly, takes every top-level
// section it leaves out from the built-in default (see ParseOnto), applies
// defaults and validates it. source names the input (a path,
// "git:REF:PATH", "<default>") and is recorded in Policy.Source; errors are
// not prefixed with it so that callers such as Load can add their own
// context without repeating it.
//
// Unknown fields, type mismatches and failed validation rules are returned
// together as a *ValidationError, all of them at once. Syntax errors, empty
// input and multiple documents are plain errors.
func Parse(data []byte, source string) (*Policy, error) {
	return ParseOnto(data, source, Default())
}

// ParseOnto is Parse with base in place of the built-in default. Every
// top-level section except version and extends that the document does not
// name is copied from base and listed in Inherited; a section it names,
// even as an empty mapping, replaces base's section whole, so no section is
// ever a hidden mix of two files. "extends: none" in the document, or a nil
// base, leaves unnamed sections empty.
func ParseOnto(data []byte, source string, base *Policy) (*Policy, error) {
	root, err := parseDocument(data)
	if err != nil {
		return nil, err
	}
	w := &walker{budget: maxWalkNodes}
	w.walk(root, reflect.TypeFor[Policy](), "")
	if w.budget <= 0 {
		// Decoding an alias bomb is what the budget is there to prevent.
		return nil, &ValidationError{Problems: w.problems}
	}
	dropReportedKeys(root)
	var p Policy
	// Decode keeps going past type mismatches, leaving those fields unset,
	// so the rules below still check everything else. The walker reports
	// the same mismatches with better messages; Decode's error matters
	// only for what the walker does not model (custom tags, overflow).
	if err := yamlsafe.Decode(root, &p); err != nil && len(w.problems) == 0 {
		return nil, decodeError(err)
	}
	p.Source = source
	p.inherit(root, base)
	p.ApplyDefaults()
	problems := w.problems
	for _, pr := range p.check().errs {
		if !w.explains(pr) {
			problems = append(problems, pr)
		}
	}
	if len(problems) > 0 {
		return nil, &ValidationError{Problems: problems}
	}
	return &p, nil
}

// inherit copies from base every top-level section the document rooted at
// root does not name.
func (p *Policy) inherit(root *yaml.Node, base *Policy) {
	if base == nil || p.Extends == ExtendsNone {
		return
	}
	named := map[string]bool{}
	(&walker{budget: maxWalkNodes}).mapping(root, "", false, func(key string, _, _ *yaml.Node, _ bool) {
		named[key] = true
	})
	from := reflect.ValueOf(base.clone()).Elem()
	to := reflect.ValueOf(p).Elem()
	// A section equal to what an empty one defaults to adds nothing worth
	// naming in Inherited (the default's "landlock: best_effort").
	empty := &Policy{}
	empty.ApplyDefaults()
	unset := reflect.ValueOf(empty).Elem()
	fields := structFields(reflect.TypeFor[Policy]())
	for _, name := range fields.names {
		if named[name] || name == "version" || name == "extends" {
			continue
		}
		f := fields.byName[name]
		v := from.FieldByIndex(f.Index)
		if v.IsZero() {
			continue
		}
		to.FieldByIndex(f.Index).Set(v)
		if !reflect.DeepEqual(v.Interface(), unset.FieldByIndex(f.Index).Interface()) {
			p.Inherited = append(p.Inherited, name)
		}
	}
}

// parseDocument returns the single top-level mapping of data.
func parseDocument(data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errEmpty
		}
		return nil, syntaxError(err)
	}
	for {
		var extra yaml.Node
		err := dec.Decode(&extra)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, syntaxError(err)
		}
		// A trailing "---" with nothing after it adds no policy; tolerate it.
		if !isEmptyDocument(&extra) {
			return nil, fmt.Errorf("multiple YAML documents (another starts at line %d) — a policy file holds exactly one; remove the extra \"---\" separator", max(extra.Line, 1))
		}
	}
	if len(doc.Content) == 0 {
		return nil, errEmpty
	}
	root := doc.Content[0]
	if root.Kind == yaml.ScalarNode && root.ShortTag() == nullTag {
		return nil, errEmpty
	}
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("line %d: the policy must be a mapping of fields, got %s — start the file with \"version: 1\"", root.Line, describeNode(root))
	}
	return root, nil
}

// dropReportedKeys removes from every mapping the keys the walker has
// reported: all but the first of a repeated key, which would make the
// decoder skip the whole mapping so that the rules report its fields as
// missing, and keys that are mappings or lists, which make yaml.v3 panic
// next to a merge key. Aliases are not followed; the mappings they name
// are in the tree anyway.
func dropReportedKeys(n *yaml.Node) {
	if n.Kind == yaml.MappingNode {
		seen := map[string]bool{}
		kept := n.Content[:0]
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			target := k
			if k.Kind == yaml.AliasNode && k.Alias != nil {
				target = k.Alias
			}
			if target.Kind == yaml.MappingNode || target.Kind == yaml.SequenceNode {
				continue
			}
			if k.Kind == yaml.ScalarNode && k.ShortTag() != mergeTag {
				if seen[k.Value] {
					continue
				}
				seen[k.Value] = true
			}
			kept = append(kept, k, n.Content[i+1])
		}
		n.Content = kept
	}
	for _, c := range n.Content {
		dropReportedKeys(c)
	}
}

func isEmptyDocument(doc *yaml.Node) bool {
	if len(doc.Content) == 0 {
		return true
	}
	n := doc.Content[0]
	return n.Kind == yaml.ScalarNode && n.ShortTag() == nullTag && n.Value == ""
}

var errEmpty = errors.New("the policy is empty — it must contain at least \"version: 1\"")

func syntaxError(err error) error {
	return fmt.Errorf("invalid YAML: %s", strings.TrimPrefix(err.Error(), "yaml: "))
}

func decodeError(err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return syntaxError(err)
	}
	ve := &ValidationError{}
	for _, msg := range te.Errors {
		ve.Problems = append(ve.Problems, Problem{
			Path:    "policy",
			Message: msg,
			Fix:     "give the value the type the schema expects (schema/policy.schema.json)",
		})
	}
	return ve
}

const (
	nullTag  = "!!null"
	strTag   = "!!str"
	intTag   = "!!int"
	floatTag = "!!float"
	boolTag  = "!!bool"
	mergeTag = "!!merge"
)

// maxWalkNodes bounds the work done on alias-heavy documents ("billion
// laughs"); real policies are orders of magnitude smaller.
const maxWalkNodes = 100000

// walker checks a YAML node tree against the Go types before decoding, so
// that unknown keys and type mismatches are reported with their full field
// path, line number and a suggestion, and all of them at once.
type walker struct {
	problems []Problem
	budget   int
	// covered are paths whose value was not decoded (a type mismatch), so
	// what the rules would say about them or below them repeats a problem.
	covered []string
	// bad are the paths of values of the wrong type; a rule about the
	// mapping holding one (endpoint "no port") most likely complains about
	// it.
	bad []string
	// partial maps the path of a mapping with an unknown key to the keys
	// it has: a rule complaining that one of its fields is missing most
	// likely complains about the misspelt one.
	partial map[string]map[string]bool
}

// explains reports whether a problem found by the rules after decoding
// follows from one the walker already reported.
func (w *walker) explains(pr Problem) bool {
	for _, c := range w.covered {
		c = displayPath(c)
		if pr.Path == c || strings.HasPrefix(pr.Path, c+".") || strings.HasPrefix(pr.Path, c+"[") {
			return true
		}
	}
	for _, b := range w.bad {
		if i := strings.LastIndexAny(b, ".["); i > 0 && pr.Path == b[:i] {
			return true
		}
	}
	for parent, present := range w.partial {
		if pr.Path == displayPath(parent) {
			return true
		}
		rest := pr.Path
		if parent != "" {
			var ok bool
			if rest, ok = strings.CutPrefix(pr.Path, parent+"."); !ok {
				continue
			}
		}
		if key, _, _ := strings.Cut(rest, "."); !present[strings.TrimRight(key, "[0123456789]")] {
			return true
		}
	}
	return false
}

func (w *walker) add(path, msg, fix string) {
	w.problems = append(w.problems, Problem{Path: displayPath(path), Message: msg, Fix: fix})
}

// displayPath names the document root for problems found there.
func displayPath(path string) string {
	if path == "" {
		return "policy"
	}
	return path
}

// spend charges one node against the budget and reports exhaustion once.
func (w *walker) spend(path string) bool {
	if w.budget <= 0 {
		return false
	}
	w.budget--
	if w.budget == 0 {
		w.add(path, "the document expands to too many nodes (aliases nested too deeply)", "write the policy without nested anchors and aliases")
		return false
	}
	return true
}

var unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()

func (w *walker) resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

func (w *walker) walk(n *yaml.Node, t reflect.Type, path string) {
	if !w.spend(path) {
		return
	}
	n = w.resolve(n)
	if n == nil {
		return
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == nullTag {
		return // null means "unset" for every field
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		return // the type checks its own YAML when it is decoded
	}
	switch t.Kind() {
	case reflect.Struct:
		if !w.expect(n, yaml.MappingNode, path) {
			return
		}
		fields := structFields(t)
		seen := keySet{}
		present, unknown := map[string]bool{}, false
		w.mapping(n, path, false, func(key string, k, v *yaml.Node, merged bool) {
			present[key] = true
			f, ok := fields.byName[key]
			if !ok {
				unknown = true
				w.add(joinPath(path, key), fmt.Sprintf("unknown field (line %d)", k.Line), unknownFix(key, fields.names))
				return
			}
			if w.duplicate(seen, path, key, k, merged, "field") {
				return
			}
			w.walk(v, f.Type, joinPath(path, key))
		})
		if unknown {
			if w.partial == nil {
				w.partial = map[string]map[string]bool{}
			}
			w.partial[path] = present
		}
	case reflect.Map:
		if !w.expect(n, yaml.MappingNode, path) {
			return
		}
		seen := keySet{}
		w.mapping(n, path, false, func(key string, k, v *yaml.Node, merged bool) {
			if w.duplicate(seen, path, key, k, merged, "key") {
				return
			}
			w.walk(v, t.Elem(), joinPath(path, key))
		})
	case reflect.Slice:
		if !w.expect(n, yaml.SequenceNode, path) {
			return
		}
		for i, item := range n.Content {
			w.walk(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i))
		}
	case reflect.Interface:
		w.walkAny(n, path)
	case reflect.String:
		w.expect(n, yaml.ScalarNode, path)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != intTag {
			w.mismatch(n, path, "an integer", "write a whole number without quotes, e.g. 256", yaml.Node{Kind: yaml.ScalarNode, Tag: intTag, Value: "0"})
		}
	case reflect.Float32, reflect.Float64:
		if n.Kind != yaml.ScalarNode || (n.ShortTag() != intTag && n.ShortTag() != floatTag) {
			w.mismatch(n, path, "a number", "write a number without quotes, e.g. 1.5", yaml.Node{Kind: yaml.ScalarNode, Tag: floatTag, Value: "0"})
		}
	case reflect.Bool:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != boolTag {
			w.mismatch(n, path, "true or false", "write true or false without quotes", yaml.Node{Kind: yaml.ScalarNode, Tag: boolTag, Value: "false"})
		}
	}
}

// keySet remembers the keys of one mapping: their line and whether they
// came from a merge ("<<"), which explicit keys may legitimately override.
type keySet map[string]keySeen

type keySeen struct {
	line   int
	merged bool
}

// duplicate records key and reports whether it repeats an explicit key.
func (w *walker) duplicate(seen keySet, path, key string, k *yaml.Node, merged bool, what string) bool {
	prev, ok := seen[key]
	if ok && !prev.merged && !merged {
		w.add(joinPath(path, key), fmt.Sprintf("duplicate %s (line %d, first at line %d)", what, k.Line, prev.line), "remove one of the two")
		return true
	}
	if !ok || !merged {
		seen[key] = keySeen{k.Line, merged}
	}
	return false
}

type keyFunc func(key string, k, v *yaml.Node, merged bool)

// mapping calls fn for every key of a mapping node, following merge keys
// ("<<: *anchor") into the merged mappings.
func (w *walker) mapping(n *yaml.Node, path string, merged bool, fn keyFunc) {
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := w.resolve(n.Content[i]), n.Content[i+1]
		if k == nil {
			continue
		}
		if k.Kind != yaml.ScalarNode {
			w.add(path, fmt.Sprintf("line %d: a key is %s", k.Line, describeNode(k)), "use plain text keys")
			continue
		}
		if k.ShortTag() == mergeTag {
			w.merge(v, path, fn)
			continue
		}
		fn(k.Value, k, v, merged)
	}
}

func (w *walker) merge(v *yaml.Node, path string, fn keyFunc) {
	if !w.spend(path) {
		return
	}
	v = w.resolve(v)
	switch {
	case v == nil:
	case v.Kind == yaml.MappingNode:
		w.mapping(v, path, true, fn)
	case v.Kind == yaml.SequenceNode:
		for _, item := range v.Content {
			w.merge(item, path, fn)
		}
	default:
		w.add(path, fmt.Sprintf("line %d: \"<<\" merges %s", v.Line, describeNode(v)), "merge a mapping, e.g. <<: *anchor")
	}
}

// walkAny checks free-form values (L7 query matchers). Their keys must be
// strings and floats finite so that the decoded policy can always be
// encoded as JSON for hashing.
func (w *walker) walkAny(n *yaml.Node, path string) {
	if !w.spend(path) {
		return
	}
	n = w.resolve(n)
	if n == nil {
		return
	}
	switch n.Kind {
	case yaml.MappingNode:
		w.mapping(n, path, false, func(key string, k, v *yaml.Node, _ bool) {
			if k.ShortTag() != strTag {
				w.add(joinPath(path, key), fmt.Sprintf("key %s is not a string (line %d)", describeNode(k), k.Line), "quote the key")
				w.covered = append(w.covered, path)
				return
			}
			w.walkAny(v, joinPath(path, key))
		})
	case yaml.SequenceNode:
		for i, item := range n.Content {
			w.walkAny(item, fmt.Sprintf("%s[%d]", path, i))
		}
	case yaml.ScalarNode:
		if n.ShortTag() == floatTag {
			f, err := strconv.ParseFloat(strings.TrimPrefix(n.Value, "+"), 64)
			if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
				w.add(path, fmt.Sprintf("%s is not a finite number (line %d)", strconv.Quote(n.Value), n.Line), "quote it to use it as text")
				w.covered = append(w.covered, path)
			}
		}
	}
}

func (w *walker) expect(n *yaml.Node, kind yaml.Kind, path string) bool {
	if n.Kind == kind {
		return true
	}
	switch kind {
	case yaml.MappingNode:
		w.mismatch(n, path, "a mapping", "write it as indented \"key: value\" lines", yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"})
	case yaml.SequenceNode:
		w.mismatch(n, path, "a list", "write it as [a, b] or as one \"- item\" line per entry", yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"})
	default:
		w.mismatch(n, path, "a single value", "write one value; quote it if it contains special characters", yaml.Node{Kind: yaml.ScalarNode, Tag: strTag})
	}
	return false
}

// mismatch reports n and replaces it with zero, the zero value of the type
// expected: left in place (or made null), the decoder would drop a bad list
// element and shift the later ones, and the rules would then report those
// at the wrong index.
func (w *walker) mismatch(n *yaml.Node, path, want, fix string, zero yaml.Node) {
	w.add(path, fmt.Sprintf("expected %s, got %s (line %d)", want, describeNode(n), n.Line), fix)
	w.covered = append(w.covered, path)
	w.bad = append(w.bad, path)
	zero.Line, zero.Column = n.Line, n.Column
	*n = zero
}

func describeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.ScalarNode:
		v := n.Value
		if len(v) > 40 {
			v = v[:40] + "..."
		}
		switch n.ShortTag() {
		case strTag:
			return "string " + strconv.Quote(v)
		case intTag, floatTag:
			return "number " + v
		case boolTag:
			return "boolean " + v
		case nullTag:
			return "null"
		default:
			return fmt.Sprintf("%s %s", n.ShortTag(), strconv.Quote(v))
		}
	}
	return "nothing"
}

var plainKey = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// joinPath appends a key to a dotted path; keys that would make the path
// ambiguous (dots, spaces) are quoted in brackets.
func joinPath(path, key string) string {
	if !plainKey.MatchString(key) {
		return fmt.Sprintf("%s[%s]", path, strconv.Quote(key))
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

type fieldSet struct {
	byName map[string]reflect.StructField
	names  []string // in declaration order, for suggestions and listings
}

func structFields(t reflect.Type) fieldSet {
	fs := fieldSet{byName: map[string]reflect.StructField{}}
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		fs.byName[name] = f
		fs.names = append(fs.names, name)
	}
	return fs
}

func unknownFix(key string, known []string) string {
	if s := suggest(key, known); s != "" {
		return fmt.Sprintf("did you mean %q?", s)
	}
	return "remove it; fields allowed here: " + strings.Join(known, ", ")
}

// suggest returns the known key the user most likely meant: the closest by
// edit distance (at most 2), else the one sharing the longest prefix (at
// least 5 characters, or all of the shorter key). Ties go to the key
// declared first.
func suggest(key string, known []string) string {
	lk := strings.ToLower(key)
	best, bestDist := "", 3
	for _, k := range known {
		if d := editDistance(lk, k); d < bestDist {
			best, bestDist = k, d
		}
	}
	if best != "" {
		return best
	}
	bestPrefix := 0
	for _, k := range known {
		n := commonPrefix(lk, k)
		if n > bestPrefix && (n >= 5 || n == min(len(lk), len(k))) && n >= 3 {
			best, bestPrefix = k, n
		}
	}
	return best
}

func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// editDistance is the Levenshtein distance over bytes; keys are ASCII.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
