package lab

import (
	"testing"
	"time"
)

// TestReplayRowCountsRefusedAtTheLongest: a refused request counts as a
// miss at the run's longest TTFT, so an arm cannot look faster by refusing.
func TestReplayRowCountsRefusedAtTheLongest(t *testing.T) {
	r := &Result{Requests: make([]*Request, 4)}
	for i := range r.Requests {
		r.Requests[i] = &Request{PromptTokens: 100, MaxTokens: 2}
	}
	r.Outcomes = []Outcome{
		{TTFT: 100 * time.Millisecond, Cached: 50},
		{TTFT: 200 * time.Millisecond},
		{TTFT: 300 * time.Millisecond},
		{TTFT: -1, Failed: FailQueueFull},
	}
	r.Gaps, r.GapOf = []float32{10, 20}, []int32{0, 0}
	row := replayRow(r)
	if row.Refused != 1 || row.P99 != 300 || row.P50 != 200 || row.HitRate != 50.0/300 {
		t.Errorf("%+v: want 1 refused, p99 300 (the longest), p50 200, hit rate 1/6", row)
	}
	if row.E2E99 != 300 || row.E2E50 != 200 {
		t.Errorf("e2e p50 %v p99 %v, want 200 and 300 (TTFT plus the gaps)", row.E2E50, row.E2E99)
	}
	if row.E2E50 = 0; row.ITL99 != 20 {
		t.Errorf("ITL p99 %v, want 20", row.ITL99)
	}
}
