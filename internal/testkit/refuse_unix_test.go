//go:build unix

package testkit_test

import (
	"errors"
	"net"
	"syscall"
	"testing"

	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// The address refuses connections, and its port is taken while the test
// runs: nobody can start listening there.
func TestRefusingRefusesAndHoldsItsPort(t *testing.T) {
	addr := testkit.Refusing(t)
	if c, err := net.Dial("tcp", addr); !errors.Is(err, syscall.ECONNREFUSED) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("dialing %s: %v, want connection refused", addr, err)
	}
	if ln, err := net.Listen("tcp", addr); err == nil {
		ln.Close()
		t.Fatalf("listened on %s: the port is not held", addr)
	}
}
