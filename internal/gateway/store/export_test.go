package store

import "context"

// Hooks for the external tests' migration suite.

func OpenSQLiteAt(path string, version int) (Store, error) { return openSQLite(path, version) }

func OpenPostgresAt(ctx context.Context, url string, version int) (Store, error) {
	return openPostgres(ctx, url, version)
}

// LatestVersion is the newest schema version of a backend ("sqlite" or
// "postgres").
func LatestVersion(backend string) int {
	m, err := migrations(backend)
	if err != nil {
		panic(err)
	}
	return len(m)
}
