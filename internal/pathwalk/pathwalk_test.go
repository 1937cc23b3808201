package pathwalk

import (
	"errors"
	"io/fs"
	"testing"

	"golang.org/x/sys/unix"
)

// links is a filesystem of directories and the listed symlinks.
type links map[string]string

func (l links) IsLink(p string) (bool, error) {
	if p == "/missing" {
		return false, fs.ErrNotExist
	}
	_, ok := l[p]
	return ok, nil
}

func (l links) Readlink(p string) (string, error) { return l[p], nil }

func TestResolve(t *testing.T) {
	fsys := links{"/lib": "usr/lib", "/abs": "/etc/x", "/up": "../../etc", "/a": "/b", "/b": "/a"}
	for _, tc := range []struct{ in, want string }{
		{"/lib/x.so", "/usr/lib/x.so"},
		{"/abs", "/etc/x"},
		{"/usr/./bin/../lib", "/usr/lib"},
		{"/up/passwd", "/etc/passwd"}, // ".." cannot climb above the root
	} {
		if got, err := Resolve(fsys, tc.in, nil); err != nil || got != tc.want {
			t.Errorf("Resolve(%s) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	if _, err := Resolve(fsys, "/a", nil); !errors.Is(err, unix.ELOOP) {
		t.Errorf("link loop: %v, want ELOOP", err)
	}
	if _, err := Resolve(fsys, "/missing/x", nil); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing component: %v", err)
	}
	refused := errors.New("refused")
	if _, err := Resolve(fsys, "/lib/x", func(link, target string) error {
		if link == "/lib" && target == "usr/lib" {
			return refused
		}
		return nil
	}); !errors.Is(err, refused) {
		t.Errorf("follow refusal: %v", err)
	}
}
