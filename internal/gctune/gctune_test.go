package gctune

import (
	"runtime/debug"
	"testing"

	"github.com/switchyard-llm/switchyard/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

func TestPercentFollowsTheLiveHeap(t *testing.T) {
	const mib = 1 << 20
	cases := []struct {
		live uint64
		want int
	}{
		{0, Percent},
		{8 * mib, Percent},  // 64 MiB of room would be GOGC 800: capped
		{16 * mib, Percent}, // exactly 400
		{32 * mib, 200},
		{64 * mib, 100},
		{512 * mib, 100}, // never below Go's default
	}
	for _, c := range cases {
		if got := PercentFor(c.live); got != c.want {
			t.Errorf("PercentFor(%d MiB) = %d, want %d", c.live/mib, got, c.want)
		}
	}
}

func TestStartSetsPercentAndStops(t *testing.T) {
	t.Setenv("GOGC", "")
	prev := debug.SetGCPercent(100)
	defer debug.SetGCPercent(prev)
	stop := Start()
	got := debug.SetGCPercent(Percent)
	stop()
	stop() // a second stop (a deferred one after an explicit one) is harmless
	if got != Percent {
		t.Errorf("GOGC %d after Start with a small heap, want %d", got, Percent)
	}

	t.Setenv("GOGC", "150")
	debug.SetGCPercent(150)
	Start()()
	if got := debug.SetGCPercent(150); got != 150 {
		t.Errorf("GOGC %d after Start with GOGC=150 set, want it left alone", got)
	}
}
