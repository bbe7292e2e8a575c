package budget

import (
	"testing"
	"unsafe"
)

// The holds map keeps a Hold in its slot, without an allocation of its
// own, only up to 128 bytes.
func TestHoldFitsAMapSlot(t *testing.T) {
	if n := unsafe.Sizeof(Hold{}); n > 128 {
		t.Fatalf("a Hold is %d bytes: the holds map would allocate one per reservation", n)
	}
}
