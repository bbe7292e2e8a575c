package test

import (
	"context"
	"math"
	"sort"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/loadgen"
)

// TestLoadViewAgeAt200RPS drives `switchyard dev` (its default fleet, at
// real speed) with 200 requests a second and reads the age of the load view
// each decision used from the gateway's /metrics, the exposition a
// Prometheus server scrapes. It reports the p99 as a figure
// (docs/benchmarks.md, "Load deltas"); it checks only that every request
// served had its decision measured. The age itself is a figure, not a
// check: on a starved machine it is as old as the heartbeats' delivery.
func TestLoadViewAgeAt200RPS(t *testing.T) {
	if testing.Short() {
		t.Skip("a 15-second run at 200 requests/s")
	}
	st := startStack(t, devstack.Config{Speed: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const rate, run = 200, 10 * time.Second
	before := viewAges(t, st)
	rep, err := loadgen.Run(ctx, loadgen.Config{
		Targets: []string{st.GatewayURL()}, Rate: rate, Duration: run, Warmup: 3 * time.Second,
		Model: "chat-small", MaxTokens: 16, Seed: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	after := viewAges(t, st)
	n := after.count - before.count
	// Only a decision that placed a request has a load view; a request
	// refused under a starved machine's load has none, so the check is
	// against the requests served, each of which was decided.
	tr := rep.Targets[0]
	if tr.Errors > 0 {
		t.Logf("%d of %d requests failed: %v, by code %v; %v", tr.Errors, tr.Sent, tr.ErrorsBy, tr.CodesBy, tr.ErrorSamples)
	}
	if n < uint64(tr.OK) {
		t.Errorf("%d decisions measured, %d requests served", n, tr.OK)
	}
	t.Logf("load view age at %d requests/s over %v: %d decisions, p50 ≤ %v s, p90 ≤ %v s, p99 ≤ %v s (bucket bounds)",
		rate, run+3*time.Second, n, after.quantile(before, 0.5), after.quantile(before, 0.9), after.quantile(before, 0.99))
}

// ages is the cumulative histogram of switchyard_broker_load_view_age_seconds,
// summed over the deciders.
type ages struct {
	count   uint64
	buckets map[float64]uint64 // upper bound → cumulative count
}

func viewAges(t *testing.T, st *devstack.Stack) ages {
	t.Helper()
	a := ages{buckets: map[float64]uint64{}}
	mf := testkit.Scrape(t, st.GatewayURL()+"/metrics")["switchyard_broker_load_view_age_seconds"]
	if mf == nil || mf.GetType() != dto.MetricType_HISTOGRAM {
		t.Fatal("no histogram switchyard_broker_load_view_age_seconds on /metrics")
	}
	for _, m := range mf.GetMetric() {
		h := m.GetHistogram()
		a.count += h.GetSampleCount()
		for _, b := range h.GetBucket() {
			a.buckets[b.GetUpperBound()] += b.GetCumulativeCount()
		}
	}
	return a
}

// quantile is the upper bound of the bucket holding quantile q of the
// observations made since base.
func (a ages) quantile(base ages, q float64) float64 {
	n := a.count - base.count
	bounds := make([]float64, 0, len(a.buckets))
	for b := range a.buckets {
		bounds = append(bounds, b)
	}
	sort.Float64s(bounds)
	for _, b := range bounds {
		if float64(a.buckets[b]-base.buckets[b]) >= q*float64(n) {
			return b
		}
	}
	return math.Inf(1)
}
