// Package drafts keeps a sandbox's proposed policy chunks and their
// lifecycle: pending → approved | rejected | superseded | expired (and an
// approved chunk may be undone). It enforces the limits that keep a
// workload from flooding a person with proposals: at most MaxPending
// pending chunks, pending chunks expire, and after two rejections of the
// same host and port nothing more is proposed for it until Retry. Every
// transition is recorded with its time, actor and reason; the drafts
// corral ended on its own are dropped with theirs after a while.
//
// FileStore keeps everything in one JSON file under the sandbox's state
// directory, written atomically and locked with flock, so the supervisor
// and the `corral draft` command can both use it; the Store interface lets
// the gateway keep drafts in its database instead.
package drafts

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/corral-sandbox/corral/internal/advisor/check"
	"github.com/corral-sandbox/corral/internal/advisor/propose"
	"golang.org/x/sys/unix"
)

// State is where a draft is in its lifecycle.
type State string

// States.
const (
	Pending    State = "pending"
	Approved   State = "approved"
	Rejected   State = "rejected"
	Superseded State = "superseded"
	Expired    State = "expired"
	// Undone is an approved draft whose approval was reverted.
	Undone State = "undone"
)

// Defaults for Options' zero values.
const (
	DefaultTTL        = time.Hour
	DefaultMaxPending = 10
	// MaxRejections of one host and port stop further proposals for it.
	MaxRejections = 2
	// DefaultPoll is how often Wait rereads the file for changes made by
	// another process.
	DefaultPoll = 250 * time.Millisecond
	// FinishedRetention and MaxFinished bound the drafts corral ended on
	// its own (expired, or superseded while pending) that are kept for the
	// record: the newest MaxFinished, none older than FinishedRetention.
	// A session used for months would otherwise grow without end the file
	// every start of the advisor, and every waiting agent's poll, reads
	// whole. What a person decided (approved, rejected, undone) is kept.
	FinishedRetention = 7 * 24 * time.Hour
	MaxFinished       = 100
)

// Errors returned by Add and the transitions.
var (
	ErrNotFound       = errors.New("no such draft")
	ErrState          = errors.New("draft is not in a state that allows this")
	ErrTooManyPending = errors.New("too many pending drafts")
	ErrBackoff        = errors.New("rejected twice: no new drafts until retry")
	// ErrDuplicate: the same chunk is already pending or approved; the
	// existing draft is returned with it.
	ErrDuplicate = errors.New("the same chunk is already pending or approved")
	// ErrRejected: the same chunk was rejected and not retried since.
	ErrRejected = errors.New("the same chunk was rejected")
)

// Actor is who made a transition.
type Actor struct {
	UID  int    `json:"uid"`
	User string `json:"user"`
}

// System is the actor of transitions corral makes by itself (expiry,
// supersession, the advisor's proposals).
var System = Actor{UID: -1, User: "corral"}

// Transition is one entry of the history.
type Transition struct {
	At time.Time `json:"at"`
	// Draft is empty for a Retry.
	Draft  string `json:"draft,omitempty"`
	From   State  `json:"from,omitempty"`
	To     State  `json:"to,omitempty"`
	Actor  Actor  `json:"actor"`
	Reason string `json:"reason,omitempty"`
}

// Loaded records the policy version an approved draft went live in.
type Loaded struct {
	Version int       `json:"version"`
	Hash    string    `json:"hash"`
	At      time.Time `json:"at"`
}

// Draft is one stored chunk.
type Draft struct {
	ID      string        `json:"id"`
	Chunk   propose.Chunk `json:"chunk"`
	Check   check.Result  `json:"check"`
	State   State         `json:"state"`
	Created time.Time     `json:"created"`
	Expires time.Time     `json:"expires"`
	// Replaces is the approved draft with the same network_policies key
	// that this one would replace (a refined chunk after an approved
	// initial one); pass its Chunk.Name in check.Options.Replace.
	Replaces     string `json:"replaces,omitempty"`
	SupersededBy string `json:"superseded_by,omitempty"`
	// Guidance is the reviewer's text for the agent, on rejection.
	Guidance string    `json:"guidance,omitempty"`
	Decided  time.Time `json:"decided,omitzero"`
	Loaded   *Loaded   `json:"loaded,omitempty"`
	// History is the draft's transitions, filled in on read.
	History []Transition `json:"-"`
}

