package store

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

// migrationFiles holds each backend's schema changes, one file per version
// named NNNN_what.sql. A version, once released, is never edited: a change
// is a new file.
//
//go:embed migrations
var migrationFiles embed.FS

type migration struct {
	version int
	name    string
	sql     string
}

// migrations returns the backend's migrations in version order, checking
// that they are numbered 1, 2, 3... without gaps.
func migrations(dir string) ([]migration, error) {
	entries, err := fs.ReadDir(migrationFiles, path.Join("migrations", dir))
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	var out []migration
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || !strings.HasSuffix(e.Name(), ".sql") {
			return nil, fmt.Errorf("migration file %s/%s: want NNNN_name.sql", dir, e.Name())
		}
		b, err := fs.ReadFile(migrationFiles, path.Join("migrations", dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", e.Name(), err)
		}
		out = append(out, migration{version: v, name: e.Name(), sql: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	for i, m := range out {
		if m.version != i+1 {
			return nil, fmt.Errorf("migrations of %s: %s where version %d was expected", dir, m.name, i+1)
		}
	}
	return out, nil
}

// migrate brings the database up to version upTo (every known migration
// when upTo is 0) in one transaction, so a failed step leaves the schema as
// it was. prelude runs first in that transaction: the DDL of the
// schema_migrations table and, on PostgreSQL, a lock that keeps two
// gateways from migrating at once. A database newer than this binary is
// refused rather than used with a schema the code does not know.
func migrate(ctx context.Context, b backend, dir string, upTo int, prelude []string) error {
	all, err := migrations(dir)
	if err != nil {
		return err
	}
	if upTo == 0 || upTo > len(all) {
		upTo = len(all)
	}
	return b.write(ctx, func(tx conn) error {
		for _, q := range prelude {
			if _, err := tx.exec(ctx, q); err != nil {
				return fmt.Errorf("prepare schema_migrations: %w", err)
			}
		}
		var current int64
		if err := tx.queryRow(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&current); err != nil {
			return fmt.Errorf("read schema version: %w", err)
		}
		if current > int64(upTo) {
			return fmt.Errorf("database schema is at version %d but this corral knows versions up to %d: upgrade corral (the database was written by a newer one)", current, upTo)
		}
		for _, m := range all[current:upTo] {
			if _, err := tx.exec(ctx, m.sql); err != nil {
				return fmt.Errorf("apply migration %s: %w", m.name, err)
			}
			if _, err := tx.exec(ctx, `INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)`,
				int64(m.version), b.timeArg(now())); err != nil {
				return fmt.Errorf("record migration %s: %w", m.name, err)
			}
		}
		return nil
	})
}
