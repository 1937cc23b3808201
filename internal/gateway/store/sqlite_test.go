package store_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/corral-sandbox/corral/internal/gateway/store"
	"github.com/corral-sandbox/corral/internal/gateway/store/storetest"
)

func openSQLite(t *testing.T) store.Store {
	t.Helper()
	s, err := store.OpenSQLite(filepath.Join(t.TempDir(), "gateway.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestSQLite(t *testing.T) {
	storetest.Run(t, openSQLite)
}

// rawSQLite opens the file below the store, as another tool would.
func rawSQLite(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestSQLiteMigrations(t *testing.T) {
	storetest.RunMigrations(t, storetest.Migrations{
		Latest: store.LatestVersion("sqlite"),
		New:    func(t *testing.T) string { return filepath.Join(t.TempDir(), "gateway.db") },
		OpenAt: func(t *testing.T, path string, version int) (store.Store, error) {
			return store.OpenSQLiteAt(path, version)
		},
		Version: func(t *testing.T, path string) int {
			var v int
			if err := rawSQLite(t, path).QueryRow(`SELECT MAX(version) FROM schema_migrations`).Scan(&v); err != nil {
				t.Fatal(err)
			}
			return v
		},
		MarkApplied: func(t *testing.T, path string, version int) {
			if _, err := rawSQLite(t, path).Exec(`INSERT INTO schema_migrations (version, applied_at) VALUES (?, 0)`, version); err != nil {
				t.Fatal(err)
			}
		},
	})
}

// TestSQLiteFileModes: the database holds token hashes and sealed secrets,
// so neither it, its WAL, nor a directory the store creates is readable by
// other users.
func TestSQLiteFileModes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data", "gw")
	path := filepath.Join(dir, "gateway.db")
	s, err := store.OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if err := s.PutSecret(ctx, store.Secret{Name: "k", Sealed: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Dir(dir), dir} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o700 {
			t.Errorf("%s mode %v, want 0700", p, fi.Mode().Perm())
		}
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v, want 0600", p, fi.Mode().Perm())
		}
	}
	var mode string
	if err := rawSQLite(t, path).QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
		t.Errorf("journal mode %q (%v), want wal", mode, err)
	}

	// A file left world-readable by something else is tightened.
	loose := filepath.Join(t.TempDir(), "loose.db")
	if err := os.WriteFile(loose, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(loose, 0o644); err != nil {
		t.Fatal(err)
	}
	s2, err := store.OpenSQLite(loose)
	if err != nil {
		t.Fatal(err)
	}
	s2.Close()
	if fi, err := os.Stat(loose); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("existing database mode %v (%v), want 0600", fi.Mode().Perm(), err)
	}
}

// TestSQLiteReadsDuringWrite: while the store's writer waits on a lock
// (here one held by another process's transaction), reads still answer
// from the last committed state instead of queuing behind it.
func TestSQLiteReadsDuringWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gateway.db")
	s, err := store.OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if err := s.CreateSandbox(ctx, store.Sandbox{ID: "sb"}); err != nil {
		t.Fatal(err)
	}
	other, err := rawSQLite(t, path).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
		t.Fatal(err)
	}
	if _, err := other.ExecContext(ctx, `INSERT INTO secrets (name, sealed, updated_at) VALUES ('x', x'00', 0)`); err != nil {
		t.Fatal(err)
	}
	written := make(chan error, 1)
	go func() { written <- s.SetPhase(ctx, "sb", store.PhaseReady, nil, "") }()
	// Let the write reach the lock and hold the store's writer.
	time.Sleep(300 * time.Millisecond)

	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	sb, err := s.GetSandbox(rctx, "sb")
	if err != nil {
		t.Fatalf("read while a write waits: %v", err)
	}
	if sb.Phase != store.PhaseProvisioning {
		t.Errorf("read saw phase %q before the write committed", sb.Phase)
	}
	if _, err := other.ExecContext(ctx, `ROLLBACK`); err != nil {
		t.Fatal(err)
	}
	if err := <-written; err != nil {
		t.Fatalf("write after the lock was released: %v", err)
	}
	if sb, err := s.GetSandbox(ctx, "sb"); err != nil || sb.Phase != store.PhaseReady {
		t.Errorf("after the write: %+v, %v", sb, err)
	}
}

func TestOpen(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := store.Open(ctx, "", dir)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := os.Stat(filepath.Join(dir, "gateway.db")); err != nil {
		t.Errorf("no database in the data directory: %v", err)
	}
	if _, err := store.Open(ctx, "", ""); err == nil {
		t.Error("opened SQLite without a data directory")
	}
	for _, bad := range []string{"mysql://root:hunter2@db/x", "sqlite:///tmp/x.db", "root:hunter2@db"} {
		_, err := store.Open(ctx, bad, dir)
		if err == nil {
			t.Errorf("opened %q", bad)
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, "postgres://") || !strings.Contains(msg, "empty") {
			t.Errorf("error for %q does not name the accepted forms: %v", bad, err)
		}
		if strings.Contains(msg, "hunter2") {
			t.Errorf("error for %q shows the password: %v", bad, err)
		}
	}
}

// BenchmarkAppendLogs measures log ingest on SQLite in batches of 500, as
// the gateway writes what supervisors push; it reports entries/s.
func BenchmarkAppendLogs(b *testing.B) {
	s, err := store.OpenSQLite(filepath.Join(b.TempDir(), "gateway.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	benchmarkAppendLogs(b, s)
}

func benchmarkAppendLogs(b *testing.B, s store.Store) {
	ctx := context.Background()
	if err := s.CreateSandbox(ctx, store.Sandbox{ID: "sb"}); err != nil {
		b.Fatal(err)
	}
	const size = 500
	batch := make([]store.LogEntry, size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range batch {
			batch[j] = store.LogEntry{
				SandboxID: "sb", Level: "info", Source: "audit", Event: "net.connect.allowed",
				Message: fmt.Sprintf("connect example.com:443 #%d", i*size+j),
				Fields:  []byte(`{"event":"net.connect.allowed","host":"example.com","port":443,"decision":"allow"}`),
			}
		}
		if err := s.AppendLogs(ctx, batch); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "entries/s")
}