// Done reports whether a waiter has its answer: the draft is approved and
// loaded, or will never be (rejected, superseded, expired, undone).
func (d Draft) Done() bool {
	return d.State == Approved && d.Loaded != nil || d.State != Pending && d.State != Approved
}

// Store holds a sandbox's drafts. Implementations are safe for concurrent
// use, from several processes for FileStore.
type Store interface {
	// Add stores a validated chunk as pending, superseding pending drafts
	// with the same network_policies key.
	Add(c propose.Chunk, res check.Result, by Actor) (Draft, error)
	Get(id string) (Draft, error)
	// List returns every draft, newest first.
	List() ([]Draft, error)
	// Approve marks a pending draft approved, superseding the approved
	// draft it replaces. Reload the policy first: a failed reload leaves
	// the draft pending. Then call MarkLoaded.
	Approve(id string, by Actor, reason string) (Draft, error)
	// MarkLoaded records the policy version an approved draft is in
	// force in; Wait returns after it.
	MarkLoaded(id string, version int, hash string) (Draft, error)
	// Reject marks a pending draft rejected; guidance goes back to the
	// agent waiting on it.
	Reject(id string, by Actor, reason, guidance string) (Draft, error)
	// Undo marks an approved draft undone, once its policy change has
	// been reverted.
	Undo(id string, by Actor, reason string) (Draft, error)
	// Retry lifts the rejection backoff for host and port.
	Retry(host string, port uint16, by Actor) error
	// Expire expires pending drafts past their time (every other call
	// does so too) and returns them.
	Expire() ([]Draft, error)
	// History returns every transition, oldest first.
	History() ([]Transition, error)
	// Wait returns the draft once Done, or ctx's error.
	Wait(ctx context.Context, id string) (Draft, error)
	// Subscribe wakes the caller when drafts change in this process.
	Subscribe() (<-chan struct{}, func())
}

// Options configure a FileStore; zero fields take the defaults.
type Options struct {
	TTL        time.Duration
	MaxPending int
	Poll       time.Duration
	Now        func() time.Time
}

// FileStore is a Store in one JSON file.
type FileStore struct {
	dir  string
	opts Options

	mu   sync.Mutex
	subs map[chan struct{}]struct{}
}

var _ Store = (*FileStore)(nil)

const (
	fileName = "drafts.json"
	lockName = "drafts.lock"
)

// Open returns the store under dir, creating dir (mode 0700) if needed.
func Open(dir string, opts Options) (*FileStore, error) {
	opts.TTL = cmp.Or(opts.TTL, DefaultTTL)
	opts.MaxPending = cmp.Or(opts.MaxPending, DefaultMaxPending)
	opts.Poll = cmp.Or(opts.Poll, DefaultPoll)
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open drafts %s: %w", dir, err)
	}
	return &FileStore{dir: dir, opts: opts, subs: map[chan struct{}]struct{}{}}, nil
}

// backoff counts rejections of one host:port.
type backoff struct {
	Rejections int       `json:"rejections"`
	RetriedAt  time.Time `json:"retried_at,omitzero"`
}

// file is the stored document.
type file struct {
	Drafts  []*Draft            `json:"drafts"`
	Backoff map[string]*backoff `json:"backoff"`
	History []Transition        `json:"history"`
	// dirty is set by every change, so that reads write nothing.
	dirty bool
	// expired holds the drafts this update expired.
	expired []Draft
}

func (f *file) record(t Transition) {
	f.History = append(f.History, t)
	f.dirty = true
}

func (f *file) find(id string) *Draft {
	for _, d := range f.Drafts {
		if d.ID == id {
			return d
		}
	}
	return nil
}

