package telemetry_test

import (
	"testing"

	"github.com/switchyard-llm/switchyard/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }
