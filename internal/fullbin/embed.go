//go:build !corral_full

package fullbin

import "embed"

// embedded holds bin/corral-full-HASH when go generate has built it; bin's
// README keeps the pattern matching on a clean checkout.
//
//go:embed bin
var embedded embed.FS
