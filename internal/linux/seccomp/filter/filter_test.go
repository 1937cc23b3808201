//go:build linux

package filter

import (
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestEncodeRoundTrip(t *testing.T) {
	prog := []unix.SockFilter{
		{Code: 0x20, K: 4},
		{Code: 0x15, Jt: 1, Jf: 0, K: 0xc000003e},
		{Code: 0x06, K: 0x7fff0000},
	}
	got, err := decode(Encode(prog))
	if err != nil || !slices.Equal(got, prog) {
		t.Fatalf("decode(Encode(p)) = %v, %v; want %v", got, err, prog)
	}
}

// A program that is not whole instructions, or none, or more than the
// kernel takes, is refused before anything reaches seccomp(2).
func TestInstallRefusesMalformedPrograms(t *testing.T) {
	for _, b := range [][]byte{nil, make([]byte, 7), make([]byte, 12), make([]byte, 8*(MaxInsns+1))} {
		if _, err := Install(b, false); err == nil || !strings.Contains(err.Error(), "instructions") {
			t.Errorf("Install(%d bytes) = %v, want a malformed-program error", len(b), err)
		}
	}
}
