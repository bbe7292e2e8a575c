// Package examples ships the example routing table inside the binary, since
// //go:embed cannot reach deploy/ from cmd/.
package examples

import (
	_ "embed"
	"encoding/json"
)

// Table is deploy/examples/table.json: the dev routing table, a flat object
// from KV key to value.
//
//go:embed table.json
var tableJSON []byte

// Table returns a copy of the dev routing table.
func Table() []byte { return append([]byte(nil), tableJSON...) }

// Flat returns the dev routing table as key → value, the form kv.Seed and
// table.FromFlat take. The file is embedded at build time and its every
// value is validated by the table package's tests, so a decoding failure is
// a build defect and panics.
func Flat() map[string]json.RawMessage {
	var flat map[string]json.RawMessage
	if err := json.Unmarshal(tableJSON, &flat); err != nil {
		panic("deploy/examples/table.json: " + err.Error())
	}
	return flat
}
