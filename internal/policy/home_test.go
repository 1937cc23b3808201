package policy

import (
	"slices"
	"strconv"
	"testing"
)

func TestHomeEntries(t *testing.T) {
	tests := []struct {
		entry string
		want  string // the problem, or "" when the entry is valid
	}{
		{".gitconfig", ""},
		{".config/gh", ""},
		{"", `filesystem_policy.home[0]: empty path — give a path relative to your home such as .gitconfig, or remove the entry`},
		{"/root/.gitconfig", `filesystem_policy.home[0]: path "/root/.gitconfig" is absolute — write it relative to your home (e.g. .gitconfig), or list an absolute path in read_only`},
		{"~/.npmrc", `filesystem_policy.home[0]: path "~/.npmrc" starts with ~ — entries are relative to your home already: write ".npmrc"`},
		{"../other/.ssh", `filesystem_policy.home[0]: path "../other/.ssh" contains a ".." component — name a file or directory below your home; list other paths in read_only`},
		{".config/../.ssh", `filesystem_policy.home[0]: path ".config/../.ssh" contains a ".." component — name a file or directory below your home; list other paths in read_only`},
		{".", `filesystem_policy.home[0]: the whole home directory cannot be listed — list the files and directories the agent needs, e.g. .gitconfig`},
		{"./", `filesystem_policy.home[0]: the whole home directory cannot be listed — list the files and directories the agent needs, e.g. .gitconfig`},
		{".config//gh", `filesystem_policy.home[0]: path ".config//gh" is not in clean form — write it as ".config/gh"`},
	}
	for _, tc := range tests {
		t.Run(tc.entry, func(t *testing.T) {
			got := problems(t, "version: 1\nfilesystem_policy:\n  home: ["+strconv.Quote(tc.entry)+"]\n")
			var want []string
			if tc.want != "" {
				want = []string{tc.want}
			}
			if !slices.Equal(got, want) {
				t.Errorf("problems = %q\nwant       %q", got, want)
			}
		})
	}
}
