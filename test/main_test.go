package test

import (
	"testing"

	"github.com/switchyard-llm/switchyard/internal/leaktest"
)

// TestMain fails the package when a goroutine outlives the tests: every
// part started here, in process, must stop with its stack.
func TestMain(m *testing.M) { leaktest.Main(m) }
