package loadgen_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/loadgen"
)

func ramp(n int) []time.Duration {
	s := make([]time.Duration, n)
	for i := range s {
		s[i] = time.Duration(i+1) * time.Millisecond
	}
	return s
}

func TestPercentile(t *testing.T) {
	cases := []struct {
		name string
		n    int
		p    float64
		want time.Duration
	}{
		{"empty", 0, 50, 0},
		{"one sample", 1, 99, 1 * time.Millisecond},
		{"p0 is the minimum", 100, 0, 1 * time.Millisecond},
		{"p50 of 100", 100, 50, 50 * time.Millisecond},
		{"p90 of 100", 100, 90, 90 * time.Millisecond},
		{"p99 of 100 is not the maximum", 100, 99, 99 * time.Millisecond},
		{"p100 is the maximum", 100, 100, 100 * time.Millisecond},
		{"p99.9 of 1000", 1000, 99.9, 999 * time.Millisecond},
		{"p99 of 10 rounds up to the maximum", 10, 99, 10 * time.Millisecond},
		{"p50 of 3 is the middle", 3, 50, 2 * time.Millisecond},
		{"p50 of 4 is the lower middle", 4, 50, 2 * time.Millisecond},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := loadgen.Percentile(ramp(c.n), c.p); got != c.want {
				t.Fatalf("Percentile(1..%d ms, %g) = %v, want %v", c.n, c.p, got, c.want)
			}
		})
	}
}

func TestSummarizeSortsAndSummarizes(t *testing.T) {
	s := ramp(100)
	// Reverse so that Summarize has to sort.
	for i, j := 0, len(s)-1; i < j; i, j = i+1, j-1 {
		s[i], s[j] = s[j], s[i]
	}
	sum := loadgen.Summarize(s)
	want := loadgen.Summary{
		N: 100, Mean: loadgen.Dur(50500 * time.Microsecond), Min: loadgen.Dur(time.Millisecond),
		P50: loadgen.Dur(50 * time.Millisecond), P90: loadgen.Dur(90 * time.Millisecond), P99: loadgen.Dur(99 * time.Millisecond),
		P999: loadgen.Dur(100 * time.Millisecond), Max: loadgen.Dur(100 * time.Millisecond),
	}
	if sum != want {
		t.Fatalf("Summarize = %+v, want %+v", sum, want)
	}
}

func TestDurIsMillisecondsInJSON(t *testing.T) {
	b, err := json.Marshal(loadgen.Dur(1500 * time.Microsecond))
	if err != nil || string(b) != "1.5" {
		t.Fatalf("Marshal(1.5ms) = %s, %v; want 1.5", b, err)
	}
	var d loadgen.Dur
	if err := json.Unmarshal([]byte("0.25"), &d); err != nil || d.D() != 250*time.Microsecond {
		t.Fatalf("Unmarshal(0.25) = %v, %v; want 250µs", d.D(), err)
	}
}

func TestSlotOffsetInterleavesTargets(t *testing.T) {
	// Two targets at 100/s each: slots every 5ms, alternating targets, so
	// each target still gets one slot every 10ms.
	for j, want := range []time.Duration{0, 5 * time.Millisecond, 10 * time.Millisecond, 15 * time.Millisecond} {
		if got := loadgen.SlotOffset(j, 2, 100); got != want {
			t.Errorf("SlotOffset(%d, 2, 100) = %v, want %v", j, got, want)
		}
	}
}
