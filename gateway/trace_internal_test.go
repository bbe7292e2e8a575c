package gateway

import (
	"strings"
	"testing"
)

func TestValidTraceparent(t *testing.T) {
	for tp, want := range map[string]bool{
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01": true,
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00": true,
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01": false, // zero trace id
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01": false, // zero span id
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01": false, // uppercase
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01": false, // invalid version
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7":    false,
		"":                                false,
		"00-" + strings.Repeat("a", 1000): false,
	} {
		if got := validTraceparent(tp); got != want {
			t.Errorf("validTraceparent(%.60q) = %v, want %v", tp, got, want)
		}
	}
	if tp := newTraceparent(); !validTraceparent(tp) {
		t.Errorf("newTraceparent() = %q is not valid", tp)
	}
}
