package lab

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Request is one request of a workload, as the gateway would describe it
// to a broker and the adapter to an engine.
type Request struct {
	// At is the arrival time, from the start of the run.
	At           time.Duration
	Tenant       string
	Conversation string // "" for a single-shot request
	PromptTokens int
	MaxTokens    int
	// Blocks is the engine's prefix chain (blocks of BlockTokens tokens);
	// Prefix the router's (blocks of prefix_block_chars characters).
	Blocks []uint64
	Prefix []uint64
	// Lora is the tenant's adapter, "" for the base model.
	Lora string
	// Long marks a long-context request.
	Long bool
	// ID is the request id (Llm-Request-Id) a router counts it under
	// until its usage event; "" (the workloads' default) for none.
	ID string
}

// Workload describes the traffic of a run. Sessions (a conversation, or a
// single request) arrive as a Poisson process, optionally modulated into
// bursts; each session opens with a shared system prompt or not, then grows
// turn by turn: every turn's prompt is the previous prompt, its answer and
// a new user message.
type Workload struct {
	// Rate is the mean number of requests per second.
	Rate     float64
	Duration time.Duration
	// Burst modulates the arrival rate; the zero value is plain Poisson.
	Burst Burst
	// Ramp, when set, replaces Rate: the run is cut into len(Ramp) equal
	// stages and stage i arrives at Ramp[i] requests per second.
	Ramp []float64

	// SystemPrompts shared prompts of SystemTokens tokens each, picked
	// with Zipf popularity of exponent SystemZipf (> 1; otherwise
	// uniformly) by a SystemShare of the sessions.
	SystemPrompts int
	SystemTokens  int
	SystemZipf    float64
	SystemShare   float64

	// Turns is the mean number of turns of a session (geometric, at least
	// one); ThinkTime the mean gap between a turn and the next. Sessions of
	// more than one turn carry a conversation id. MaxPromptTokens ends a
	// conversation whose prompt would grow past it (0: 12000).
	Turns           float64
	ThinkTime       time.Duration
	MaxPromptTokens int

	// UserTokens and OutputTokens are the mean sizes of a user message and
	// an answer, log-normally spread with SizeSigma.
	UserTokens   int
	OutputTokens int
	SizeSigma    float64

	// LongShare of the sessions are a single long-context request of
	// LongTokens prompt tokens (a document of its own) and LongOutput
	// answer tokens.
	LongShare  float64
	LongTokens int
	LongOutput int

	// Tenants t00, t01, …; with Adapters, tenant i runs adapter lora-i.
	// TenantZipf skews their traffic like SystemZipf.
	Tenants    int
	TenantZipf float64
	Adapters   bool
}

// Burst alternates a high and a low arrival rate with the given period:
// High times the mean rate for HighShare of each period, and the low rate
// that keeps the mean.
type Burst struct {
	Period    time.Duration
	High      float64
	HighShare float64
}

// multiplier is the arrival-rate factor at t.
func (b Burst) multiplier(t time.Duration) float64 {
	if b.Period <= 0 || b.High <= 1 || b.HighShare <= 0 || b.HighShare >= 1 {
		return 1
	}
	if float64(t%b.Period) < b.HighShare*float64(b.Period) {
		return b.High
	}
	return max(0, (1-b.High*b.HighShare)/(1-b.HighShare))
}

// rampAt is the ramp's rate at t.
func (w Workload) rampAt(t time.Duration) float64 {
	i := int(int64(t) * int64(len(w.Ramp)) / int64(w.Duration))
	return w.Ramp[min(max(i, 0), len(w.Ramp)-1)]
}

func (b Burst) peak() float64 {
	if m := b.multiplier(0); m > 1 {
		return m
	}
	return 1
}

// Sizes of the prefix blocks used by every workload: the engine's KV block
// and the router's prefix_block_chars (the policy defaults of docs/protocol.md).
const (
	BlockTokens      = 16
	PrefixBlockChars = 256
	PrefixMaxBlocks  = 64
)

