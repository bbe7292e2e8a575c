package lab

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/enginesim"
	"github.com/switchyard-llm/switchyard/table"
)

// Replay arms, in report order: the lab's baselines, the peers' own
// algorithms (each a policy profile), Switchyard's default, the table
// setting Switchyard recommends for production, and the oracle.
const (
	ArmRoundRobin   = "round-robin"
	ArmPowerOfTwo   = "power-of-two"
	ArmDynamoKV     = "dynamo-kv"
	ArmLLMDPrecise  = "llm-d-precise"
	ArmLLMDSticky   = "llm-d-sticky"
	ArmSGLang       = "sglang-cache-aware"
	ArmSwitchyard   = "Switchyard"
	ArmBest         = "Switchyard best"
	ArmOracle       = BenchOracle
	ArmBound        = "bound" // replay.csv's row of the trace's infinite-cache hit rate
	replayBrokerID  = "broker-0"
	replayMaxBlocks = 256 // the gateway's most prefix blocks (features.MaxPrefixBlocks)
)

// ReplayArms are the arms every replay runs, in report order.
func ReplayArms() []string {
	return []string{ArmRoundRobin, ArmPowerOfTwo, ArmDynamoKV, ArmLLMDPrecise, ArmLLMDSticky, ArmSGLang, ArmSwitchyard, ArmBest, ArmOracle}
}

// PeerArms are the arms that play another project's router.
func PeerArms() []string { return []string{ArmDynamoKV, ArmLLMDPrecise, ArmLLMDSticky, ArmSGLang} }

// BestSetting is the one table setting Switchyard recommends for
// production, the same for every trace: the replica chosen by predicted
// time to first token, with the adapters' KV-event feed and load deltas on
// (the prefix benchmark's best arm, section 8).
const BestSetting = `policy.replica_choice "predicted-ttft", with the adapters' KV-event feed and load deltas`

// replayArm is how an arm runs: its profile (for the policy's arms), and
// whether the engines' KV-event feed and the adapters' load deltas are on.
// The arms that play a router reading KV events (Dynamo, llm-d's precise
// profile) get the feed; those that keep an approximate index of what they
// routed (SGLang's radix tree, llm-d's approximate prefix producer) work
// from the policy's placements, in a map eight times the default
// (bigMapEntries): with 256 blocks a prompt the default holds the chains of
// 32 prompts, where SMG's tree holds 10 000 nodes of any length.
type replayArm struct {
	profile   string
	policy    bool
	feed      bool
	predicted bool
	bigMap    bool
}

func replayArmOf(name string) replayArm {
	switch name {
	case ArmDynamoKV:
		return replayArm{profile: table.ProfileDynamoKV, policy: true, feed: true}
	case ArmLLMDPrecise:
		return replayArm{profile: table.ProfileLLMDPrecise, policy: true, feed: true}
	case ArmLLMDSticky:
		return replayArm{profile: table.ProfileLLMDSticky, policy: true, bigMap: true}
	case ArmSGLang:
		return replayArm{profile: table.ProfileSGLangCacheAware, policy: true, bigMap: true}
	case ArmSwitchyard:
		return replayArm{profile: table.ProfileSwitchyard, policy: true, feed: true}
	case ArmBest:
		return replayArm{profile: table.ProfileSwitchyard, policy: true, feed: true, predicted: true}
	}
	return replayArm{}
}

// ReplayConfig says what to replay and how.
type ReplayConfig struct {
	// Name is the trace's name in errors and the report; R its contents.
	Name   string
	R      io.Reader
	Format string // FormatMooncake ("") or FormatAzure
	// BlockTokens is the tokens of one of the trace's hash ids (512).
	BlockTokens int
	Replicas    int       // default 8 (the lab profile's; the dev profile's is the dev fleet's)
	Speedups    []float64 // nil: a grid chosen from the trace
	Limit       int       // the first Limit requests; 0: all (quick: 3000)
	// Profile is the replicas' profile (ReplayProfileLab when ""), and
	// Speed the dev stack's --speed for ReplayProfileDev.
	Profile string
	Speed   float64
	// Arms are the arms run, in report order (nil: ReplayArms()).
	Arms []string
}

