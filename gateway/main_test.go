package gateway_test

import (
	"testing"

	"github.com/switchyard-llm/switchyard/internal/leaktest"
)

// TestMain fails the package when a goroutine outlives the tests: every one
// the gateway starts has an owner that stops it.
func TestMain(m *testing.M) { leaktest.Main(m) }
