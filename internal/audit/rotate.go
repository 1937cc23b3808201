package audit

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"time"
)

// rotator appends to path and, before a write would take it past max
// bytes, renames it to path.1 (path.1 to path.2, … keeping keep files) and
// starts a new one. Only the sink's writer goroutine calls it.
//
// Several corral runs may append to one file. A run that finds path is no
// longer the file it holds (another run rotated it) reopens it instead of
// rotating again, and the size it compares is the file's, not its own count.
type rotator struct {
	path    string
	max     int64
	keep    int
	f       *os.File
	size    int64
	retryAt time.Time // after a failed reopen, when to try again
}

func openRotator(path string, max int64, keep int) (*rotator, error) {
	r := &rotator{path: path, max: max, keep: keep}
	if err := r.open(); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *rotator) open() error {
	f, err := os.OpenFile(r.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("open audit log %s: %w", r.path, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("stat audit log %s: %w", r.path, err)
	}
	r.f, r.size = f, st.Size()
	return nil
}

func (r *rotator) Write(p []byte) (int, error) {
	if r.f == nil {
		if time.Now().Before(r.retryAt) {
			return 0, fmt.Errorf("audit log %s is not open", r.path)
		}
		if err := r.open(); err != nil {
			r.retryAt = time.Now().Add(time.Second)
			return 0, err
		}
	}
	if r.size > 0 && r.size+int64(len(p)) > r.max {
		if err := r.rotate(int64(len(p))); err != nil {
			return 0, err
		}
	}
	n, err := r.f.Write(p)
	r.size += int64(n)
	if err != nil {
		return n, fmt.Errorf("write audit log %s: %w", r.path, err)
	}
	return n, nil
}

func (r *rotator) rotate(next int64) error {
	held, herr := r.f.Stat()
	cur, cerr := os.Stat(r.path)
	if herr == nil && cerr == nil {
		if !os.SameFile(held, cur) {
			r.f.Close()
			r.f = nil
			return r.reopen()
		}
		if cur.Size()+next <= r.max {
			r.size = cur.Size()
			return nil
		}
	}
	r.f.Close()
	r.f = nil
	for i := r.keep; i > 1; i-- {
		if err := os.Rename(r.name(i-1), r.name(i)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return r.fail(fmt.Errorf("rotate audit log: %w", err))
		}
	}
	if err := os.Rename(r.path, r.name(1)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return r.fail(fmt.Errorf("rotate audit log: %w", err))
	}
	return r.reopen()
}

func (r *rotator) reopen() error {
	if err := r.open(); err != nil {
		return r.fail(err)
	}
	return nil
}

// fail leaves the file closed; writes retry opening it a second later.
func (r *rotator) fail(err error) error {
	if r.f == nil {
		r.retryAt = time.Now().Add(time.Second)
	}
	return err
}

func (r *rotator) name(i int) string { return r.path + "." + strconv.Itoa(i) }

func (r *rotator) Close() error {
	if r.f == nil {
		return nil
	}
	err := r.f.Close()
	r.f = nil
	return err
}
