package gitsrc

import (
	"bytes"
	"fmt"
	"strings"
)

// diffContext is the number of unchanged lines around each change, as
// git and diff -u use.
const diffContext = 3

// maxDiffCells bounds the LCS table; policies are a few hundred lines.
const maxDiffCells = 1 << 24

// UnifiedDiff returns a git-style unified diff that turns a into b in the
// file at path (from the repository's top directory), ready for `git
// apply`; an empty a is a new file. Equal inputs give "".
func UnifiedDiff(path string, a, b []byte) (string, error) {
	if bytes.Equal(a, b) {
		return "", nil
	}
	al, bl := splitLines(a), splitLines(b)
	if len(al)*len(bl) > maxDiffCells {
		return "", fmt.Errorf("diff %s: files too large (%d and %d lines)", path, len(al), len(bl))
	}
	var out strings.Builder
	fmt.Fprintf(&out, "diff --git a/%s b/%s\n", path, path)
	if len(a) == 0 {
		fmt.Fprintf(&out, "new file mode 100644\n--- /dev/null\n+++ b/%s\n", path)
	} else {
		fmt.Fprintf(&out, "--- a/%s\n+++ b/%s\n", path, path)
	}
	ops := editScript(al, bl)
	for _, h := range hunks(ops) {
		writeHunk(&out, ops[h[0]:h[1]])
	}
	return out.String(), nil
}

// splitLines splits after each newline; a last line without one keeps
// its lack of one, which the diff must show.
func splitLines(data []byte) []string {
	var lines []string
	for l := range strings.Lines(string(data)) {
		lines = append(lines, l)
	}
	return lines
}

type op struct {
	kind byte // ' ', '-' or '+'
	line string
	// aLine and bLine are the 1-based numbers of the line in a and b
	// that this op is at (for '+' aLine is the line before it, and so on).
	aLine, bLine int
}

// editScript is a shortest edit script by longest common subsequence.
func editScript(a, b []string) []op {
	n, m := len(a), len(b)
	// lcs[i][j] is the LCS length of a[i:] and b[j:].
	lcs := make([][]int, n+1)
	for i := range lcs {
		lcs[i] = make([]int, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var ops []op
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && a[i] == b[j]:
			ops = append(ops, op{' ', a[i], i + 1, j + 1})
			i, j = i+1, j+1
		case i < n && (j == m || lcs[i+1][j] >= lcs[i][j+1]):
			// Deletions first, as diff and git print a change.
			ops = append(ops, op{'-', a[i], i + 1, j})
			i++
		default:
			ops = append(ops, op{'+', b[j], i, j + 1})
			j++
		}
	}
	return ops
}

// hunks returns the [start, end) ranges of ops to print: each change with
// up to diffContext unchanged lines either side, joining changes whose
// context would touch.
func hunks(ops []op) [][2]int {
	var out [][2]int
	for i := 0; i < len(ops); i++ {
		if ops[i].kind == ' ' {
			continue
		}
		start := max(i-diffContext, 0)
		end := i
		for end < len(ops) {
			if ops[end].kind != ' ' {
				end++
				continue
			}
			run := end
			for run < len(ops) && ops[run].kind == ' ' {
				run++
			}
			if run == len(ops) || run-end > 2*diffContext {
				end = min(end+diffContext, len(ops))
				break
			}
			end = run
		}
		out = append(out, [2]int{start, end})
		i = end - 1
	}
	return out
}

func writeHunk(out *strings.Builder, ops []op) {
	var aStart, bStart, aCount, bCount int
	for _, o := range ops {
		if o.kind != '+' {
			if aCount == 0 {
				aStart = o.aLine
			}
			aCount++
		}
		if o.kind != '-' {
			if bCount == 0 {
				bStart = o.bLine
			}
			bCount++
		}
	}
	// An empty side is numbered by the line before it.
	if aCount == 0 {
		aStart = ops[0].aLine
	}
	if bCount == 0 {
		bStart = ops[0].bLine
	}
	fmt.Fprintf(out, "@@ -%s +%s @@\n", hunkRange(aStart, aCount), hunkRange(bStart, bCount))
	for _, o := range ops {
		out.WriteByte(o.kind)
		out.WriteString(o.line)
		if !strings.HasSuffix(o.line, "\n") {
			out.WriteString("\n\\ No newline at end of file\n")
		}
	}
}

func hunkRange(start, count int) string {
	if count == 1 {
		return fmt.Sprint(start)
	}
	return fmt.Sprintf("%d,%d", start, count)
}