// arms are the arms cfg runs; an unknown one is an error.
func (cfg ReplayConfig) arms() ([]string, error) {
	if len(cfg.Arms) == 0 {
		return ReplayArms(), nil
	}
	for _, a := range cfg.Arms {
		if !slices.Contains(ReplayArms(), a) {
			return nil, fmt.Errorf("unknown arm %q (want some of %s)", a, strings.Join(ReplayArms(), ", "))
		}
	}
	var out []string
	for _, a := range ReplayArms() {
		if slices.Contains(cfg.Arms, a) {
			out = append(out, a)
		}
	}
	return out, nil
}

// Trace is a trace read for replay: its requests at speedup 1 and what the
// grid and the bound need.
type Trace struct {
	Name     string
	Requests []*Request
	// Duration is the last arrival; Work the engine time its requests
	// take with nothing cached (requestWork), summed: the routers' hit
	// rates on Mooncake's traces stay far below the bound, so counting the
	// bound's savings put the pool past its capacity at a load of 0.75.
	Duration time.Duration
	Work     time.Duration
	// Bound is the trace's infinite-cache hit rate: the share of prompt
	// tokens in engine blocks an earlier request already had.
	Bound float64
}

// replayProfile is a replica of the replay: the lab's profile with a KV
// cache of 16 384 blocks (262 144 tokens), so that the traces' longest
// prompts (Mooncake's synthetic trace has one of 191 378 tokens) fit.
func replayProfile() enginesim.Config {
	c := Profile()
	c.KVBlocks = 16384
	return c
}

// LoadTrace streams cfg's trace into requests: a line at a time, the
// requests keeping only their block hashes. A bad line is an error naming
// the file and the line.
func LoadTrace(cfg ReplayConfig, o Options) (*Trace, error) {
	bt := cfg.BlockTokens
	if bt == 0 {
		bt = 512
	}
	setup, err := cfg.setup()
	if err != nil {
		return nil, err
	}
	if _, err := cfg.arms(); err != nil {
		return nil, err
	}
	tr, err := NewTraceReader(cfg.Name, cfg.R, cfg.Format, bt)
	if err != nil {
		return nil, err
	}
	limit := cfg.Limit
	if limit == 0 && o.Scale != Full {
		limit = pick(o, 0, 3000, 300)
	}
	out := &Trace{Name: cfg.Name}
	prof := setup.engine
	seen := map[uint64]struct{}{}
	var prompt, cached float64
	var rec TraceRecord
	var segs []segment
	unique := uint64(1) << 62 // ids of the tokens no hash id covers: never shared
	for limit <= 0 || len(out.Requests) < limit {
		ok, err := tr.Next(&rec)
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		segs = segs[:0]
		left := rec.Input
		for _, h := range rec.Hashes {
			n := min(bt, left)
			segs = append(segs, segment{id: mix(h + 1), tokens: n})
			left -= n
		}
		if left > 0 {
			unique++
			segs = append(segs, segment{id: unique, tokens: left})
		}
		blocks := chain(nil, segs, BlockTokens)
		q := &Request{
			At: rec.At, Tenant: "t00", PromptTokens: max(rec.Input, 1), MaxTokens: max(rec.Output, 1),
			Blocks: blocks, Prefix: routerPrefix(blocks, BlockTokens, setup.blockChars, setup.maxBlocks),
		}
		hit := 0
		for _, b := range blocks {
			if _, ok := seen[b]; ok {
				hit++
			} else {
				seen[b] = struct{}{}
			}
		}
		prompt += float64(q.PromptTokens)
		cached += float64(hit * BlockTokens)
		out.Requests = append(out.Requests, q)
		out.Duration = q.At
	}
	if len(out.Requests) == 0 {
		return nil, fmt.Errorf("%s: no requests", cfg.Name)
	}
	out.Bound = ratio(cached, prompt)
	for _, q := range out.Requests {
		out.Work += requestWork(prof, q, 0)
	}
	return out, nil
}

