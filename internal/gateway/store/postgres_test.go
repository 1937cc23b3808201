package store_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/corral-sandbox/corral/internal/gateway/store"
	"github.com/corral-sandbox/corral/internal/gateway/store/storetest"
)

// pgServer is the one PostgreSQL server of this test binary, started by the
// first test that needs it and stopped by TestMain.
type pgServer struct {
	bin  string // directory of initdb, pg_ctl
	dir  string // data/, the socket and the log live here
	cred *syscall.Credential
}

var (
	pgOnce    sync.Once
	pg        *pgServer
	pgSkip    string // why PostgreSQL tests cannot run here
	pgErr     error
	pgDBCount atomic.Int64
)

// pgDirPrefix names the server directories in the temp dir, so a run can
// find and remove what a crashed run left behind.
const pgDirPrefix = "corral-pgtest-"

func TestMain(m *testing.M) {
	code := m.Run()
	if pg != nil {
		pg.stop()
	}
	os.Exit(code)
}

// needPostgres returns the server, skipping the test (failing it on CI,
// where CORRAL_NO_SKIP=1) when PostgreSQL is not installed.
func needPostgres(t testing.TB) *pgServer {
	t.Helper()
	pgOnce.Do(func() { pg, pgSkip, pgErr = startPostgres() })
	switch {
	case pgErr != nil:
		t.Fatalf("start PostgreSQL: %v", pgErr)
	case pgSkip != "" && os.Getenv("CORRAL_NO_SKIP") == "1":
		t.Fatalf("%s (CORRAL_NO_SKIP=1: install Debian's postgresql package)", pgSkip)
	case pgSkip != "":
		t.Skip(pgSkip)
	}
	return pg
}

func startPostgres() (*pgServer, string, error) {
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		return nil, "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb)", nil
	}
	// The newest major version, numerically (10 after 9).
	sort.Slice(bins, func(i, j int) bool { return pgMajor(bins[i]) < pgMajor(bins[j]) })
	s := &pgServer{bin: filepath.Dir(bins[len(bins)-1])}
	removeStalePostgres(s.bin)

	dir, err := os.MkdirTemp("", pgDirPrefix)
	if err != nil {
		return nil, "", err
	}
	s.dir = dir
	if err := os.WriteFile(filepath.Join(dir, "owner"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return nil, "", err
	}
	// PostgreSQL refuses to run as root: run it as its own system user.
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			u, err = user.Lookup("nobody")
		}
		if err != nil {
			return nil, "", fmt.Errorf("no unprivileged user to run PostgreSQL as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, "", err
		}
	}
	data := filepath.Join(dir, "data")
	if err := s.run("initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		s.remove()
		return nil, "", err
	}
	// Unix socket only; durability is not what these tests check.
	conf := fmt.Sprintf("listen_addresses = ''\nunix_socket_directories = '%s'\nfsync = off\nsynchronous_commit = off\nfull_page_writes = off\n", dir)
	f, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(conf)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		s.remove()
		return nil, "", err
	}
	if err := s.run("pg_ctl", "-D", data, "-l", filepath.Join(dir, "server.log"), "-w", "-t", "60", "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "server.log"))
		s.remove()
		return nil, "", fmt.Errorf("%w\nserver log:\n%s", err, log)
	}
	return s, "", nil
}

func pgMajor(initdb string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(initdb))))
	return n
}

// run runs one of the server's tools as the server's user.
func (s *pgServer) run(tool string, args ...string) error {
	cmd := exec.Command(filepath.Join(s.bin, tool), args...)
	cmd.Dir = s.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w\n%s", tool, err, out)
	}
	return nil
}

func (s *pgServer) stop() {
	if err := s.run("pg_ctl", "-D", filepath.Join(s.dir, "data"), "stop", "-m", "immediate"); err != nil {
		fmt.Fprintln(os.Stderr, "stop PostgreSQL:", err)
	}
	s.remove()
}

