package test

import (
	"testing"

	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// TestMain fails the package when a goroutine outlives the tests: every
// part started here, in process, must stop with its stack. The stacks'
// gateways store uploaded files in the object store, so nats.go's
// object-put race (IgnoreObjectPutRace) can strand its watcher here too;
// the region tests' copy of the table is a mirror (IgnoreMirrorSetup).
func TestMain(m *testing.M) {
	testkit.Main(m, testkit.IgnoreZMQPub(), testkit.IgnoreObjectPutRace(), testkit.IgnoreMirrorSetup())
}
