package kvevents_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/switchyard-llm/switchyard/internal/kvevents"
)

// FuzzDecodeBatch: whatever an engine (or anyone who reaches its socket)
// sends, the decoder returns a batch or an error, never a panic, and a
// batch it accepts survives a round trip through the encoder.
func FuzzDecodeBatch(f *testing.F) {
	for _, name := range []string{"array-v0.9.bin", "map-v0.12.bin", "bytes-hashes.bin"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		batch, _, err := kvevents.DecodeBatch(b)
		if err != nil {
			return
		}
		for _, ev := range batch.Events {
			if ev.Kind == kvevents.BlockStored && len(ev.TokenIDs) != len(ev.Hashes)*ev.BlockSize {
				t.Fatalf("accepted %d tokens for %d blocks of %d", len(ev.TokenIDs), len(ev.Hashes), ev.BlockSize)
			}
		}
		for _, format := range []kvevents.Format{kvevents.FormatArray, kvevents.FormatMap} {
			again, _, err := kvevents.DecodeBatch(kvevents.AppendBatch(nil, &batch, format))
			if err != nil {
				t.Fatalf("re-encoded (%s) batch refused: %v", format, err)
			}
			if len(again.Events) != len(batch.Events) {
				t.Fatalf("re-encoded (%s): %d events, want %d", format, len(again.Events), len(batch.Events))
			}
		}
	})
}
