// Package termsafe renders text that someone else wrote (a sandboxed
// workload, a joining supervisor, anything relayed from them) so that a
// terminal shows it instead of acting on it. A file name, an agent's
// intent or a sandbox label can carry ESC sequences that clear the screen,
// move the cursor over lines already printed, retitle the window or write
// the clipboard (OSC 52); C1 controls do the same on terminals that honour
// them, and bidi overrides reorder what is read. Printed through this
// package they appear as the escapes Go's strconv quoting writes (\x1b,
// \u009b, \u202e, \xff for a byte that is not UTF-8), while text with
// nothing to escape (paths, host names, letters of any script) is returned
// as it is.
//
// Backslashes are not doubled: the point is a screen that cannot be
// rewritten, not a form to parse back, and doubling would garble every
// ordinary backslash. Exact values are what the commands' --json output is
// for.
package termsafe

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Line renders s for one line or one table cell: a newline, carriage
// return or tab in it is escaped too, so it can neither start a line that
// looks like the program's own nor shift the columns after it.
func Line(s string) string { return render(s, false) }

// Text renders s keeping its newlines, for text that is meant to span
// lines (YAML, an error listing problems one a line). Everything else
// Line escapes, Text escapes too.
func Text(s string) string { return render(s, true) }

func render(s string, keepNewline bool) string {
	var b strings.Builder
	plain := 0 // where the runes not yet copied to b start
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		// strconv.IsPrint is what strconv.Quote leaves as it is: letters,
		// marks, numbers, punctuation, symbols and the ASCII space. It is
		// false for controls, format characters (bidi, zero width), other
		// spaces and line separators: what a terminal may act on or a
		// reader cannot see. A byte that is not UTF-8 decodes to RuneError
		// with n == 1; a real U+FFFD has n == 3 and is shown.
		if (r != utf8.RuneError || n > 1) && strconv.IsPrint(r) || keepNewline && r == '\n' {
			i += n
			continue
		}
		b.WriteString(s[plain:i])
		q := strconv.Quote(s[i : i+n])
		b.WriteString(q[1 : len(q)-1])
		i += n
		plain = i
	}
	if b.Len() == 0 { // every escape writes at least two bytes
		return s
	}
	b.WriteString(s[plain:])
	return b.String()
}
