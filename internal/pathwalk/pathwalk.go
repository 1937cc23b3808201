// Package pathwalk resolves symlinks in a path one component at a time,
// the way the kernel does, over a filesystem the caller describes. corral
// needs this where the kernel's own resolution is wrong for it: inside
// another process's root, and on the host where some links must be refused.
package pathwalk

import (
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// MaxLinks is the kernel's own limit on links followed in one resolution.
const MaxLinks = 40

// FS answers the two questions a walk asks about a path.
type FS interface {
	// IsLink reports whether p is a symlink, without following it.
	IsLink(p string) (bool, error)
	Readlink(p string) (string, error)
}

// Resolve returns the canonical form of the absolute path p. Absolute link
// targets restart at "/" and ".." never climbs above it. follow, if not
// nil, is asked before each link is followed and may refuse it.
func Resolve(fs FS, p string, follow func(link, target string) error) (string, error) {
	todo := strings.Split(p, "/")
	cur, links := "/", 0
	for len(todo) > 0 {
		name := todo[0]
		todo = todo[1:]
		switch name {
		case "", ".":
			continue
		case "..":
			cur = path.Dir(cur)
			continue
		}
		next := path.Join(cur, name)
		isLink, err := fs.IsLink(next)
		if err != nil {
			return "", err
		}
		if !isLink {
			cur = next
			continue
		}
		target, err := fs.Readlink(next)
		if err != nil {
			return "", err
		}
		if follow != nil {
			if err := follow(next, target); err != nil {
				return "", err
			}
		}
		if links++; links > MaxLinks {
			return "", unix.ELOOP
		}
		if path.IsAbs(target) {
			cur = "/"
		}
		todo = append(strings.Split(target, "/"), todo...)
	}
	return cur, nil
}
