// Package gctune sets the garbage collector for a router process. A router
// keeps a small live heap (tables, prefix maps, buffers: about 13 MiB under
// load) and allocates per request, so with Go's default GOGC=100 it collects
// very often: the collector was about half the CPU samples of the stack
// under 500 requests/s. A higher target trades a few tens of MiB for far
// fewer collections.
package gctune

import (
	"os"
	"runtime/debug"
)

// Percent is the GOGC the switchyard binary runs with unless GOGC is set.
const Percent = 400

// Apply sets Percent, unless the operator set GOGC in the environment.
func Apply() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(Percent)
	}
}
