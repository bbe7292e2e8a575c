package auth_test

import (
	"testing"

	"github.com/switchyard-llm/switchyard/internal/leaktest"
)

func TestMain(m *testing.M) { leaktest.Main(m) }