// Generate draws the workload's requests, in arrival order. The same seed
// gives the same requests.
func (w Workload) Generate(seed uint64) []*Request {
	rng := rand.New(rand.NewPCG(seed, 0x5eed_1ab))
	turns := max(w.Turns, 1)
	rate := w.Rate
	if len(w.Ramp) > 0 {
		rate = slices.Max(w.Ramp)
	}
	sessionRate := rate / turns
	maxPrompt := w.MaxPromptTokens
	if maxPrompt <= 0 {
		maxPrompt = 12000
	}
	sysPick := picker(rng, w.SystemZipf, w.SystemPrompts)
	tenantPick := picker(rng, w.TenantZipf, max(w.Tenants, 1))
	nextSeg := uint64(1) << 32 // ids below are system prompts
	var reqs []*Request
	peak := sessionRate * w.Burst.peak()
	var t time.Duration
	for sess := 0; ; sess++ {
		// Thinning: candidate arrivals at the peak rate, kept in proportion
		// to the rate at their time.
		t += time.Duration(rng.ExpFloat64() / peak * float64(time.Second))
		if t >= w.Duration {
			break
		}
		if rng.Float64()*w.Burst.peak() > w.Burst.multiplier(t) {
			continue
		}
		if len(w.Ramp) > 0 && rng.Float64()*rate > w.rampAt(t) {
			continue
		}
		ti := tenantPick()
		tenant := fmt.Sprintf("t%02d", ti)
		lora := ""
		if w.Adapters {
			lora = fmt.Sprintf("lora-%02d", ti)
		}
		if w.LongShare > 0 && rng.Float64() < w.LongShare {
			nextSeg++
			segs := []segment{{nextSeg, w.LongTokens}}
			reqs = append(reqs, w.request(t, tenant, "", lora, segs, max(w.LongOutput, 1), true))
			continue
		}
		var segs []segment
		if w.SystemPrompts > 0 && rng.Float64() < w.SystemShare {
			segs = append(segs, segment{uint64(sysPick() + 1), w.SystemTokens})
		}
		conv := ""
		if turns > 1 {
			conv = fmt.Sprintf("c%d", sess)
		}
		at := t
		for turn := 0; ; turn++ {
			nextSeg++
			segs = append(segs, segment{nextSeg, w.size(rng, w.UserTokens)})
			out := w.size(rng, w.OutputTokens)
			if turn > 0 && tokens(segs) > maxPrompt {
				break
			}
			reqs = append(reqs, w.request(at, tenant, conv, lora, slices.Clone(segs), out, false))
			if turns <= 1 || rng.Float64() < 1/turns {
				break
			}
			nextSeg++
			segs = append(segs, segment{nextSeg, out}) // the answer joins the history
			at += time.Duration(rng.ExpFloat64() * float64(w.ThinkTime))
			if at >= w.Duration {
				break
			}
		}
	}
	slices.SortStableFunc(reqs, func(a, b *Request) int { return int(a.At - b.At) })
	return reqs
}

func (w Workload) request(at time.Duration, tenant, conv, lora string, segs []segment, out int, long bool) *Request {
	blocks := chain(nil, segs, BlockTokens)
	return &Request{
		At: at, Tenant: tenant, Conversation: conv, Lora: lora, Long: long,
		PromptTokens: tokens(segs), MaxTokens: out,
		Blocks: blocks,
		Prefix: routerPrefix(blocks, BlockTokens, PrefixBlockChars, PrefixMaxBlocks),
	}
}

// size draws a log-normal size with the given mean.
func (w Workload) size(rng *rand.Rand, mean int) int {
	if mean <= 0 {
		return 1
	}
	s := w.SizeSigma
	mu := math.Log(float64(mean)) - s*s/2
	return max(1, int(math.Round(math.Exp(mu+s*rng.NormFloat64()))))
}

func tokens(segs []segment) int {
	n := 0
	for _, s := range segs {
		n += s.tokens
	}
	return n
}

// picker returns a draw over [0, n): Zipf with exponent s when s > 1,
// uniform otherwise.
func picker(rng *rand.Rand, s float64, n int) func() int {
	if n <= 1 {
		return func() int { return 0 }
	}
	if s > 1 {
		z := rand.NewZipf(rng, s, 1, uint64(n-1))
		return func() int { return int(z.Uint64()) }
	}
	return func() int { return rng.IntN(n) }
}