func (f *file) move(d *Draft, to State, at time.Time, by Actor, reason string) {
	f.record(Transition{At: at, Draft: d.ID, From: d.State, To: to, Actor: by, Reason: reason})
	d.State = to
	if to != Pending && to != Superseded && to != Expired {
		d.Decided = at
	}
}

func (f *file) expire(now time.Time) []Draft {
	var out []Draft
	for _, d := range f.Drafts {
		if d.State == Pending && !now.Before(d.Expires) {
			f.move(d, Expired, now, System, "not decided within "+d.Expires.Sub(d.Created).String())
			out = append(out, *d)
		}
	}
	return out
}

// prune drops, with their history, the drafts corral ended on its own
// beyond MaxFinished or longer than FinishedRetention ago, oldest first.
func (f *file) prune(now time.Time) {
	ended := map[string]time.Time{}
	for _, t := range f.History {
		if t.Draft != "" {
			ended[t.Draft] = t.At
		}
	}
	var finished []*Draft
	for _, d := range f.Drafts {
		// A draft a person decided has Decided set, even once superseded.
		if (d.State == Expired || d.State == Superseded) && d.Decided.IsZero() {
			finished = append(finished, d)
		}
	}
	drop := map[string]bool{}
	for i, d := range finished { // oldest first, as Add appends
		if len(finished)-i > MaxFinished || now.Sub(ended[d.ID]) > FinishedRetention {
			drop[d.ID] = true
		}
	}
	if len(drop) == 0 {
		return
	}
	f.Drafts = slices.DeleteFunc(f.Drafts, func(d *Draft) bool { return drop[d.ID] })
	f.History = slices.DeleteFunc(f.History, func(t Transition) bool { return drop[t.Draft] })
	f.dirty = true
}

