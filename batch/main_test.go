package batch_test

import (
	"testing"

	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// TestMain fails the package when a goroutine outlives the tests: the
// batcher's pullers, lines and supervision stop with it. The tests put
// their input files in the object store (IgnoreObjectPutRace).
func TestMain(m *testing.M) { testkit.Main(m, testkit.IgnoreObjectPutRace()) }
