//go:build !corral_selfinit

package initbin

import "embed"

// embedded holds bin/corral-init when go generate has built it; bin's
// README keeps the pattern matching on a clean checkout.
//
//go:embed bin
var embedded embed.FS