// targets returns the host:port pairs a chunk answers, the unit of the
// rejection backoff.
func targets(c propose.Chunk) []string {
	var out []string
	for _, w := range c.Wants {
		t := net.JoinHostPort(w.Host, strconv.Itoa(int(w.Port)))
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

// update runs fn on the stored document under both locks and writes the
// result back when fn succeeds.
func (s *FileStore) update(fn func(f *file, now time.Time) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	lock, err := os.OpenFile(filepath.Join(s.dir, lockName), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("drafts: lock: %w", err)
	}
	defer lock.Close()
	if err := flock(lock); err != nil {
		return fmt.Errorf("drafts: lock: %w", err)
	}
	f, err := s.read()
	if err != nil {
		return err
	}
	now := s.opts.Now()
	f.expired = f.expire(now)
	f.prune(now)
	// fn returns its error before changing anything, so what is dirty
	// then is the expiry alone, which is kept.
	ferr := fn(f, now)
	if !f.dirty {
		return ferr
	}
	if err := s.write(f); err != nil {
		return err
	}
	s.notify()
	return ferr
}

func flock(f *os.File) error {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

func (s *FileStore) read() (*file, error) {
	data, err := os.ReadFile(filepath.Join(s.dir, fileName))
	f := &file{Backoff: map[string]*backoff{}}
	if errors.Is(err, fs.ErrNotExist) {
		return f, nil
	}
	if err != nil {
		return nil, fmt.Errorf("drafts: read: %w", err)
	}
	if err := json.Unmarshal(data, f); err != nil {
		return nil, fmt.Errorf("drafts: read %s: %w", filepath.Join(s.dir, fileName), err)
	}
	if f.Backoff == nil {
		f.Backoff = map[string]*backoff{}
	}
	return f, nil
}

// write replaces the file atomically: a crash leaves the old or the new
// document, never a mix.
func (s *FileStore) write(f *file) error {
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("drafts: encode: %w", err)
	}
	tmp, err := os.CreateTemp(s.dir, fileName+".tmp*")
	if err != nil {
		return fmt.Errorf("drafts: write: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("drafts: write: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("drafts: sync: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("drafts: write: %w", err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(s.dir, fileName)); err != nil {
		return fmt.Errorf("drafts: rename: %w", err)
	}
	d, err := os.Open(s.dir)
	if err != nil {
		return fmt.Errorf("drafts: sync dir: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("drafts: sync dir: %w", err)
	}
	return nil
}

func (s *FileStore) notify() {
	for ch := range s.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Subscribe implements Store.
func (s *FileStore) Subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	s.mu.Lock()
	s.subs[ch] = struct{}{}
	s.mu.Unlock()
	return ch, func() {
		s.mu.Lock()
		delete(s.subs, ch)
		s.mu.Unlock()
	}
}

func newID(f *file) (string, error) {
	for {
		var b [4]byte
		if _, err := rand.Read(b[:]); err != nil {
			return "", fmt.Errorf("drafts: id: %w", err)
		}
		id := hex.EncodeToString(b[:])
		if f.find(id) == nil {
			return id, nil
		}
	}
}

// Add implements Store.
func (s *FileStore) Add(c propose.Chunk, res check.Result, by Actor) (Draft, error) {
	var out Draft
	err := s.update(func(f *file, now time.Time) error {
		if res.Verdict == check.Invalid || res.Verdict == "" {
			return fmt.Errorf("drafts: add: chunk %s was not validated (%s)", c.ID, cmp.Or(res.Reason, "no check result"))
		}
		tgts := targets(c)
		for _, d := range slices.Backward(f.Drafts) {
			if d.Chunk.ID != c.ID {
				continue
			}
			switch d.State {
			case Pending, Approved:
				out = *d
				return ErrDuplicate
			case Rejected:
				if !retriedSince(f, tgts, d.Decided) {
					out = *d
					return ErrRejected
				}
			}
		}
		for _, t := range tgts {
			if b := f.Backoff[t]; b != nil && b.Rejections >= MaxRejections {
				return fmt.Errorf("%w: %s (corral draft retry)", ErrBackoff, t)
			}
		}
		id, err := newID(f)
		if err != nil {
			return err
		}
		pending := 0
		for _, d := range f.Drafts {
			if d.State == Pending && d.Chunk.Name != c.Name {
				pending++
			}
		}
		if pending >= s.opts.MaxPending {
			return fmt.Errorf("%w: %d (the most a sandbox may have)", ErrTooManyPending, pending)
		}
		d := &Draft{ID: id, Chunk: c, Check: res, State: Pending, Created: now, Expires: now.Add(s.opts.TTL)}
		d.Check.Merged = nil
		for _, o := range f.Drafts {
			switch {
			case o.Chunk.Name != c.Name:
			case o.State == Pending:
				o.SupersededBy = id
				f.move(o, Superseded, now, System, "superseded by "+id)
			case o.State == Approved:
				d.Replaces = o.ID
			}
		}
		f.Drafts = append(f.Drafts, d)
		f.record(Transition{At: now, Draft: id, To: Pending, Actor: by, Reason: "proposed by " + cmp.Or(c.Author, "unknown")})
		out = *d
		return nil
	})
	return out, err
}

func retriedSince(f *file, tgts []string, at time.Time) bool {
	for _, t := range tgts {
		if b := f.Backoff[t]; b != nil && b.RetriedAt.After(at) {
			return true
		}
	}
	return false
}

// transition moves draft id from one of the states in from.
func (s *FileStore) transition(id string, from []State, fn func(f *file, d *Draft, now time.Time)) (Draft, error) {
	var out Draft
	err := s.update(func(f *file, now time.Time) error {
		d := f.find(id)
		if d == nil {
			return fmt.Errorf("%w: %s", ErrNotFound, id)
		}
		if !slices.Contains(from, d.State) {
			out = *d
			return fmt.Errorf("%w: %s is %s", ErrState, id, d.State)
		}
		fn(f, d, now)
		out = *d
		return nil
	})
	return out, err
}

// Approve implements Store.
func (s *FileStore) Approve(id string, by Actor, reason string) (Draft, error) {
	return s.transition(id, []State{Pending}, func(f *file, d *Draft, now time.Time) {
		if old := f.find(d.Replaces); old != nil && old.State == Approved {
			old.SupersededBy = d.ID
			f.move(old, Superseded, now, by, "replaced by "+d.ID)
		}
		f.move(d, Approved, now, by, reason)
	})
}

// MarkLoaded implements Store.
func (s *FileStore) MarkLoaded(id string, version int, hash string) (Draft, error) {
	return s.transition(id, []State{Approved}, func(f *file, d *Draft, now time.Time) {
		d.Loaded = &Loaded{Version: version, Hash: hash, At: now}
		f.record(Transition{At: now, Draft: id, From: Approved, To: Approved, Actor: System,
			Reason: fmt.Sprintf("loaded as policy version %d (%s)", version, hash)})
	})
}

// Reject implements Store.
func (s *FileStore) Reject(id string, by Actor, reason, guidance string) (Draft, error) {
	return s.transition(id, []State{Pending}, func(f *file, d *Draft, now time.Time) {
		d.Guidance = guidance
		for _, t := range targets(d.Chunk) {
			b := f.Backoff[t]
			if b == nil {
				b = &backoff{}
				f.Backoff[t] = b
			}
			b.Rejections++
		}
		f.move(d, Rejected, now, by, reason)
	})
}

// Undo implements Store.
func (s *FileStore) Undo(id string, by Actor, reason string) (Draft, error) {
	return s.transition(id, []State{Approved}, func(f *file, d *Draft, now time.Time) {
		f.move(d, Undone, now, by, reason)
	})
}

// Retry implements Store.
func (s *FileStore) Retry(host string, port uint16, by Actor) error {
	t := net.JoinHostPort(host, strconv.Itoa(int(port)))
	return s.update(func(f *file, now time.Time) error {
		f.Backoff[t] = &backoff{RetriedAt: now}
		f.record(Transition{At: now, Actor: by, Reason: "retry " + t})
		return nil
	})
}

// Expire implements Store.
func (s *FileStore) Expire() ([]Draft, error) {
	var out []Draft
	err := s.update(func(f *file, _ time.Time) error {
		out = f.expired
		return nil
	})
	return out, err
}

// Get implements Store.
func (s *FileStore) Get(id string) (Draft, error) {
	var out Draft
	err := s.update(func(f *file, _ time.Time) error {
		d := f.find(id)
		if d == nil {
			return fmt.Errorf("%w: %s", ErrNotFound, id)
		}
		out = withHistory(f, d)
		return nil
	})
	return out, err
}

// List implements Store.
func (s *FileStore) List() ([]Draft, error) {
	var out []Draft
	err := s.update(func(f *file, _ time.Time) error {
		for _, d := range slices.Backward(f.Drafts) {
			out = append(out, withHistory(f, d))
		}
		return nil
	})
	return out, err
}

// History implements Store.
func (s *FileStore) History() ([]Transition, error) {
	var out []Transition
	err := s.update(func(f *file, _ time.Time) error {
		out = slices.Clone(f.History)
		return nil
	})
	return out, err
}

func withHistory(f *file, d *Draft) Draft {
	c := *d
	for _, t := range f.History {
		if t.Draft == d.ID {
			c.History = append(c.History, t)
		}
	}
	return c
}

// Wait implements Store. Changes made in this process wake it at once;
// those of another process (the CLI) are seen within Options.Poll.
func (s *FileStore) Wait(ctx context.Context, id string) (Draft, error) {
	ch, cancel := s.Subscribe()
	defer cancel()
	t := time.NewTicker(s.opts.Poll)
	defer t.Stop()
	for {
		d, err := s.Get(id)
		if err != nil || d.Done() {
			return d, err
		}
		select {
		case <-ctx.Done():
			return d, fmt.Errorf("wait for draft %s: %w", id, ctx.Err())
		case <-ch:
		case <-t.C:
		}
	}
}
