package store_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/corral-sandbox/corral/internal/gateway/store"
	"github.com/corral-sandbox/corral/internal/gateway/store/storetest"
	"github.com/corral-sandbox/corral/internal/testutil/pgserver"
)

// pg is the one PostgreSQL server of this test binary, started by the
// first test that needs it and stopped by TestMain.
var (
	pgOnce    sync.Once
	pg        *pgserver.Server
	pgSkip    string // why PostgreSQL tests cannot run here
	pgErr     error
	pgDBCount atomic.Int64
)

func TestMain(m *testing.M) {
	code := m.Run()
	if pg != nil {
		pg.Stop()
	}
	os.Exit(code)
}

// needPostgres returns the server, skipping the test (failing it on CI,
// where CORRAL_NO_SKIP=1) when PostgreSQL is not installed.
func needPostgres(t testing.TB) *pgserver.Server {
	t.Helper()
	pgOnce.Do(func() { pg, pgSkip, pgErr = pgserver.Start() })
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

// newDatabase creates an empty database for one test and drops it after.
func newDatabase(t testing.TB, s *pgserver.Server) string {
	t.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("t%d", pgDBCount.Add(1))
	admin, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		admin, err := pgx.Connect(ctx, s.URL("postgres"))
		if err != nil {
			t.Error(err)
			return
		}
		defer admin.Close(ctx)
		if _, err := admin.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			t.Error(err)
		}
	})
	return s.URL(name)
}

func TestPostgres(t *testing.T) {
	srv := needPostgres(t)
	storetest.Run(t, func(t *testing.T) store.Store {
		// More connections than pgx's default of 4 on this machine, so
		// the concurrency tests really race.
		s, err := store.OpenPostgres(context.Background(), newDatabase(t, srv)+"&pool_max_conns=16")
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
		New:    func(t *testing.T) string { return newDatabase(t, srv) },
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
	url := newDatabase(t, srv)
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
	url := newDatabase(t, srv)
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
	s, err := store.OpenPostgres(context.Background(), newDatabase(b, srv))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	benchmarkAppendLogs(b, s)
}
