package gitsrc

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/corral-sandbox/corral/internal/policy"
)

// Chunk is one approved addition to network_policies.
type Chunk struct {
	Name   string
	Policy policy.NetworkPolicy
	// Note is written as a comment above the entry, for the reviewer.
	Note string
}

// AddNetworkPolicies returns the policy file base with chunks added
// under its top-level network_policies, leaving every other byte as it
// was so that the change reviews as a plain addition. An empty base is
// the built-in default: the result is a new file holding only what the
// chunks add. The result is parsed back and must be exactly base's policy
// plus the chunks, else it is an error.
func AddNetworkPolicies(base []byte, chunks []Chunk) ([]byte, error) {
	if len(chunks) == 0 {
		return nil, errors.New("no approved chunks to add")
	}
	chunks = slices.Clone(chunks)
	slices.SortFunc(chunks, func(a, b Chunk) int { return strings.Compare(a.Name, b.Name) })
	var out []byte
	if len(bytes.TrimSpace(base)) == 0 {
		entries, err := render(chunks, "  ")
		if err != nil {
			return nil, err
		}
		out = append([]byte("version: 1\nnetwork_policies:\n"), entries...)
	} else {
		var err error
		if out, err = insert(base, chunks); err != nil {
			return nil, err
		}
	}
	if err := checkAddition(base, out, chunks); err != nil {
		return nil, err
	}
	return out, nil
}

func insert(base []byte, chunks []Chunk) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(base, &doc); err != nil {
		return nil, fmt.Errorf("the policy file is not valid YAML: %w", err)
	}
	if len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, errors.New("the policy file is not a YAML mapping")
	}
	root := doc.Content[0]
	lines := splitLines(base)
	if n := len(lines); !strings.HasSuffix(lines[n-1], "\n") {
		lines[n-1] += "\n"
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		key, val := root.Content[i], root.Content[i+1]
		if key.Value != "network_policies" {
			continue
		}
		switch {
		case val.Kind == yaml.ScalarNode && val.Tag == "!!null":
			// "network_policies:" with nothing, "~" or "null": the entries
			// go right under the key, replacing any null written after it.
			at := key.Line - 1
			line := lines[at]
			if val.Value != "" && val.Line == key.Line {
				line = strings.TrimRight(line[:val.Column-1], " \t") + "\n"
			}
			entries, err := render(chunks, "  ")
			if err != nil {
				return nil, err
			}
			return join(lines[:at], line, entries, lines[at+1:]), nil
		case val.Kind == yaml.MappingNode && val.Style&yaml.FlowStyle != 0 && len(val.Content) == 0 && val.Line == key.Line:
			line := strings.TrimRight(lines[key.Line-1][:val.Column-1], " \t") + "\n"
			entries, err := render(chunks, "  ")
			if err != nil {
				return nil, err
			}
			return join(lines[:key.Line-1], line, entries, lines[key.Line:]), nil
		case val.Kind == yaml.MappingNode && val.Style&yaml.FlowStyle == 0 && len(val.Content) > 0:
			for j := 0; j < len(val.Content); j += 2 {
				name := val.Content[j].Value
				if slices.ContainsFunc(chunks, func(c Chunk) bool { return c.Name == name }) {
					return nil, fmt.Errorf("network_policies already has %q (line %d); the file is not the one the chunks were proposed against", name, val.Content[j].Line)
				}
			}
			indent := strings.Repeat(" ", val.Content[0].Column-1)
			entries, err := render(chunks, indent)
			if err != nil {
				return nil, err
			}
			at := endOfSection(lines, root, i)
			return join(lines[:at], "", entries, lines[at:]), nil
		default:
			return nil, fmt.Errorf("network_policies (line %d) is not written as a block mapping (one key per line); rewrite it so and export again", key.Line)
		}
	}
	entries, err := render(chunks, "  ")
	if err != nil {
		return nil, err
	}
	return join(lines, "network_policies:\n", entries, nil), nil
}

// endOfSection returns the index of the line after the last line of the
// top-level section whose key is root.Content[i]: the next top-level
// key's line, less the blank lines and top-level comments before it
// (they belong to that key), or the end of the file.
func endOfSection(lines []string, root *yaml.Node, i int) int {
	at := len(lines)
	if i+2 < len(root.Content) {
		at = root.Content[i+2].Line - 1
	}
	for at > 0 {
		l := lines[at-1]
		if strings.TrimSpace(l) != "" && !strings.HasPrefix(l, "#") {
			break
		}
		at--
	}
	return at
}

func join(before []string, mid, entries string, after []string) []byte {
	var b strings.Builder
	for _, l := range before {
		b.WriteString(l)
	}
	b.WriteString(mid)
	b.WriteString(entries)
	for _, l := range after {
		b.WriteString(l)
	}
	return []byte(b.String())
}

// render writes chunks as network_policies entries at indent.
func render(chunks []Chunk, indent string) (string, error) {
	var b strings.Builder
	for _, c := range chunks {
		var buf bytes.Buffer
		enc := yaml.NewEncoder(&buf)
		enc.SetIndent(2)
		if err := enc.Encode(map[string]policy.NetworkPolicy{c.Name: c.Policy}); err != nil {
			return "", fmt.Errorf("chunk %s: %w", c.Name, err)
		}
		if err := enc.Close(); err != nil {
			return "", fmt.Errorf("chunk %s: %w", c.Name, err)
		}
		for line := range strings.Lines(c.Note) {
			b.WriteString(indent + "# " + strings.TrimRight(line, "\n") + "\n")
		}
		for line := range strings.Lines(buf.String()) {
			b.WriteString(indent + line)
		}
	}
	return b.String(), nil
}

// checkAddition fails unless after parses to base's policy with exactly
// the chunks added, so that a file laid out in a way insert misreads
// never yields a diff that means something else.
func checkAddition(base, after []byte, chunks []Chunk) error {
	want := policy.Default()
	if len(bytes.TrimSpace(base)) > 0 {
		var err error
		if want, err = policy.Parse(base, "base"); err != nil {
			return fmt.Errorf("the policy the chunks are added to does not load: %w", err)
		}
	}
	if want.NetworkPolicies == nil {
		want.NetworkPolicies = map[string]policy.NetworkPolicy{}
	}
	for _, c := range chunks {
		want.NetworkPolicies[c.Name] = c.Policy
	}
	want.ApplyDefaults()
	got, err := policy.Parse(after, "export")
	if err != nil {
		return fmt.Errorf("the policy with the chunks added does not load: %w", err)
	}
	if got.SHA256() != want.SHA256() {
		return errors.New("the policy with the chunks added is not the policy plus the chunks (the file's layout was misread); add them by hand from corral draft show")
	}
	return nil
}
