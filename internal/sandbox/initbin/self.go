//go:build corral_selfinit

package initbin

import "embed"

// embedded is empty: a corral built with the corral_selfinit tag always
// re-executes itself as the init (the tests build one to keep that path
// working).
var embedded embed.FS
