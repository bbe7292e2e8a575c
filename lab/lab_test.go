package lab_test

import (
	"image/png"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/enginesim"
	"github.com/switchyard-llm/switchyard/lab"
	"github.com/switchyard-llm/switchyard/subjects"
)

func smallScenario(t *testing.T, seed uint64) *lab.Scenario {
	t.Helper()
	w := lab.Workload{
		Rate: 6, Duration: 40 * time.Second,
		SystemPrompts: 8, SystemTokens: 600, SystemZipf: 1.3, SystemShare: 0.8,
		Turns: 2, ThinkTime: 3 * time.Second, UserTokens: 100, OutputTokens: 50, SizeSigma: 0.5, Tenants: 3,
	}
	reps := []lab.Replica{
		{ID: "r-0", Pool: "general", Engine: lab.Profile()},
		{ID: "r-1", Pool: "general", Engine: lab.Profile()},
		{ID: "r-2", Pool: "general", Engine: lab.Profile()},
	}
	snap, err := lab.BuildTable(reps, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &lab.Scenario{
		Replicas: reps, Requests: w.Generate(seed), Routers: 2, Horizon: 40 * time.Second, SLO: time.Second, Seed: seed,
		NewPicker: func(i int) lab.Picker { return lab.NewSwitchyard(snap, "b") },
	}
}

func TestRunIsDeterministic(t *testing.T) {
	a, b := lab.Run(smallScenario(t, 7)), lab.Run(smallScenario(t, 7))
	if len(a.Outcomes) < 100 {
		t.Fatalf("only %d requests", len(a.Outcomes))
	}
	if !reflect.DeepEqual(a.Outcomes, b.Outcomes) || a.Imbalance != b.Imbalance {
		t.Fatal("same seed, different outcomes")
	}
	c := lab.Run(smallScenario(t, 8))
	if reflect.DeepEqual(a.Outcomes, c.Outcomes) {
		t.Fatal("different seeds, same outcomes")
	}
	s := a.Summarize(nil)
	if s.Served != s.N || s.N == 0 || s.HitRate <= 0 || s.P99 < s.P50 {
		t.Fatalf("implausible summary: %+v", s)
	}
}

func TestExperimentIsDeterministic(t *testing.T) {
	if raceEnabled {
		t.Skip("runs without -race")
	}
	t.Parallel()
	a, b := lab.LongCtx(tiny), lab.LongCtx(tiny)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("same seed, different results:\n%+v\n%+v", a, b)
	}
	o := tiny
	o.Workers = 1 // the number of workers must not change anything
	if c := lab.LongCtx(o); !reflect.DeepEqual(a, c) {
		t.Fatal("one worker gave different results")
	}
}

func TestWorkloadPrefixes(t *testing.T) {
	w := lab.Workload{
		Rate: 5, Duration: 120 * time.Second, SystemPrompts: 4, SystemTokens: 500, SystemZipf: 2, SystemShare: 1,
		Turns: 4, ThinkTime: 2 * time.Second, UserTokens: 80, OutputTokens: 40, SizeSigma: 0.5,
		Tenants: 3, Adapters: true, LongShare: 0.05, LongTokens: 20000,
	}
	reqs := w.Generate(3)
	if !reflect.DeepEqual(reqs, w.Generate(3)) {
		t.Fatal("same seed, different workload")
	}
	if rate := float64(len(reqs)) / 120; rate < 3.5 || rate > 6.5 {
		t.Errorf("%.2f req/s generated, want about 5", rate)
	}
	if !slices.IsSortedFunc(reqs, func(a, b *lab.Request) int { return int(a.At - b.At) }) {
		t.Error("requests not in arrival order")
	}
	byConv := map[string]*lab.Request{}
	var long, multi int
	for _, q := range reqs {
		// The router's 256-character blocks end where every fourth
		// 16-token engine block ends, so they name the same prefixes.
		for i, h := range q.Prefix {
			if h != q.Blocks[4*i+3] {
				t.Fatalf("router block %d does not match engine block %d", i, 4*i+3)
			}
		}
		if want := min(q.PromptTokens/16, 4*lab.PrefixMaxBlocks) / 4; len(q.Prefix) != want {
			t.Fatalf("%d router blocks for %d tokens, want %d", len(q.Prefix), q.PromptTokens, want)
		}
		if q.Long {
			long++
			continue
		}
		if !strings.HasPrefix(q.Lora, "lora-") || "lora-"+q.Tenant[1:] != q.Lora {
			t.Fatalf("tenant %s has adapter %q", q.Tenant, q.Lora)
		}
		// A later turn's prompt extends the earlier one: its chain starts
		// with the earlier chain.
		if prev := byConv[q.Conversation]; prev != nil && q.Conversation != "" {
			multi++
			if q.PromptTokens <= prev.PromptTokens || !slices.Equal(q.Blocks[:len(prev.Blocks)], prev.Blocks) {
				t.Fatalf("conversation %s: turn does not extend the previous prompt", q.Conversation)
			}
		}
		byConv[q.Conversation] = q
	}
	if long == 0 || multi == 0 {
		t.Fatalf("long %d, later turns %d: want some of each", long, multi)
	}
}

