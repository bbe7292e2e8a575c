package main

import (
	"math"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/lab"
	"github.com/switchyard-llm/switchyard/loadgen"
)

// An answer that reports no cached tokens counts as none cached, as vLLM
// leaves prompt_tokens_details out when nothing was cached; when no answer
// reports any, the hit rate is unknown, an empty cell, not a measured 0.
func TestTraceRowCountsUnreportedCachedTokensAsNone(t *testing.T) {
	recs := []lab.TraceRecord{{Input: 100}, {Input: 100}}
	reqs := []loadgen.TraceRequest{{}, {At: time.Second}}
	served := func(cached int, reported bool) loadgen.TraceResult {
		return loadgen.TraceResult{TTFT: time.Millisecond, E2E: 2 * time.Millisecond, Usage: true, Prompt: 100,
			Cached: cached, CachedReported: reported, Completion: 1}
	}
	row, unreported := traceRow(recs, reqs, []loadgen.TraceResult{served(50, true), served(0, false)})
	if unreported != 1 || row.HitRate != 0.25 {
		t.Errorf("one answer of two reported 50 cached of 100: hit rate %v, unreported %d; want 0.25 and 1", row.HitRate, unreported)
	}
	row, unreported = traceRow(recs, reqs, []loadgen.TraceResult{served(0, false), served(0, false)})
	if unreported != 2 || !math.IsNaN(row.HitRate) || row.CSVRow()[3] != "" {
		t.Errorf("no answer reported cached tokens: hit rate %v (cell %q), unreported %d; want unknown", row.HitRate, row.CSVRow()[3], unreported)
	}
}
