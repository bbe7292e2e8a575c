package decider

import (
	"testing"

	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// TestMain fails the package when a goroutine outlives the tests: every one
// the broker starts has an owner that stops it.
func TestMain(m *testing.M) { testkit.Main(m) }