func beat(p lab.Picker, id string, kv float64, waiting int, now time.Time) {
	p.ObserveHeartbeat(&subjects.Heartbeat{Replica: id, Model: lab.ModelID, Version: lab.Version, Pool: "general",
		State: subjects.StateReady, KVUsage: kv, Waiting: waiting, MaxBatch: 32, MaxQueue: 16}, now)
}

func TestExcludeSaturatedHidesReplicas(t *testing.T) {
	reps := []lab.Replica{{ID: "r-0", Pool: "general", Engine: lab.Profile()}, {ID: "r-1", Pool: "general", Engine: lab.Profile()}}
	snap, err := lab.BuildTable(reps, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := lab.Epoch()
	rng := rand.New(rand.NewPCG(1, 2))
	req := &lab.Request{Tenant: "default", PromptTokens: 100, MaxTokens: 10}
	deprio := lab.NewSwitchyard(snap, "b")
	var traced []bool
	ex := &lab.ExcludeSaturated{Picker: lab.NewSwitchyard(snap, "b"), Saturation: snap.Policy.SaturationKV,
		Trace: func(_ time.Time, _ string, excluded bool) { traced = append(traced, excluded) }}
	for _, p := range []lab.Picker{deprio, ex} {
		beat(p, "r-0", 0.97, 0, now)
		beat(p, "r-1", 0.20, 0, now)
	}
	for range 20 {
		if pk := ex.Pick(req, now, rng); pk.Replica != "r-1" {
			t.Fatalf("exclude picked %+v, want r-1", pk)
		}
	}
	if !slices.Equal(traced, []bool{true, false}) {
		t.Fatalf("trace %v", traced)
	}
	// Both saturated: the policy still routes (deprioritized, not
	// excluded); the wrapper has no candidate left.
	for _, p := range []lab.Picker{deprio, ex} {
		beat(p, "r-1", 0.99, 0, now)
	}
	if pk := deprio.Pick(req, now, rng); pk.Err != nil || pk.Replica == "" {
		t.Fatalf("deprioritize rejected: %+v", pk)
	}
	if pk := ex.Pick(req, now, rng); pk.Err == nil || pk.Err.Code != subjects.CodeNoReplicas {
		t.Fatalf("exclude with every replica saturated: %+v, want 503 no_replicas", pk)
	}
}

func TestBaselinePickers(t *testing.T) {
	ids := []string{"a", "b", "c"}
	snap, err := lab.BuildTable(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	pol := snap.Policy
	now := lab.Epoch()
	rng := rand.New(rand.NewPCG(3, 4))
	req := &lab.Request{PromptTokens: 10, MaxTokens: 1}
	rr := lab.NewRoundRobin(ids, pol)
	if pk := rr.Pick(req, now, rng); pk.Err == nil {
		t.Fatalf("no heartbeat yet, got %+v", pk)
	}
	ll := lab.NewLeastLoaded(ids, pol, false)
	llf := lab.NewLeastLoaded(ids, pol, true)
	p2 := lab.NewPowerOfTwo(ids, pol)
	for _, p := range []lab.Picker{rr, ll, llf, p2} {
		beat(p, "a", 0.5, 0, now)
		beat(p, "b", 0.1, 0, now)
		beat(p, "c", 0.3, 0, now)
	}
	var got []string
	for range 6 {
		got = append(got, rr.Pick(req, now, rng).Replica)
	}
	if !slices.Equal(got[:3], got[3:]) || len(slices.Compact(slices.Sorted(slices.Values(got)))) != 3 {
		t.Fatalf("round-robin order %v", got)
	}
	for range 5 {
		if pk := ll.Pick(req, now, rng); pk.Replica != "b" {
			t.Fatalf("least-loaded picked %s, want b", pk.Replica)
		}
	}
	// Counting its own requests, least-loaded moves on once b's in-flight
	// requests outweigh the kv gap to c.
	seen := map[string]int{}
	for range 200 {
		seen[llf.Pick(req, now, rng).Replica]++
	}
	if seen["c"] == 0 || seen["b"] < seen["c"] {
		t.Fatalf("least-loaded with in-flight spread %v", seen)
	}
	seen = map[string]int{}
	for range 300 {
		seen[p2.Pick(req, now, rng).Replica]++
	}
	if seen["a"] != 0 && seen["a"] >= seen["b"] {
		t.Fatalf("power of two favoured the loaded replica: %v", seen)
	}
	// A replica whose heartbeat is older than dead_after is no candidate.
	later := now.Add(time.Duration(pol.DeadAfter))
	beat(rr, "a", 0.5, 0, later)
	for range 4 {
		if pk := rr.Pick(req, later, rng); pk.Replica != "a" {
			t.Fatalf("dead replica picked: %+v", pk)
		}
	}
}

func TestWriteReport(t *testing.T) {
	dir := t.TempDir()
	sec := &lab.Section{Name: "x", Title: "X marks", Text: "Some text.",
		Charts: []*lab.Chart{
			{File: "lines.png", Title: "Lines", XLabel: "x (s)", YLabel: "y (ms)", LogX: true, LogY: true,
				Series: []lab.Series{{Name: "a", X: []float64{1, 10, 100}, Y: []float64{5, 50, 5000}}, {Name: "b", X: []float64{1, 10}, Y: []float64{3, 30}, Wide: true}}},
			{File: "bars.png", Title: "Bars", YLabel: "n", Bars: true, Categories: []string{"p", "q"},
				Series: []lab.Series{{Name: "one", Y: []float64{1, 2}}, {Name: "two", Y: []float64{3, 4}}}},
		},
		Tables: []*lab.Table{{File: "x.csv", Header: []string{"a", "b"}, Rows: [][]string{{"1", "2"}}}},
	}
	if err := lab.WriteReport(dir, lab.Meta{Command: "switchyard lab x", Seed: 1}, []*lab.Section{sec}); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## X marks", "Some text.", "[x.csv](x.csv)", "(#x-marks)"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report.md lacks %q", want)
		}
	}
	for _, name := range []string{"lines.png", "bars.png"} {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := png.DecodeConfig(f)
		f.Close()
		if err != nil || cfg.Width != 800 || cfg.Height != 500 {
			t.Errorf("%s: %dx%d, %v; want an 800×500 PNG", name, cfg.Width, cfg.Height, err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "x.csv")); string(b) != "a,b\n1,2\n" {
		t.Errorf("x.csv = %q", b)
	}
}

// The engine model is shared with enginesim, not copied: a lab replica is an
// enginesim.Engine with the lab's profile.
func TestProfileIsEnginesim(t *testing.T) {
	c := lab.Profile().WithDefaults()
	e := enginesim.New(lab.Profile())
	if e.Config() != c || c.KVBlocks != 4096 || c.BlockTokens != lab.BlockTokens {
		t.Fatalf("profile %+v", e.Config())
	}
}