// requestWork is the engine time one request takes on prof when hit of
// its prompt is cached: its prefill, which stalls the batch, and its share
// of the decode steps of a full batch.
func requestWork(prof enginesim.Config, q *Request, hit float64) time.Duration {
	prefill := prof.TTFTBase + time.Duration(float64(q.PromptTokens)*(1-hit))*prof.PrefillPerToken
	step := prof.ITL + time.Duration(prof.MaxBatch)*prof.ITLPerBatch
	return prefill + time.Duration(q.MaxTokens)*step/time.Duration(prof.MaxBatch)
}

// Load is the pool's load at speedup 1: the requests' engine time over
// the replicas' time during the trace (1: the pool's capacity).
func (t *Trace) Load(replicas int) float64 {
	return t.Work.Seconds() / (max(t.Duration, time.Second).Seconds() * float64(replicas))
}

// SpeedupGrid is the default grid: the factors that put the pool at about
// half its capacity, three quarters, its capacity, and one step past it.
func (t *Trace) SpeedupGrid(replicas int) []float64 {
	l := t.Load(replicas)
	var out []float64
	for _, target := range []float64{0.5, 0.75, 1, 1.25} {
		s := target / l
		// Two significant digits: a grid a reader can type back.
		v, _ := strconv.ParseFloat(strconv.FormatFloat(s, 'g', 2, 64), 64)
		out = append(out, v)
	}
	return out
}

// ReplayRow is one arm at one speedup.
type ReplayRow struct {
	Arm                 string
	Speedup             float64
	Requests, Refused   int
	HitRate             float64
	P50, P90, P99       float64 // TTFT over every request, a refused one at the run's longest (ms)
	E2E50, E2E99, ITL99 float64 // served requests (ms)
	OutputTPS           float64
	Load                float64 // the pool's load at this speedup (1: capacity)
	Reasons             map[string]int
	Preempted           int
}

// ReplayResult is every arm at every speedup.
type ReplayResult struct {
	Trace    string
	Format   string
	N        int
	Replicas int
	Speedups []float64
	Loads    []float64
	Arms     []string
	Rows     [][]ReplayRow // by arm, then speedup
	Bound    float64
	Scale    Scale
	// Generated: the lab's own trace (ReplayGenerated).
	Generated bool
	// Pool says what the replicas and their table are.
	Pool string
}

// allArms tells whether every arm ran, which the targets and the
// comparisons with the peers need.
func (r *ReplayResult) allArms() bool { return len(r.Arms) == len(ReplayArms()) }

// Of returns arm's row at speedup i.
func (r *ReplayResult) Of(arm string, i int) ReplayRow { return r.Rows[indexOf(r.Arms, arm)][i] }

