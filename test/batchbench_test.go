package test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/loadgen"
)

// TestBatchBenchmark measures what a batch takes from and gives to the
// pool (`make bench-batch`, docs/benchmarks.md "Batches beside interactive
// traffic"): the pool's saturation rate, interactive traffic at 40 % of it
// alone, then the same traffic beside a 10,000-line batch. It reports the
// batch's lines per second against the spare capacity (saturation less the
// interactive rate) and the interactive p99 time to first token with and
// without the batch. It asserts only that the batch completes whole: the
// figures are for the document.
func TestBatchBenchmark(t *testing.T) {
	if os.Getenv("SWITCHYARD_BENCH_BATCH") == "" {
		t.Skip("make bench-batch runs this (minutes; meaningful on a quiet machine)")
	}
	const lines, maxTokens, share = 10_000, 16, 0.4
	st := startStack(t, devstack.Config{Speed: 1, Replicas: devstack.ReplicasNamed("l8-gen-0", "l8-gen-1")})
	url := st.GatewayURL() + "/v1/chat/completions"
	base := loadgen.Config{Targets: []string{url}, Model: "chat-small", MaxTokens: maxTokens, APIKey: "sk-default-dev", Seed: 1}
	// run returns the run's report; one stopped by ctx reports what it
	// measured until then.
	run := func(ctx context.Context, c loadgen.Config) (*loadgen.TargetReport, error) {
		r, err := loadgen.Run(ctx, c)
		if r == nil || (err != nil && ctx.Err() == nil) {
			return nil, err
		}
		return &r.Targets[0], nil
	}
	must := func(r *loadgen.TargetReport, err error) *loadgen.TargetReport {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return r
	}

	sat := base
	sat.Rate, sat.Concurrency, sat.Duration, sat.Warmup = 1, 1024, 15*time.Second, 3*time.Second // a closed loop: Rate unused
	saturation := must(run(context.Background(), sat)).OKRate

	inter := base
	inter.Rate, inter.Stream, inter.Duration, inter.Warmup = share*saturation, true, 30*time.Second, 3*time.Second
	alone := must(run(context.Background(), inter))

	c := client(st, "sk-default-dev")
	ctx, stop := context.WithCancel(context.Background())
	type report struct {
		r   *loadgen.TargetReport
		err error
	}
	beside := make(chan report, 1)
	inter.Duration, inter.Warmup = time.Hour, 0
	go func() {
		r, err := run(ctx, inter)
		beside <- report{r, err}
	}()
	b := runBatch(t, c, batchLines(lines, "chat-small"))
	start := time.Now()
	b = awaitBatch(t, c, b.ID, 30*time.Minute)
	took := time.Since(start)
	stop()
	w := <-beside
	with := must(w.r, w.err)
	if b.Status != "completed" || b.RequestCounts.Completed != lines {
		t.Fatalf("the batch: %s %+v", b.Status, b.RequestCounts)
	}
	rate := float64(lines) / took.Seconds()
	spare := saturation - inter.Rate
	t.Logf("\n| pool saturation | interactive rate | spare | batch of %d lines | batch lines/s | of spare | interactive p99 TTFT alone | with the batch | ratio | interactive errors alone / with |\n"+
		"|---|---|---|---|---|---|---|---|---|---|\n| %.0f/s | %.0f/s | %.0f/s | %v | %.0f | %.0f %% | %.1f ms | %.1f ms | %.2f× | %d / %d |",
		lines, saturation, inter.Rate, spare, took.Round(time.Second), rate, 100*rate/spare,
		alone.TTFT.P99.Ms(), with.TTFT.P99.Ms(), with.TTFT.P99.Ms()/alone.TTFT.P99.Ms(), alone.Errors, with.Errors)
	t.Logf("interactive errors alone %v, with the batch %v", alone.ErrorsBy, with.ErrorsBy)
}
