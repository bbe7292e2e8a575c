package test

import (
	"testing"

	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// TestMain fails the package when a goroutine outlives the tests: every
// part started here, in process, must stop with its stack.
func TestMain(m *testing.M) { testkit.Main(m, testkit.IgnoreZMQPub()) }
