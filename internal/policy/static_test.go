package policy

import (
	"slices"
	"testing"
)

func TestStaticDiff(t *testing.T) {
	base := "version: 1\nnetwork: {allow: [\"a.example.com:443\"]}\nlimits: {pids: 10}\n"
	cases := []struct {
		name, next string
		want       []string
	}{
		{"network policies may change", "version: 1\nnetwork: {allow: [\"b.example.com:443\"]}\nlimits: {pids: 10}\n", nil},
		{"limits may not", "version: 1\nnetwork: {allow: [\"a.example.com:443\"]}\nlimits: {pids: 11}\n", []string{"limits"}},
		{"mode may not", "version: 1\nlimits: {pids: 10}\n", []string{"network.mode"}},
		{"filesystem and seccomp may not", "version: 1\nnetwork: {allow: [\"a.example.com:443\"]}\nlimits: {pids: 10}\nseccomp: relaxed\nfilesystem_policy: {read_only: [/usr]}\n",
			[]string{"filesystem_policy", "seccomp"}},
	}
	p, err := Parse([]byte(base), "base")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			q, err := Parse([]byte(tc.next), "next")
			if err != nil {
				t.Fatal(err)
			}
			if got := p.StaticDiff(q); !slices.Equal(got, tc.want) {
				t.Fatalf("StaticDiff = %v, want %v", got, tc.want)
			}
		})
	}
}