func (s *pgServer) remove() {
	if err := os.RemoveAll(s.dir); err != nil {
		fmt.Fprintln(os.Stderr, "remove PostgreSQL test directory:", err)
	}
}

// removeStalePostgres stops and removes the servers of test binaries that
// died before their TestMain could (a timeout, a kill), leaving alone those
// of runs still going.
func removeStalePostgres(bin string) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), pgDirPrefix+"*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "owner"))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 || !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			continue
		}
		stale := &pgServer{bin: bin, dir: dir}
		if fi, err := os.Stat(dir); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 {
				stale.cred = &syscall.Credential{Uid: st.Uid, Gid: st.Gid}
			}
		}
		if _, err := os.Stat(filepath.Join(dir, "data", "postmaster.pid")); err == nil {
			stale.run("pg_ctl", "-D", filepath.Join(dir, "data"), "stop", "-m", "immediate")
		}
		stale.remove()
	}
}

func (s *pgServer) url(db string) string {
	return fmt.Sprintf("postgres:///%s?host=%s&user=postgres", db, s.dir)
}

// newDatabase creates an empty database for one test and drops it after.
func (s *pgServer) newDatabase(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("t%d", pgDBCount.Add(1))
	admin, err := pgx.Connect(ctx, s.url("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		admin, err := pgx.Connect(ctx, s.url("postgres"))
		if err != nil {
			t.Error(err)
			return
		}
		defer admin.Close(ctx)
		if _, err := admin.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			t.Error(err)
		}
	})
	return s.url(name)
}

func TestPostgres(t *testing.T) {
	srv := needPostgres(t)
	storetest.Run(t, func(t *testing.T) store.Store {
		// More connections than pgx's default of 4 on this machine, so
		// the concurrency tests really race.
		s, err := store.OpenPostgres(context.Background(), srv.newDatabase(t)+"&pool_max_conns=16")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

// pgConnect connects to the database at url below the store.
func pgConnect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(ctx) })
	return c
}

func TestPostgresMigrations(t *testing.T) {
	srv := needPostgres(t)
	storetest.RunMigrations(t, storetest.Migrations{
		Latest: store.LatestVersion("postgres"),
		New:    func(t *testing.T) string { return srv.newDatabase(t) },
		OpenAt: func(t *testing.T, url string, version int) (store.Store, error) {
			return store.OpenPostgresAt(context.Background(), url, version)
		},
		Version: func(t *testing.T, url string) int {
			var v int
			if err := pgConnect(t, url).QueryRow(context.Background(), `SELECT MAX(version) FROM schema_migrations`).Scan(&v); err != nil {
				t.Fatal(err)
			}
			return v
		},
		MarkApplied: func(t *testing.T, url string, version int) {
			if _, err := pgConnect(t, url).Exec(context.Background(), `INSERT INTO schema_migrations (version, applied_at) VALUES ($1, now())`, version); err != nil {
				t.Fatal(err)
			}
		},
	})
}

// TestPostgresConcurrentOpen: gateways starting together against one empty
// database must not trip over each other's migrations.
func TestPostgresConcurrentOpen(t *testing.T) {
	srv := needPostgres(t)
	url := srv.newDatabase(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := store.OpenPostgres(context.Background(), url)
			if err != nil {
				errs <- err
				return
			}
			s.Close()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestOpenPostgresURL(t *testing.T) {
	srv := needPostgres(t)
	url := srv.newDatabase(t)
	for _, u := range []string{url, strings.Replace(url, "postgres://", "postgresql://", 1)} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		s, err := store.Open(ctx, u, "")
		cancel()
		if err != nil {
			t.Fatalf("open %s: %v", u, err)
		}
		s.Close()
	}
}

// BenchmarkAppendLogsPostgres is BenchmarkAppendLogs on the test server
// (fsync off, so it measures the store, not the disk).
func BenchmarkAppendLogsPostgres(b *testing.B) {
	srv := needPostgres(b)
	s, err := store.OpenPostgres(context.Background(), srv.newDatabase(b))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	benchmarkAppendLogs(b, s)
}
