package test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/internal/stages"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/loadgen"
)

// TestBatchBenchmark measures what a batch takes from and gives to the
// pool (`make bench-batch`, docs/benchmarks.md "Batches beside interactive
// traffic"): the pool's saturation rate, interactive traffic at 40 % of it
// alone, then the same traffic beside a 10,000-line batch of the same
// request shape. It reports the batch's lines per second against the spare
// capacity (saturation less the interactive rate) and the interactive p99
// time to first token with and without the batch, each against its target
// (half the spare capacity; within 1.2×). The batch phase stops at
// batchBenchCap so the run ends within six minutes: the lines completed by
// then give its rate. It fails only when lines fail or the run breaks:
// the figures are for the document, and meaningful on a quiet machine
// only (it prints the load average). It prints how the saturation was
// measured, so that runs compare, and the refusals by priority:
// interactive requests refused (429 or 503) alone and beside the batch,
// and the batch's refusals (each tried again).
func TestBatchBenchmark(t *testing.T) {
	if os.Getenv("SWITCHYARD_BENCH_BATCH") == "" {
		t.Skip("make bench-batch runs this (about five minutes; meaningful on a quiet machine)")
	}
	const lines, maxTokens, share = 10_000, 16, 0.4
	const batchBenchCap = 3*time.Minute + 30*time.Second
	loadAtStart := loadAverage()
	rec := stages.New(1)
	st := startStack(t, devstack.Config{Speed: 1, Replicas: devstack.ReplicasNamed("l8-gen-0", "l8-gen-1"), Stages: rec})
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
	satReport := must(run(context.Background(), sat))
	saturation := satReport.OKRate

	inter := base
	inter.Rate, inter.Stream, inter.Duration, inter.Warmup = share*saturation, true, 30*time.Second, 3*time.Second
	rec.Reset()
	alone := must(run(context.Background(), inter))
	stagesAlone := stageTable(t, st, "interactive alone")
	rec.Reset()

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
	b := runBatch(t, c, benchLines(lines, "chat-small", maxTokens))
	start := time.Now()
	pacing := samplePacing(t, st.Registry(), 250*time.Millisecond)
	b, done := batchUntil(t, c, b.ID, start.Add(batchBenchCap))
	took := time.Since(start)
	paced := pacing()
	stop()
	w := <-beside
	with := must(w.r, w.err)
	stagesWith := stageTable(t, st, "interactive beside the batch")
	if done {
		if b.Status != "completed" || b.RequestCounts.Completed != lines {
			t.Fatalf("the batch: %s %+v", b.Status, b.RequestCounts)
		}
	} else if _, err := c.Batches.Cancel(context.Background(), b.ID); err != nil {
		t.Errorf("cancel the batch cut at %v: %v", batchBenchCap, err)
	}
	if b.RequestCounts.Failed > 0 {
		t.Errorf("the batch: %d lines failed (%+v)", b.RequestCounts.Failed, b.RequestCounts)
	}
	completed := b.RequestCounts.Completed
	rate := float64(completed) / took.Seconds()
	spare := saturation - inter.Rate
	ratio := with.TTFT.P99.Ms() / alone.TTFT.P99.Ms()
	batchCell := fmt.Sprintf("%d lines in %v", completed, took.Round(time.Second))
	if !done {
		batchCell += fmt.Sprintf(" (cut at %v)", batchBenchCap)
	}
	t.Logf("\n| pool saturation | interactive rate | spare | batch of %d lines | batch lines/s | of spare | interactive p99 TTFT alone | with the batch | ratio | interactive errors alone / with |\n"+
		"|---|---|---|---|---|---|---|---|---|---|\n| %.0f/s | %.0f/s | %.0f/s | %s | %.0f | %.0f %% | %.1f ms | %.1f ms | %.2f× | %d / %d |",
		lines, saturation, inter.Rate, spare, batchCell, rate, 100*rate/spare,
		alone.TTFT.P99.Ms(), with.TTFT.P99.Ms(), ratio, alone.Errors, with.Errors)
	t.Logf("interactive errors alone %v, with the batch %v", alone.ErrorsBy, with.ErrorsBy)
	t.Logf("batch throughput: %.1f lines/s, %.0f %% of the spare %.1f/s (target: at least 50 %%): %s",
		rate, 100*rate/spare, spare, metOrNot(rate >= spare/2))
	t.Logf("interactive p99 TTFT: %.1f ms with the batch, %.1f ms without, %.2f× (target: at most 1.2×): %s",
		with.TTFT.P99.Ms(), alone.TTFT.P99.Ms(), ratio, metOrNot(ratio <= 1.2))
	t.Logf("the batcher's pacing: window %.1f lines on average, %.1f in flight; its load view showed %.1f free batch slots, %.1f interactive requests, %.1f kept for them, a share of %.1f; %s",
		paced[0], paced[1], paced[2], paced[3], paced[4], paced[5], refusals(st.Registry()))
	t.Logf("saturation measured as: %d non-streamed requests of at most %d tokens kept open at once (a closed loop) through the gateway for %v after a %v warm-up, on 2 simulated replicas (l8-gen-0, l8-gen-1, speed 1, engines scheduling by priority); the answers per second: %.1f/s (%d answered, %d errors %v)",
		sat.Concurrency, maxTokens, sat.Duration, sat.Warmup, saturation, satReport.OK, satReport.Errors, satReport.ErrorsBy)
	interactiveRefused := func(r *loadgen.TargetReport) int { return r.ErrorsBy["429"] + r.ErrorsBy["503"] }
	t.Logf("refusals by priority: interactive %d alone, %d beside the batch (%v); batch %.0f (%s): %s",
		interactiveRefused(alone), interactiveRefused(with), with.CodesBy, testkit.Sum(st.Registry(), "switchyard_batch_refusals_total", nil),
		"every one tried again, never a failed line",
		map[bool]string{true: "no interactive request refused because of batch work", false: "interactive requests refused beside the batch"}[interactiveRefused(with) <= interactiveRefused(alone)])
	t.Logf("where the interactive requests' time went (batch lines do not pass the gateway, so they are not in these tables):\n%s%s", stagesAlone, stagesWith)
	t.Logf("load average at the start %s, at the end %s: figures are a measurement only below 1.0", loadAtStart, loadAverage())
}

