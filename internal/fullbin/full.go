//go:build corral_full

package fullbin

import (
	"embed"
	"os"
)

// embedded is empty: the full program is what the lean one carries, and
// carries nothing of the kind itself.
var embedded embed.FS

func init() {
	leanExecutable = os.Getenv(envLean)
	os.Unsetenv(envLean)
}

// Path returns this program's own path: it is the full program.
func Path(string) (string, error) { return os.Executable() }
