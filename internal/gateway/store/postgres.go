package store

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Advisory lock keys, transaction-scoped: one for migrations (two gateways
// starting together), one that makes log Seq order equal commit order.
const (
	pgLockMigrate = 0x636f7272616c01 // "corral" 1
	pgLockLogs    = 0x636f7272616c02 // "corral" 2
	pgLockNames   = 0x636f7272616c03 // "corral" 3
)

type pgBackend struct {
	pool *pgxpool.Pool
}

// OpenPostgres connects to the PostgreSQL database at url and applies its
// migrations.
func OpenPostgres(ctx context.Context, url string) (Store, error) {
	return openPostgres(ctx, url, 0)
}

// openPostgres migrates only up to version upTo (0 = all), so tests can
// build a database as an older binary left it.
func openPostgres(ctx context.Context, url string, upTo int) (Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// pgx's message already hides the password.
		return nil, fmt.Errorf("open postgres: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open postgres: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("open postgres: %w", err)
	}
	b := &pgBackend{pool: pool}
	prelude := []string{
		`SELECT pg_advisory_xact_lock(` + strconv.Itoa(pgLockMigrate) + `)`,
		`CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL)`,
	}
	if err := migrate(ctx, b, "postgres", upTo, prelude); err != nil {
		pool.Close()
		return nil, fmt.Errorf("open postgres: %w", err)
	}
	return &sqlStore{b: b}, nil
}

// rebind turns the shared statements' ? placeholders into $1, $2...; none
// of them has a ? inside a literal.
func rebind(q string) string {
	if !strings.Contains(q, "?") {
		return q
	}
	var sb strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			sb.WriteByte('$')
			sb.WriteString(strconv.Itoa(n))
			continue
		}
		sb.WriteRune(r)
	}
	return sb.String()
}

// pgConn adapts a pool or a transaction to conn.
type pgConn struct {
	q interface {
		Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
		Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
		QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	}
}

func (c pgConn) exec(ctx context.Context, q string, args ...any) (int64, error) {
	tag, err := c.q.Exec(ctx, rebind(q), args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

func (c pgConn) query(ctx context.Context, q string, args ...any) (rows, error) {
	return c.q.Query(ctx, rebind(q), args...)
}

func (c pgConn) queryRow(ctx context.Context, q string, args ...any) row {
	return c.q.QueryRow(ctx, rebind(q), args...)
}

func (b *pgBackend) read() conn { return pgConn{b.pool} }

func (b *pgBackend) write(ctx context.Context, fn func(tx conn) error) error {
	return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return fn(pgConn{tx}) })
}

func (b *pgBackend) lockSandboxNames(ctx context.Context, tx conn) error {
	_, err := tx.exec(ctx, `SELECT pg_advisory_xact_lock(?)`, int64(pgLockNames))
	return err
}

func (b *pgBackend) timeArg(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC()
}

func (b *pgBackend) appendLogs(ctx context.Context, entries []LogEntry) error {
	return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		// Sequence values are handed out before commit, so without this
		// lock a follower could read seq 12 committed while seq 11 is
		// still in flight, and then never see 11.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(pgLockLogs)); err != nil {
			return err
		}
		rs, err := tx.Query(ctx, `SELECT nextval(pg_get_serial_sequence('logs', 'seq')) FROM generate_series(1, $1)`, len(entries))
		if err != nil {
			return err
		}
		seqs, err := pgx.CollectRows(rs, pgx.RowTo[int64])
		if err != nil {
			return err
		}
		if len(seqs) != len(entries) {
			return fmt.Errorf("reserved %d log seqs for %d entries", len(seqs), len(entries))
		}
		sort.Slice(seqs, func(i, j int) bool { return seqs[i] < seqs[j] })
		for i := range entries {
			entries[i].Seq = seqs[i]
		}
		_, err = tx.CopyFrom(ctx, pgx.Identifier{"logs"},
			[]string{"seq", "sandbox_id", "time", "level", "source", "event", "message", "fields"},
			pgx.CopyFromSlice(len(entries), func(i int) ([]any, error) {
				e := &entries[i]
				return []any{e.Seq, nullStr(e.SandboxID), e.Time.UTC(), e.Level, e.Source, e.Event, e.Message, e.Fields}, nil
			}))
		return err
	})
}

func (b *pgBackend) constraint(err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return nil
	}
	switch pe.Code {
	case "23505": // unique_violation
		return ErrExists
	case "23503": // foreign_key_violation
		return ErrNotFound
	}
	return nil
}

func (b *pgBackend) close() error {
	b.pool.Close()
	return nil
}