// stageTable is the stage table of the requests recorded since the
// recorder's last reset.
func stageTable(t *testing.T, st *devstack.Stack, title string) string {
	t.Helper()
	sum, err := st.StageSummary()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	sum.WriteTable(&b, title)
	return b.String()
}

// pacingSeries are the batcher's series samplePacing averages: its window,
// its lines in flight, and the room its load view shows.
var pacingSeries = []struct {
	name   string
	labels map[string]string
}{
	{"switchyard_batch_window", nil},
	{"switchyard_batch_inflight", nil},
	{"switchyard_batch_room", map[string]string{"kind": "free"}},
	{"switchyard_batch_room", map[string]string{"kind": "interactive"}},
	{"switchyard_batch_room", map[string]string{"kind": "reserve"}},
	{"switchyard_batch_room", map[string]string{"kind": "share"}},
}

// samplePacing samples pacingSeries every `every` until the returned
// function is called, which returns their means in that order.
func samplePacing(t *testing.T, g prometheus.Gatherer, every time.Duration) (means func() []float64) {
	quit, out := make(chan struct{}), make(chan []float64, 1)
	var once sync.Once
	stop := func() { once.Do(func() { close(quit) }) }
	t.Cleanup(stop) // a test that ends early stops the sampler too
	go func() {
		sum := make([]float64, len(pacingSeries))
		n := 0
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				for i := range sum {
					sum[i] /= float64(max(n, 1))
				}
				out <- sum
				return
			case <-tick.C:
				for i, s := range pacingSeries {
					sum[i] += testkit.Sum(g, s.name, s.labels)
				}
				n++
			}
		}
	}()
	return func() []float64 {
		stop()
		return <-out
	}
}

// refusals lists the batch's refusals by where they came from, status and
// code (switchyard_batch_refusals_total).
func refusals(g prometheus.Gatherer) string {
	mfs, err := g.Gather()
	if err != nil {
		return "refusals: " + err.Error()
	}
	var rows []string
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "switchyard_batch_refusals_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			v := m.GetCounter().GetValue()
			total += v
			rows = append(rows, fmt.Sprintf("%.0f from the %s (%s %s)", v, l["from"], l["status"], l["code"]))
		}
	}
	sort.Strings(rows)
	return fmt.Sprintf("refusals: %.0f in all; %s", total, strings.Join(rows, ", "))
}

// benchLines is a chat batch of n lines of the interactive traffic's shape.
func benchLines(n int, model string, maxTokens int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, `{"custom_id":"req-%d","method":"POST","url":"/v1/chat/completions","body":{"model":%q,"max_tokens":%d,"messages":[{"role":"user","content":"line %d of a batch"}]}}`+"\n",
			i, model, maxTokens, i)
	}
	return b.String()
}

// batchUntil polls batch id until it ends or the deadline passes, and
// returns it as last read and whether it ended.
func batchUntil(t *testing.T, c *openai.Client, id string, deadline time.Time) (*openai.Batch, bool) {
	t.Helper()
	var last *openai.Batch
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		b, err := c.Batches.Get(context.Background(), id)
		switch {
		case err != nil:
			t.Logf("batches.retrieve: %v", err)
		case b.Status == "completed" || b.Status == "failed" || b.Status == "expired" || b.Status == "cancelled":
			return b, true
		default:
			last = b
		}
		if !time.Now().Before(deadline) {
			if last == nil {
				t.Fatalf("batch %s: never read", id)
			}
			return last, false
		}
		<-tick.C
	}
}

func metOrNot(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

// loadAverage is the machine's 1, 5 and 15-minute load averages.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
