// Package examples ships the example routing table inside the binary, since
// //go:embed cannot reach deploy/ from cmd/.
package examples

import _ "embed"

// Table is deploy/examples/table.json: the dev routing table, a flat object
// from KV key to value.
//
//go:embed table.json
var tableJSON []byte

// Table returns a copy of the dev routing table.
func Table() []byte { return append([]byte(nil), tableJSON...) }
