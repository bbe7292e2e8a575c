// Package leaktest is the TestMain of packages whose parts start
// goroutines: the package fails when one outlives its tests.
package leaktest

import (
	"fmt"
	"net/http"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// Main runs the tests, then fails the package when a goroutine is left. The
// idle keep-alive connections of the tests' own HTTP client are not leaks,
// so they are closed first.
func Main(m *testing.M) {
	code := m.Run()
	http.DefaultClient.CloseIdleConnections()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