// Replay runs the trace through every arm at every speedup, all arms on
// the same arrivals.
// The trace was loaded with the same cfg (LoadTrace), which checked its
// profile and arms.
func Replay(o Options, t *Trace, cfg ReplayConfig) *ReplayResult {
	setup, err := cfg.setup()
	if err != nil {
		panic("lab: Replay of a configuration LoadTrace refuses: " + err.Error())
	}
	arms, err := cfg.arms()
	if err != nil {
		panic("lab: Replay of a configuration LoadTrace refuses: " + err.Error())
	}
	n := setup.replicas
	speedups := cfg.Speedups
	if len(speedups) == 0 {
		speedups = t.SpeedupGrid(n)
	}
	cluster := replicas("r", "general", n, setup.engine)
	base := map[string]any{
		"models." + ModelID: map[string]any{"versions": []string{Version}, "tier": "hot", "max_context_tokens": setup.context, "default_max_tokens": 4096},
	}
	snapOf := func(a replayArm) *table.Snapshot {
		pol := maps.Clone(setup.policy)
		if a.profile != "" {
			pol["profile"] = a.profile
		}
		if a.predicted {
			pol["replica_choice"] = table.ChoicePredictedTTFT
		}
		extra := map[string]any{table.KeyPolicy: pol}
		for k, v := range base {
			extra[k] = v
		}
		return mustTable(cluster, extra)
	}
	// Each speedup's arrivals: the trace's, compressed.
	work := make([][]*Request, len(speedups))
	for k, s := range speedups {
		qs := make([]*Request, len(t.Requests))
		for i, q := range t.Requests {
			c := *q
			c.At = time.Duration(float64(q.At) / s)
			qs[i] = &c
		}
		work[k] = qs
	}
	build := func(i, k int) *Scenario {
		a := replayArmOf(arms[i])
		snap := snapOf(a)
		qs := work[k]
		return &Scenario{
			Replicas: cluster, Requests: qs, Warmup: 0, Horizon: qs[len(qs)-1].At + 1, SLO: 2 * time.Second,
			Drain: 300 * time.Second, Seed: o.seed(hashName("replay")), ITL: true,
			KVEvents: a.feed, Deltas: a.policy,
			NewPicker: func(int) Picker {
				switch arms[i] {
				case ArmRoundRobin:
					return NewRoundRobin(ids(cluster), snap.Policy)
				case ArmPowerOfTwo:
					return NewPowerOfTwo(ids(cluster), snap.Policy)
				case ArmOracle:
					return NewOracle(ids(cluster))
				}
				cfg := policy.Config{Self: replayBrokerID}
				if a.bigMap {
					cfg.PrefixEntries = bigMapEntries
				}
				return NewSwitchyardConfig(snap, cfg)
			},
		}
	}
	// Each run is measured as it ends and its outcomes dropped: a run of a
	// long trace keeps every token gap, and holding all of them at once
	// would multiply the memory by the number of runs.
	rows := make([][]ReplayRow, len(arms))
	var jobs []func()
	for i := range arms {
		rows[i] = make([]ReplayRow, len(speedups))
		for k := range speedups {
			jobs = append(jobs, func() { rows[i][k] = replayRow(Run(build(i, k))) })
		}
	}
	o.parallel(jobs)
	out := &ReplayResult{Trace: t.Name, Format: cfg.Format, N: len(t.Requests), Replicas: n, Speedups: speedups, Arms: arms,
		Bound: t.Bound, Scale: o.Scale, Pool: setup.describe}
	if out.Format == "" {
		out.Format = FormatMooncake
	}
	for _, s := range speedups {
		out.Loads = append(out.Loads, t.Load(n)*s)
	}
	for i, a := range arms {
		for k, s := range speedups {
			rows[i][k].Arm, rows[i][k].Speedup, rows[i][k].Load = a, s, out.Loads[k]
		}
	}
	out.Rows = rows
	return out
}

// replayRow measures one run of the lab.
func replayRow(r *Result) ReplayRow {
	e2e := make([]float64, len(r.Requests))
	for k, g := range r.Gaps {
		e2e[r.GapOf[k]] += float64(g)
	}
	samples := make([]RowSample, len(r.Requests))
	for i, q := range r.Requests {
		o := &r.Outcomes[i]
		samples[i] = RowSample{At: q.At, Reason: o.Reason, Failed: o.Failed != "", Prompt: q.PromptTokens, Cached: o.Cached, Output: q.MaxTokens}
		if o.Failed == "" {
			samples[i].TTFT = o.TTFT
			samples[i].E2E = o.TTFT + time.Duration(e2e[i]*float64(time.Millisecond))
		}
	}
	gaps := make([]float64, len(r.Gaps))
	for k, g := range r.Gaps {
		gaps[k] = float64(g)
	}
	row := MeasureRow(samples, gaps)
	row.Preempted = int(r.Preemptions)
	return row
}

// RowSample is one request of a replay as its client saw it: the lab's
// simulated client or `switchyard bench --trace`.
type RowSample struct {
	At     time.Duration // arrival, from the start of the replay
	Reason string        // the router's reason, or the refusal's code
	// Failed: refused, or no answer; TTFT and E2E then do not count.
	Failed bool
	// TTFT and E2E are from the arrival to the first and the last token.
	TTFT, E2E              time.Duration
	Prompt, Cached, Output int // tokens
}

