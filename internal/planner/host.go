package planner

import (
	"errors"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/linux/cgroup"
	"github.com/corral-sandbox/corral/internal/linux/idmap"
	"github.com/corral-sandbox/corral/internal/linux/landlock"
	"github.com/corral-sandbox/corral/internal/statedir"
)

// Host is every fact about the machine a plan depends on. Tests replace it
// with a fake, which is what keeps Build pure.
type Host struct {
	EUID, EGID  uint32
	LandlockABI int
	Cgroups     cgroup.Facts
	FS          FileSystem
	Users       UserDB
	// Home is the invoking user's home directory, which
	// filesystem_policy.home entries are relative to: $HOME, else the
	// user database's home of the effective uid.
	Home string
	// IDMap makes idmapped bind mounts; nil where corral cannot (it is
	// not root).
	IDMap IDMapper
	// NprocPerUserNS is set where RLIMIT_NPROC counts a uid's tasks in
	// each user namespace apart (Linux 5.14): there a limit set inside
	// the sandbox's own namespace bounds the sandbox's tasks only. Before,
	// it counted the uid's tasks on the whole host.
	NprocPerUserNS bool
}

// IDMapper tells whether a host path can be bind-mounted idmapped with m,
// by trying it.
type IDMapper interface {
	Probe(path string, m idmap.Mapping) error
}

// FileType is the kind of file at a path, without following a final symlink.
type FileType int

// File types the builder distinguishes.
const (
	TypeOther FileType = iota
	TypeDir
	TypeFile
	TypeSymlink
)

// FileInfo is what Build needs to know about one path.
type FileInfo struct {
	Type FileType
	UID  uint32
	GID  uint32
	Perm fs.FileMode
	// Dev and Ino identify the file whatever path reaches it; Nlink
	// counts its names (hard links).
	Dev, Ino, Nlink uint64
}

// FileSystem is the read-only view of the host's files used by Build.
type FileSystem interface {
	Lstat(path string) (FileInfo, error)
	Readlink(path string) (string, error)
}

// Account is a user known to the host.
type Account struct {
	UID    uint32
	GID    uint32
	Name   string
	Home   string
	Groups []uint32
}

// UserDB resolves users and groups. Lookups return an error wrapping
// fs.ErrNotExist for unknown names or ids.
type UserDB interface {
	User(nameOrID string) (Account, error)
	Group(nameOrID string) (uint32, error)
}

// LocalHost reads the facts of the machine corral runs on.
func LocalHost(stateDir string) Host {
	return Host{
		EUID:           uint32(os.Geteuid()),
		EGID:           uint32(os.Getegid()),
		LandlockABI:    landlock.BestABI(),
		Cgroups:        cgroup.Detect(),
		FS:             osFS{},
		Users:          osUsers{},
		Home:           invokingHome(),
		IDMap:          idmapper(stateDir),
		NprocPerUserNS: kernelAtLeast(unameRelease(), 5, 14),
	}
}

func unameRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// kernelAtLeast reports whether a kernel release ("6.8.0-45-generic")
// is major.minor or later; an unparsable one is not.
func kernelAtLeast(release string, major, minor int) bool {
	maj, rest, _ := strings.Cut(release, ".")
	mnr, _, _ := strings.Cut(rest, ".")
	mnr = mnr[:len(mnr)-len(strings.TrimLeft(mnr, "0123456789"))]
	a, err1 := strconv.Atoi(maj)
	b, err2 := strconv.Atoi(mnr)
	if err1 != nil || err2 != nil {
		return false
	}
	return a > major || (a == major && b >= minor)
}

// invokingHome is what ~ means to the user who ran corral. As root through
// sudo that is whatever HOME sudo left (root's home unless the user kept
// theirs): $SUDO_USER names someone else, not the one corral runs as.
func invokingHome() string {
	if h := os.Getenv("HOME"); filepath.IsAbs(h) {
		return filepath.Clean(h)
	}
	if u, err := user.LookupId(strconv.Itoa(os.Geteuid())); err == nil && filepath.IsAbs(u.HomeDir) {
		return filepath.Clean(u.HomeDir)
	}
	return ""
}

// idmapper is nil unless corral is root in the initial user namespace,
// the only place idmapped mounts of host filesystems can be made. Probes
// that succeeded are remembered under stateDir.
func idmapper(stateDir string) IDMapper {
	if os.Geteuid() != 0 {
		return nil
	}
	return osIDMapper{probed: statedir.IDMapProbes(stateDir)}
}

type osIDMapper struct{ probed string }

func (o osIDMapper) Probe(path string, m idmap.Mapping) error {
	return idmap.ProbeOnce(o.probed, path, m)
}

type osFS struct{}

func (osFS) Lstat(path string) (FileInfo, error) {
	st, err := os.Lstat(path)
	if err != nil {
		return FileInfo{}, err
	}
	fi := FileInfo{Perm: st.Mode().Perm()}
	switch {
	case st.Mode()&fs.ModeSymlink != 0:
		fi.Type = TypeSymlink
	case st.IsDir():
		fi.Type = TypeDir
	case st.Mode().IsRegular():
		fi.Type = TypeFile
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		fi.UID, fi.GID = sys.Uid, sys.Gid
		// Their widths differ between architectures.
		fi.Dev, fi.Ino, fi.Nlink = uint64(sys.Dev), uint64(sys.Ino), uint64(sys.Nlink)
	}
	return fi, nil
}

func (osFS) Readlink(path string) (string, error) { return os.Readlink(path) }

type osUsers struct{}

func (osUsers) User(nameOrID string) (Account, error) {
	u, err := user.Lookup(nameOrID)
	if err != nil {
		u, err = user.LookupId(nameOrID)
	}
	if err != nil {
		return Account{}, notExist(err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	a := Account{UID: uint32(uid), GID: uint32(gid), Name: u.Username, Home: u.HomeDir}
	ids, _ := u.GroupIds()
	for _, g := range ids {
		if n, err := strconv.ParseUint(g, 10, 32); err == nil {
			a.Groups = append(a.Groups, uint32(n))
		}
	}
	return a, nil
}

func (osUsers) Group(nameOrID string) (uint32, error) {
	g, err := user.LookupGroup(nameOrID)
	if err != nil {
		g, err = user.LookupGroupId(nameOrID)
	}
	if err != nil {
		return 0, notExist(err)
	}
	n, err := strconv.ParseUint(g.Gid, 10, 32)
	return uint32(n), err
}

func notExist(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return errors.Join(fs.ErrNotExist, err)
}
