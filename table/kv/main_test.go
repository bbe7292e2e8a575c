package kv_test

import (
	"testing"

	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// TestMain fails the package when a goroutine outlives the tests (a
// region's copy is a mirror, and one is deleted).
func TestMain(m *testing.M) {
	testkit.Main(m, testkit.IgnoreSourceCleanup(), testkit.IgnoreMirrorSetup())
}