// MeasureRow is the replay's row of a run's requests and token gaps (ms):
// TTFT over every request, a failed one (a router's refusal, an engine's,
// or no first token) counting at the run's longest TTFT, so an arm cannot
// look faster by refusing; the hit rate, end-to-end times and throughput
// over the served ones. Arm, Speedup and Load are the caller's.
func MeasureRow(samples []RowSample, gaps []float64) ReplayRow {
	row := ReplayRow{Requests: len(samples), Reasons: map[string]int{}}
	var ttft, ends []float64
	var prompt, cached, outTok float64
	longest, last := 0.0, 0.0
	for _, q := range samples {
		row.Reasons[q.Reason]++
		if q.Failed {
			row.Refused++
			continue
		}
		t := float64(q.TTFT) / float64(time.Millisecond)
		longest = max(longest, t)
		ttft = append(ttft, t)
		e := float64(q.E2E) / float64(time.Millisecond)
		ends = append(ends, e)
		last = max(last, float64(q.At)/float64(time.Millisecond)+e)
		prompt += float64(q.Prompt)
		cached += float64(q.Cached)
		outTok += float64(q.Output)
	}
	for range row.Refused {
		ttft = append(ttft, longest)
	}
	slices.Sort(ttft)
	slices.Sort(ends)
	row.P50, row.P90, row.P99 = percentile(ttft, 0.5), percentile(ttft, 0.9), percentile(ttft, 0.99)
	row.E2E50, row.E2E99 = percentile(ends, 0.5), percentile(ends, 0.99)
	gaps = slices.Clone(gaps)
	slices.Sort(gaps)
	row.ITL99 = percentile(gaps, 0.99)
	row.HitRate = ratio(cached, prompt)
	row.OutputTPS = ratio(outTok, last/1000)
	return row
}

// CSVRow is row as replay.csv writes it.
// An unknown hit rate (NaN) is an empty cell.
func (x ReplayRow) CSVRow() []string {
	hit := fmtf("%.4f", x.HitRate)
	if math.IsNaN(x.HitRate) {
		hit = ""
	}
	return []string{x.Arm, fmtSpeedup(x.Speedup), strconv.Itoa(x.Requests), hit,
		fmtf("%.1f", x.P50), fmtf("%.1f", x.P90), fmtf("%.1f", x.P99), fmtf("%.1f", x.E2E50), fmtf("%.1f", x.E2E99),
		fmtf("%.1f", x.ITL99), fmtf("%.1f", x.OutputTPS), strconv.Itoa(x.Refused)}
}

// Capacity is the index of the last speedup at or below the pool's
// capacity (-1 when none is).
func (r *ReplayResult) Capacity() int {
	k := -1
	for i, l := range r.Loads {
		if l <= 1.05 { // the grid's speedups are rounded to two digits
			k = i
		}
	}
	return k
}

// BestPeerHit is the best hit rate at speedup i of any arm but the oracle.
func (r *ReplayResult) BestPeerHit(i int) (string, float64) {
	arm, best := "", -1.0
	for _, a := range r.Arms {
		if a == ArmOracle {
			continue
		}
		if h := r.Of(a, i).HitRate; h > best {
			arm, best = a, h
		}
	}
	return arm, best
}

// Check is one "done when" target at one speedup.
type Check struct {
	Speedup float64
	What    string
	Met     bool
	Detail  string
}

// Checks are the replay's targets at every speedup up to the pool's
// capacity: Switchyard best at or below every peer's p90 TTFT and within
// 1.25× of the oracle's, its hit rate within 3 points of the best arm's
// but the oracle's; Switchyard's default at or below power of two.
func (r *ReplayResult) Checks() []Check {
	if !r.allArms() {
		return nil
	}
	var out []Check
	for i := 0; i <= r.Capacity(); i++ {
		s := r.Speedups[i]
		best := r.Of(ArmBest, i)
		for _, p := range PeerArms() {
			pr := r.Of(p, i)
			out = append(out, Check{s, "Switchyard best p90 ≤ " + p, best.P90 <= pr.P90, fmtf("%.0f", best.P90) + " vs " + fmtf("%.0f ms", pr.P90)})
		}
		or := r.Of(ArmOracle, i)
		out = append(out, Check{s, "Switchyard best p90 ≤ 1.25× oracle", best.P90 <= 1.25*or.P90, fmtf("%.2f×", best.P90/or.P90)})
		arm, h := r.BestPeerHit(i)
		out = append(out, Check{s, "Switchyard best hit rate within 3 points of the best", best.HitRate >= h-0.03,
			pct(best.HitRate) + " vs " + pct(h) + " (" + arm + ")"})
		sy, p2 := r.Of(ArmSwitchyard, i), r.Of(ArmPowerOfTwo, i)
		out = append(out, Check{s, "Switchyard p90 ≤ power-of-two", sy.P90 <= p2.P90, fmtf("%.0f", sy.P90) + " vs " + fmtf("%.0f ms", p2.P90)})
	}
	return out
}

