package loadgen_test

import (
	"testing"

	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// TestMain fails the package when a goroutine outlives the tests.
func TestMain(m *testing.M) { testkit.Main(m, testkit.IgnoreZMQPub()) }
