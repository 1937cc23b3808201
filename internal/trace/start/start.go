// Package start reads the clock as early as a Go program can: it imports
// only package time, and Go initialises packages in the order of their
// import paths as soon as their imports are, so this one runs among the
// first few dozen, before the hundreds of packages corral links (OPA,
// protobuf, the CLI) spend their milliseconds initialising. The trace's
// first step starts here rather than when package trace itself, with its
// heavier imports, is reached.
package start

import "time"

// At is when this process's package initialisation reached this package.
var At = time.Now()