func fmtSpeedup(s float64) string { return strconv.FormatFloat(s, 'f', -1, 64) }

// ReplayHeader is replay.csv's header.
var ReplayHeader = []string{"arm", "speedup", "requests", "hit_rate", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms",
	"e2e_p50_ms", "e2e_p99_ms", "itl_p99_ms", "output_tokens_per_s", "refused"}

// CSV is replay.csv's rows: one per arm and speedup, then for each speedup
// a row of arm bound whose hit_rate is the trace's infinite-cache hit rate.
func (r *ReplayResult) CSV() [][]string {
	var rows [][]string
	for ai := range r.Arms {
		for _, x := range r.Rows[ai] {
			rows = append(rows, x.CSVRow())
		}
	}
	for _, s := range r.Speedups {
		rows = append(rows, []string{ArmBound, fmtSpeedup(s), "", fmtf("%.4f", r.Bound), "", "", "", "", "", "", "", ""})
	}
	return rows
}

// Section renders the replay.
func (r *ReplayResult) Section() *Section {
	p90 := &Chart{File: "replay-p90-ttft.png", Title: "p90 TTFT against speedup", XLabel: "speedup (time compression)",
		YLabel: "p90 TTFT (ms, log scale)", LogY: true}
	hit := &Chart{File: "replay-hit-rate.png", Title: "Prefix hit rate against speedup", XLabel: "speedup (time compression)",
		YLabel: "hit rate (% of prompt tokens)", YMin: 0, YMax: 100, LegendBottom: true}
	var md [][]string
	for ai, a := range r.Arms {
		var y90, yh []float64
		for _, x := range r.Rows[ai] {
			y90 = append(y90, x.P90)
			yh = append(yh, 100*x.HitRate)
			md = append(md, []string{a, fmtSpeedup(x.Speedup), f2(x.Load), pct(x.HitRate), ms(x.P50), ms(x.P90), ms(x.P99),
				ms(x.E2E50), ms(x.E2E99), ms(x.ITL99), fmtf("%.0f", x.OutputTPS), strconv.Itoa(x.Refused)})
		}
		p90.Series = append(p90.Series, Series{Name: a, X: r.Speedups, Y: y90})
		hit.Series = append(hit.Series, Series{Name: a, X: r.Speedups, Y: yh})
	}
	var by []float64
	for range r.Speedups {
		by = append(by, 100*r.Bound)
	}
	hit.Series = append(hit.Series, Series{Name: "bound (infinite cache)", X: r.Speedups, Y: by, Wide: true})
	var checks [][]string
	met, total := 0, 0
	for _, c := range r.Checks() {
		mark := "no"
		if c.Met {
			mark = "yes"
			met++
		}
		total++
		checks = append(checks, []string{fmtSpeedup(c.Speedup), c.What, mark, c.Detail})
	}
	trailText := r.trails()
	text := fmt.Sprintf(`**Question.** On traffic like a production trace, which router gives the lowest time to first
token on the same hardware: the peers' own algorithms (Dynamo's KV router, llm-d's precise and
sticky prefix profiles, SGLang's cache-aware policy), Switchyard's default, or the one setting
Switchyard recommends for production?

**Setup.** Trace: %s (format %s, %d requests, the trace's infinite-cache hit rate %s), replayed in
virtual time through %s, at each
speedup (the trace's timestamps divided by it; the load column is the pool's estimated load, 1 at
its capacity). Every arm sees the same arrivals. The peers are policy profiles
(`+"`policy.profile`"+`): *dynamo-kv* (%s), *llm-d-precise* and *llm-d-sticky* (%s), and
*sglang-cache-aware* (%s), their knobs at those versions' defaults; dynamo-kv and llm-d-precise
read the engines' KV-cache events, llm-d-sticky and sglang-cache-aware what they routed (the
placement map, 65 536 blocks), as those projects' default deployments do. *Switchyard* is the default table with
the KV-event feed; *Switchyard best* is %s. Every table carries prefix headers of up to 256
blocks of 256 characters (`+"`prefix_max_blocks`"+` 256, the most the gateway sends). TTFT percentiles are
over every request, a refused one counting at the run's longest TTFT.

%s%s
%s
**Targets** (every speedup at or below capacity; %d of %d met):

%s
**Findings.**

%s`, r.Trace, r.Format, r.N, pct(r.Bound), r.Pool, policy.DynamoVersion, policy.LLMDVersion, policy.SGLangVersion, BestSetting,
		img(p90), img(hit),
		mdTable([]string{"arm", "speedup", "load", "hit rate", "p50 TTFT (ms)", "p90 TTFT (ms)", "p99 TTFT (ms)", "p50 e2e (ms)", "p99 e2e (ms)", "p99 ITL (ms)", "output tok/s", "refused"}, md),
		met, total, mdTable([]string{"speedup", "target", "met", "figures"}, checks), trailText)
	if r.Generated {
		text += replayGeneratedNote
	}
	headline := fmt.Sprintf("%s: %d of %d targets met at or below capacity", r.Trace, met, total)
	if c := r.Capacity(); c >= 0 && r.allArms() {
		b, or := r.Of(ArmBest, c), r.Of(ArmOracle, c)
		headline += fmt.Sprintf("; at capacity (%s×) Switchyard best's p90 TTFT is %s ms (%.2f× the oracle's), hit rate %s (bound %s)",
			fmtSpeedup(r.Speedups[c]), ms(b.P90), b.P90/or.P90, pct(b.HitRate), pct(r.Bound))
	}
	title := "Trace replay: the peers' routers side by side"
	if r.Generated {
		title = "12. " + title
	}
	return &Section{
		Name: "replay", Title: title, Text: text, Headline: headline + ".",
		Charts: []*Chart{p90, hit},
		Tables: []*Table{{File: "replay.csv", Header: ReplayHeader, Rows: r.CSV()}},
	}
}

