package store

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// Open opens the gateway's store: database "" is SQLite at
// dataDir/gateway.db, a postgres:// or postgresql:// URL is PostgreSQL.
func Open(ctx context.Context, database, dataDir string) (Store, error) {
	switch {
	case database == "":
		if dataDir == "" {
			return nil, errors.New("open store: no data directory for the SQLite database")
		}
		return OpenSQLite(filepath.Join(dataDir, "gateway.db"))
	case strings.HasPrefix(database, "postgres://"), strings.HasPrefix(database, "postgresql://"):
		return OpenPostgres(ctx, database)
	}
	// The value may hold a password: name only its scheme.
	scheme, _, ok := strings.Cut(database, "://")
	if !ok {
		scheme = "no scheme"
	}
	return nil, fmt.Errorf("open store: unsupported database (%s): leave --database empty for SQLite in the data directory, or give a postgres://… or postgresql://… URL", scheme)
}
