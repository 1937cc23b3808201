package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// sqliteReaders bounds the read pool; WAL lets them all run beside the
// writer.
const sqliteReaders = 8

// sqliteBackend keeps two pools on one file. SQLite admits one writer at a
// time, so the write pool has a single connection and writers queue in Go
// instead of spinning on SQLITE_BUSY; readers use their own pool and, in
// WAL mode, read the last committed state without waiting for a writer.
type sqliteBackend struct {
	wdb *sql.DB
	rdb *sql.DB
}

// OpenSQLite opens (creating if needed) the SQLite database at path and
// applies its migrations.
func OpenSQLite(path string) (Store, error) {
	return openSQLite(path, 0)
}

// openSQLite migrates only up to version upTo (0 = all), so tests can build
// a database as an older binary left it.
func openSQLite(path string, upTo int) (Store, error) {
	if path == "" || strings.ContainsAny(path, "?#") {
		return nil, fmt.Errorf("open sqlite %q: want a file path without ? or #", path)
	}
	// The database holds token hashes and sealed secrets: only the
	// gateway's user may read it. SQLite gives the -wal and -shm files the
	// main file's mode.
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("open sqlite: create directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open sqlite: %w", err)
	}
	err = f.Chmod(0o600)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}

	common := "_pragma=busy_timeout(10000)&_pragma=foreign_keys(1)"
	wdb, err := sql.Open("sqlite", path+"?"+common+"&_pragma=journal_mode(wal)&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	wdb.SetMaxOpenConns(1)
	// Keep the writer's connection, and with it the prepared statements
	// and page cache, for the life of the store.
	wdb.SetConnMaxIdleTime(0)
	wdb.SetConnMaxLifetime(0)
	b := &sqliteBackend{wdb: wdb}
	ctx := context.Background()
	if err := wdb.PingContext(ctx); err != nil {
		wdb.Close()
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	prelude := []string{`CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)`}
	if err := migrate(ctx, b, "sqlite", upTo, prelude); err != nil {
		wdb.Close()
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	rdb, err := sql.Open("sqlite", path+"?"+common+"&_pragma=query_only(1)")
	if err != nil {
		wdb.Close()
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	rdb.SetMaxOpenConns(sqliteReaders)
	rdb.SetMaxIdleConns(sqliteReaders)
	b.rdb = rdb
	return &sqlStore{b: b}, nil
}

// sqlConn adapts database/sql handles (pool or transaction) to conn.
type sqlConn struct {
	q interface {
		ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error)
		QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error)
		QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row
	}
}

func (c sqlConn) exec(ctx context.Context, q string, args ...any) (int64, error) {
	res, err := c.q.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (c sqlConn) query(ctx context.Context, q string, args ...any) (rows, error) {
	rs, err := c.q.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return sqlRows{rs}, nil
}

func (c sqlConn) queryRow(ctx context.Context, q string, args ...any) row {
	return c.q.QueryRowContext(ctx, q, args...)
}

type sqlRows struct{ *sql.Rows }

// Close drops the error: Err reports what went wrong while iterating.
func (r sqlRows) Close() { r.Rows.Close() }

func (b *sqliteBackend) read() conn { return sqlConn{b.rdb} }

func (b *sqliteBackend) write(ctx context.Context, fn func(tx conn) error) error {
	return b.inTx(ctx, func(tx *sql.Tx) error { return fn(sqlConn{tx}) })
}

func (b *sqliteBackend) inTx(ctx context.Context, fn func(tx *sql.Tx) error) (err error) {
	tx, err := b.wdb.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() {
		if err != nil {
			tx.Rollback()
		}
	}()
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// lockSandboxNames has nothing to do: write transactions are one at a time.
func (b *sqliteBackend) lockSandboxNames(context.Context, conn) error { return nil }

func (b *sqliteBackend) timeArg(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixMicro()
}

func (b *sqliteBackend) appendLogs(ctx context.Context, entries []LogEntry) error {
	return b.inTx(ctx, func(tx *sql.Tx) error {
		stmt, err := tx.PrepareContext(ctx, `INSERT INTO logs (sandbox_id, time, level, source, event, message, fields) VALUES (?, ?, ?, ?, ?, ?, ?)`)
		if err != nil {
			return err
		}
		defer stmt.Close()
		// One writer at a time, so rowids come out in commit order.
		for i := range entries {
			e := &entries[i]
			res, err := stmt.ExecContext(ctx, nullStr(e.SandboxID), e.Time.UnixMicro(), e.Level, e.Source, e.Event, e.Message, e.Fields)
			if err != nil {
				return fmt.Errorf("entry %d: %w", i, err)
			}
			if e.Seq, err = res.LastInsertId(); err != nil {
				return fmt.Errorf("entry %d: %w", i, err)
			}
		}
		return nil
	})
}

func (b *sqliteBackend) constraint(err error) error {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return nil
	}
	switch se.Code() {
	case sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY, sqlite3.SQLITE_CONSTRAINT_UNIQUE:
		return ErrExists
	case sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY:
		return ErrNotFound
	}
	return nil
}

func (b *sqliteBackend) close() error {
	var errs []error
	if b.rdb != nil {
		errs = append(errs, b.rdb.Close())
	}
	errs = append(errs, b.wdb.Close())
	return errors.Join(errs...)
}