// trails says where Switchyard's default trails a peer arm at or below
// capacity, and why: the share of its decisions prefix affinity made.
func (r *ReplayResult) trails() string {
	if !r.allArms() {
		return "- The run had only the arms " + strings.Join(r.Arms, ", ") + ": the targets and the comparisons with the peers need every arm.\n"
	}
	var parts []string
	for _, p := range PeerArms() {
		var at []string
		for i := 0; i <= r.Capacity(); i++ {
			if sy, pr := r.Of(ArmSwitchyard, i), r.Of(p, i); pr.P90 < sy.P90 {
				at = append(at, fmt.Sprintf("%s× (%s against %s ms)", fmtSpeedup(r.Speedups[i]), ms(sy.P90), ms(pr.P90)))
			}
		}
		if len(at) > 0 {
			parts = append(parts, p+" at "+strings.Join(at, ", "))
		}
	}
	if len(parts) == 0 {
		return "- Switchyard's default trails no peer arm at or below capacity in this run.\n"
	}
	var shares []string
	for i := 0; i <= r.Capacity(); i++ {
		x := r.Of(ArmSwitchyard, i)
		n := 0
		for reason, c := range x.Reasons {
			if reason == policy.ReasonPrefix || strings.HasSuffix(reason, "+"+policy.ReasonPrefix) {
				n += c
			}
		}
		shares = append(shares, fmt.Sprintf("%s at %s×", pct(float64(n)/float64(max(x.Requests, 1))), fmtSpeedup(r.Speedups[i])))
	}
	return "- Switchyard's default trails " + strings.Join(parts, "; ") + ". Prefix affinity decided its requests: " +
		strings.Join(shares, ", ") + ". " + replayTrailWhy + "\n"
}

// replayTrailWhy says why the default trails where it does.
const replayTrailWhy = `Prefix affinity keeps a conversation on the
replica of its earlier turns until the power-of-two pair's lighter replica is lighter by more than
the matched share of the prompt is worth in load_score, which counts a queue lightly (0.3 × waiting
/ max_queue by default), or, for a holder the KV-event feed names, has less prefill work ahead by
more than twice the prompt: a warm replica's queue grows further before a request leaves it than
under the peer arms, which weigh queued work in time and look at every replica (dynamo-kv's cost
counts the prefill queued there, llm-d's queue scorer and TTFT gate, SGLang's imbalance check). Switchyard best, its decider alone
and reading the KV-event feed, chooses over every replica by the prefill work ahead of the first
token, keeping a request among the replicas holding 65% of its prefix (llm-d-sticky: 80% of what it
routed), counting as held both what the engines report and what it sent that their engines have
not reported yet.`

