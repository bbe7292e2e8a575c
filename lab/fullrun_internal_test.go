//go:build !race

package lab

import "testing"

// TestLabPrefixBenchFullRunTableIsCurrent: the quick report prints the full
// run's every-arm table from prefixBenchFullRun; this runs the full prefix
// benchmark again and fails when the table no longer says what it measures. Without -race only (make
// test-lab): the detector slows the simulator about tenfold.
func TestLabPrefixBenchFullRunTableIsCurrent(t *testing.T) {
	if testing.Short() {
		t.Skip("experiment tests skipped in -short")
	}
	t.Parallel()
	r := PrefixBench(Options{Scale: Full, Seed: 1})
	if got := r.EveryArmAgainstOracle(); got != prefixBenchFullRun {
		t.Errorf("the full run's every-arm table in lab/prefixbench_oracle.go is stale; switchyard lab prefix-bench --workers 1 measures:\n%s", got)
	}
}
