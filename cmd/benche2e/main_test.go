package main

import (
	"testing"

	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// TestMain fails the package when a goroutine outlives the tests (but for
// the one zmq4 leaks: the floor test runs the dev stack, whose replicas
// publish KV events on ZMQ).
func TestMain(m *testing.M) { testkit.Main(m, testkit.IgnoreZMQPub()) }