// ReplayGenerated replays the lab's own conversation-shaped trace
// (ConversationTrace) through every arm: `switchyard lab replay` without
// --trace, and the replay section of `lab all`.
func ReplayGenerated(o Options) *ReplayResult {
	n := pick(o, 6000, 3000, 300)
	name := "the lab's conversation trace (ConversationTrace)"
	cfg := ReplayConfig{Name: name, R: bytes.NewReader(ConversationTrace(n, o.seed(hashName("replay-trace"))))}
	t, err := LoadTrace(cfg, o)
	if err != nil {
		panic("lab: the generated trace is bad: " + err.Error()) // a programming error, caught by every test
	}
	r := Replay(o, t, cfg)
	r.Generated = true
	return r
}

// replayGeneratedNote is the lab's own trace's section's history and
// pointer to the public traces' reports.
const replayGeneratedNote = `
**Switchyard best before the choice over every replica.** Its decider weighed the prefix holders
and a sampled pair by each replica's own predicted TTFT, ties within a quarter going by
load_score. On this trace its p90 TTFT was then 289, 320 and 352 ms at 2.1×, 3.2× and 4.3×, behind
llm-d-sticky (286, 288, 310 ms) at each; it met 4 of 21 targets on Mooncake's conversation slice
and 8 of 21 on the synthetic one. Replayed with one rate for the pool, the learned rates followed
cost 14–86% at some speedups and the base TTFTs up to 83%: alike replicas differ in them by noise.

**Switchyard best before its pending blocks.** Its decider alone read a replica with the feed
from the KV events only, so the blocks of a request still queued there, sent but not yet
computed, counted as held nowhere, and a request kept the replicas holding 80% of its prefix. At
capacity on Mooncake's slices it then trailed llm-d-sticky on the conversation slice (43.2 s
against 41.1 s p90 TTFT at 1.7×, hit rate 7.9% against 9.0%) and sglang-cache-aware on the
synthetic one (10.3 s against 8.9 s at 1.6×, 1.36× the oracle's): 20 of 21 and 18 of 21 targets.

**The default before the weighing by prefill work.** A holder the feed names was weighed by
load_score alone. On this trace the default's p90 TTFT was then 394, 421 and 531 ms at 2.1×, 3.2×
and 4.3×; on Mooncake's conversation slice 6 984, 8 659 and 79 682 ms at 0.86×, 1.3× and 1.7×,
above power of two's at each (6 471, 8 140, 69 404 ms).

**Before the draw and the weighing.** Prefix affinity used to take the lowest kv_usage among a
level's holders, the same replica for every decision until the next heartbeat, and kept a request
on a holder below the release threshold whatever that holder's load. On this trace the default's
p90 TTFT was then 550 ms, 35.9 s and 59.7 s at 2.1×, 3.2× and 4.3× (power of two: 607, 760 and
924 ms), 367 requests refused at capacity; on Mooncake's conversation slice 16.5 s, 32.6 s and
159 s at 0.86×, 1.3× and 1.7× (power of two: 6.5, 8.1 and 69.4 s).

**The public traces.** The lab's trace has the shape of Mooncake's conversation trace (shared
system prompts, conversations growing turn by turn) with prompts of a few thousand tokens. Slices of
Mooncake's own conversation and synthetic traces (FAST '25, Apache-2.0, the first 3000 requests of
each, lab/testdata/mooncake) are replayed the same way by ` + "`make lab-replay`" + `: their reports are
[replay-conversation/report.md](replay-conversation/report.md) and
[replay-synthetic/report.md](replay-synthetic/report.md). Their prompts are long (12 000 and 15 000
tokens on average, up to 126 000 and 191 000), so a replica's 262 144 tokens of KV cache hold a few
dozen and every arm, the oracle too, keeps far less of the trace's infinite-cache hit rate.
`
