//go:build linux

package procident

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/egress"
)

// maxScriptHash bounds the size of a command-line file that is hashed. A
// script is small; a large argument is most likely data (`python3 train.py
// weights.bin`), and hashing gigabytes on every change would stall
// connections. Executables are always hashed.
const maxScriptHash = 64 << 20

// fingerprint identifies a file's content cheaply. ctime cannot be set from
// user space, so a rewrite that restores mtime is still noticed.
type fingerprint struct {
	dev, ino     uint64
	size         int64
	mtime, ctime unix.Timespec
}

type trustEntry struct {
	fp  fingerprint
	sum string // hex SHA-256 first seen at this path
}

// verify returns the hex SHA-256 of a file, recorded as the content of
// path (the path the sandbox sees). The first hash seen for a path is
// trusted; later the file is re-hashed only when its fingerprint changes,
// and a different hash is an *egress.IntegrityError. With optional set, a
// file too large to hash is reported with an empty hash instead of being
// read.
//
// st is the stat of a descriptor the caller holds, and open gives that
// same file for reading (the caller closes it), called only when the
// content must be hashed: the file hashed is the file fingerprinted even
// if the path is swapped, and a known file costs no open.
func (r *Resolver) verify(path string, st *unix.Stat_t, open func() (*os.File, error), optional bool) (string, error) {
	fp := fingerprint{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim}
	r.trustMu.Lock()
	e, seen := r.trusted[path]
	r.trustMu.Unlock()
	if seen && e.fp == fp {
		return e.sum, nil
	}
	if optional && st.Size > maxScriptHash {
		return "", nil
	}
	// Hash outside the lock: a large binary takes a while, and other
	// connections should not wait for it.
	f, err := open()
	if err != nil {
		return "", fmt.Errorf("procident: open %s: %w", path, err)
	}
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, 1<<62)); err != nil {
		return "", fmt.Errorf("procident: hash %s: %w", path, err)
	}
	r.hashes.Add(1)
	sum := hex.EncodeToString(h.Sum(nil))

	r.trustMu.Lock()
	defer r.trustMu.Unlock()
	if r.trusted == nil {
		r.trusted = map[string]trustEntry{}
	}
	if e, seen := r.trusted[path]; seen && e.sum != sum {
		// The trusted hash is kept: restoring the original file restores
		// access, and a second change cannot launder the first.
		return "", &egress.IntegrityError{Path: path, Want: e.sum, Got: sum}
	}
	r.trusted[path] = trustEntry{fp: fp, sum: sum}
	return sum, nil
}
