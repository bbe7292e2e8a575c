package budget_test

import (
	"testing"

	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// The tests start an embedded NATS server: none of its goroutines, nor a
// connection's, may outlive them.
func TestMain(m *testing.M) { testkit.Main(m) }
