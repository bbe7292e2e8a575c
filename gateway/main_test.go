package gateway_test

import (
	"testing"

	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// TestMain fails the package when a goroutine outlives the tests: every one
// the gateway starts has an owner that stops it.
func TestMain(m *testing.M) { testkit.Main(m) }
