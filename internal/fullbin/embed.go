//go:build !corral_full

package fullbin

import (
	"embed"
	"fmt"
)

// embedded holds bin/corral-full-HASH when go generate has built it; bin's
// README keeps the pattern matching on a clean checkout.
//
//go:embed bin
var embedded embed.FS

// Path returns the full program under stateDir, writing it there on first
// use.
func Path(stateDir string) (string, error) {
	path, err := program.Path(stateDir)
	if err != nil {
		return "", fmt.Errorf("full program: %w", err)
	}
	if path == "" {
		return "", ErrNotCarried
	}
	return path, nil
}
