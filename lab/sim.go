package lab

import (
	"errors"
	"math"
	"math/rand/v2"
	"time"

	"github.com/switchyard-llm/switchyard/enginesim"
	"github.com/switchyard-llm/switchyard/replica-adapter/prefillfit"
	"github.com/switchyard-llm/switchyard/subjects"
)

// Epoch is the virtual clock's origin, 2026-01-01 UTC: every run starts
// there.
func Epoch() time.Time { return time.Unix(1767225600, 0).UTC() }

// Scenario is one simulation run: replicas, router instances, a workload.
type Scenario struct {
	Replicas []Replica
	// Routers is the number of router instances (default 1); NewPicker
	// builds instance i. Each request goes to one instance drawn at random,
	// as a NATS queue group spreads them.
	Routers   int
	NewPicker func(i int) Picker
	Requests  []*Request

	// Heartbeat is each replica's heartbeat period (default 1 s). Replicas
	// beat out of phase, as independent adapters do.
	Heartbeat time.Duration
	// Staleness delays every heartbeat: the load it reports is that old
	// when the routers see it.
	Staleness time.Duration

	// Requests arriving in [Warmup, Horizon) are measured. Drain is how
	// long after Horizon they may still get their first token (default
	// 60 s); the rest count as failed.
	Warmup, Horizon time.Duration
	Drain           time.Duration
	// SLO is the time to first token within which a request counts as
	// goodput.
	SLO time.Duration
	// Seed seeds the routers' random choices.
	Seed uint64
	// SampleBatches records the distinct adapters of every engine step.
	SampleBatches bool
	// Trace keeps every 200 ms sample of imbalance and output tokens in
	// Result.Trace, for runs whose load changes over time.
	Trace bool
	// KVEvents turns on every engine's KV-cache event feed (see kvFeed):
	// routers that host an exact prefix index hear what the engines
	// store and evict, KVEventsDelay (default the package's KVEventsDelay)
	// plus Staleness after the replica's adapter flushes it.
	KVEvents      bool
	KVEventsDelay time.Duration
	// Deltas sends load deltas between heartbeats, as adapters do: at a
	// replica's first change (a request in, a first token, a request out),
	// then at most one every subjects.LoadDeltaEvery, delayed as the
	// heartbeats are, to the routers that take them (deltaReader).
	Deltas bool
	// ITL records every gap between two tokens of a request in
	// Result.Gaps.
	ITL bool
}

// Outcome is what happened to one request.
type Outcome struct {
	Replica int // index in Scenario.Replicas; -1 when rejected
	Router  int
	Reason  string // the router's reason, or the rejection's code
	// TTFT is the time from arrival to the first token; negative when the
	// request never got one.
	TTFT   time.Duration
	Cached int    // prompt tokens served by the prefix cache
	Failed string // why it failed: a router code, or an engine rejection
	// Prefill is the index of the replica that ran the request's prefill
	// leg, Replica then decoding it; -1 when it was served whole.
	Prefill int
}

// Engine rejections, as Outcome.Failed.
const (
	FailQueueFull = "engine_queue_full"
	FailTooLarge  = "engine_too_large"
	FailTimeout   = "no_first_token"
)

// usageObserver is a Picker that hears when a request it admitted ends, as
// a broker hears the adapter's usage event.
type usageObserver interface {
	ObserveEnd(req *Request, now time.Time)
}

// engineReader is a Picker that reads the engines themselves, which no
// router can: the oracle.
type engineReader interface {
	readEngines(engines []*enginesim.Engine)
}

// deltaReader is a Picker that takes load deltas between heartbeats.
type deltaReader interface {
	ObserveLoadDelta(d *subjects.LoadDelta, now time.Time)
}

type delivery struct {
	at, captured time.Time
	hb           *subjects.Heartbeat // or
	delta        *subjects.LoadDelta
}

type kvDelivery struct {
	at time.Time
	u  *subjects.KVUpdate
}

// sim is the state of one run.
type sim struct {
	sc      *Scenario
	start   time.Time // Epoch
	now     time.Time
	engines []*enginesim.Engine
	live    []map[enginesim.ID]int // engine request → request index
	legs    []map[enginesim.ID]int // prefill legs: engine request → request index
	lastTok []time.Time            // by request: its last token (Scenario.ITL)
	routers []Picker
	rngs    []*rand.Rand
	spread  *rand.Rand // which router a request reaches
	res     *Result

	hbNext  []time.Time
	hbSeq   uint64
	pending []delivery // in delivery order: the delay is the same for all
	ewma    []float64  // TTFT EWMA per replica, ms
	ewmaMin []float64
	// The prefill view each adapter keeps for its heartbeat: the prompt
	// tokens of the requests waiting for their first token, and the
	// prefill rate learned from first tokens (tokens per second).
	queuedPrefill []int
	prefillRate   []float64
	ahead         []int     // by request: the replica's queued prefill when it arrived
	slotWait      []float64 // by request: the wait for a batch slot its adapter expected when it arrived (ms)
	// hitRatio is the share of prompt tokens the replica's prefix cache
	// served over recent scrapes (the engine's prefix-cache counters), and
	// lastQueries, lastHits the counters at the last scrape.
	hitRatio           []float64
	rateWork, rateTime []float64 // averages of a first token's prefill work (tokens) and time (ms)
	// fit is each replica's line through (uncached tokens, TTFT) points,
	// and point each request's, taken at its first token when nothing was
	// queued ahead of it and added at its end, when the usage that says
	// what was cached arrives (x < 0: none).
	fit   []prefillfit.Fit
	point [][2]float64
	// decode is each replica's average time from a request's first token
	// to its end (ms), and firstAt each request's first token.
	decode                []float64
	firstAt               []time.Time
	lastQueries, lastHits []int64
	// Load deltas (Scenario.Deltas): each replica's last heartbeat seq and
	// delta seq, when its last delta went, and whether a change waits for
	// the next.
	lastHB    []uint64
	deltaSeq  []uint64
	deltaAt   []time.Time
	deltaWait []bool

	// The KV-event feeds (Scenario.KVEvents): one per replica, the next
	// flush, and the updates on their way to the routers.
	feeds     []*kvFeed
	kvNext    time.Time
	kvPending []kvDelivery

	outstanding []int
	sampleAt    time.Time
	imbSum      float64
	imbN        int
	batchSum    float64
	batchN      int
	resolved    int
}

// Run simulates the scenario and returns its outcomes. It is
// deterministic: the same scenario and seed give the same result.
func Run(sc *Scenario) *Result {
	if sc.Routers <= 0 {
		sc.Routers = 1
	}
	if sc.Heartbeat <= 0 {
		sc.Heartbeat = time.Second
	}
	if sc.Drain <= 0 {
		sc.Drain = 60 * time.Second
	}
	n := len(sc.Replicas)
	s := &sim{
		sc: sc, start: Epoch(), now: Epoch(),
		engines: make([]*enginesim.Engine, n), live: make([]map[enginesim.ID]int, n), legs: make([]map[enginesim.ID]int, n),
		hbNext: make([]time.Time, n), ewma: make([]float64, n), ewmaMin: make([]float64, n),
		queuedPrefill: make([]int, n), prefillRate: make([]float64, n), ahead: make([]int, len(sc.Requests)), slotWait: make([]float64, len(sc.Requests)),
		hitRatio: make([]float64, n), rateWork: make([]float64, n), rateTime: make([]float64, n), lastQueries: make([]int64, n), lastHits: make([]int64, n),
		decode: make([]float64, n), firstAt: make([]time.Time, len(sc.Requests)),
		fit: make([]prefillfit.Fit, n), point: make([][2]float64, len(sc.Requests)),
		lastHB: make([]uint64, n), deltaSeq: make([]uint64, n), deltaAt: make([]time.Time, n), deltaWait: make([]bool, n),
		outstanding: make([]int, n),
		spread:      rand.New(rand.NewPCG(sc.Seed, 0x5b7ead)),
		res:         &Result{Requests: sc.Requests, Outcomes: make([]Outcome, len(sc.Requests)), Window: sc.Horizon - sc.Warmup, SLO: sc.SLO, Warmup: sc.Warmup, Horizon: sc.Horizon},
	}
	if sc.KVEvents && sc.KVEventsDelay <= 0 {
		sc.KVEventsDelay = KVEventsDelay
	}
	for i, r := range sc.Replicas {
		cfg := r.Engine
		if sc.KVEvents {
			cfg.KVEvents = true
			s.feeds = append(s.feeds, newKVFeed(r.ID, cfg.WithDefaults().KVBlocks))
		}
		s.engines[i] = enginesim.New(cfg)
		s.live[i] = map[enginesim.ID]int{}
		s.legs[i] = map[enginesim.ID]int{}
		// Out of phase, as independent adapters beat.
		s.hbNext[i] = s.start.Add(sc.Heartbeat * time.Duration(i+1) / time.Duration(n))
	}
	for i := range sc.Routers {
		p := sc.NewPicker(i)
		if er, ok := p.(engineReader); ok {
			er.readEngines(s.engines)
		}
		if sw, ok := p.(*Switchyard); ok {
			// The routers are brokers of one queue group: each hears the
			// others' presence, as brokers do.
			sw.r.SetLiveBrokers(sc.Routers)
		}
		s.routers = append(s.routers, p)
		s.rngs = append(s.rngs, rand.New(rand.NewPCG(sc.Seed, uint64(i)+1)))
	}
	for i := range s.res.Outcomes {
		s.res.Outcomes[i] = Outcome{Replica: -1, Prefill: -1, TTFT: -1}
	}
	if sc.ITL {
		s.lastTok = make([]time.Time, len(sc.Requests))
	}
	s.sampleAt = s.start.Add(sc.Warmup)
	// Every replica has heartbeated once before the first request, as a
	// broker only routes to replicas it has heard from. With a delay, that
	// first heartbeat is as old as every later one will be; the replicas
	// were idle then as now.
	for i := range n {
		s.capture(i, s.start.Add(-sc.Staleness))
	}
	s.deliver(s.start)
	s.kvNext = s.start
	s.loop()
	s.finish()
	return s.res
}

const sampleEvery = 200 * time.Millisecond

func (s *sim) loop() {
	reqs := s.sc.Requests
	next := 0
	end := s.start.Add(s.sc.Horizon + s.sc.Drain)
	for s.resolved < len(reqs) {
		t := end
		if next < len(reqs) {
			t = minTime(t, s.start.Add(reqs[next].At))
		}
		for i, e := range s.engines {
			if at, ok := e.NextEvent(); ok {
				t = minTime(t, at)
			}
			t = minTime(t, s.hbNext[i])
			if s.deltaWait[i] {
				t = minTime(t, s.deltaAt[i].Add(subjects.LoadDeltaEvery))
			}
		}
		if len(s.pending) > 0 {
			t = minTime(t, s.pending[0].at)
		}
		if s.feeds != nil {
			t = minTime(t, s.kvNext)
		}
		if len(s.kvPending) > 0 {
			t = minTime(t, s.kvPending[0].at)
		}
		t = minTime(t, s.sampleAt)
		if !t.Before(end) {
			return
		}
		s.now = t
		s.deliver(t)
		for next < len(reqs) && !s.start.Add(reqs[next].At).After(t) {
			s.route(next)
			next++
		}
		for i, e := range s.engines {
			if at, ok := e.NextEvent(); ok && !at.After(t) {
				s.events(i, e.Advance(t))
				if s.sc.SampleBatches {
					s.sampleBatch(e)
				}
			}
		}
		if s.feeds != nil && !s.kvNext.After(t) {
			s.flushKV(t)
			s.kvNext = s.kvNext.Add(kvFlushEvery)
		}
		for i := range s.engines {
			if s.deltaWait[i] && !s.deltaAt[i].Add(subjects.LoadDeltaEvery).After(t) {
				s.captureDelta(i, t)
			}
			if !s.hbNext[i].After(t) {
				s.capture(i, t)
				s.hbNext[i] = s.hbNext[i].Add(s.sc.Heartbeat)
			}
		}
		if !s.sampleAt.After(t) {
			s.sample()
			s.sampleAt = s.sampleAt.Add(sampleEvery)
		}
	}
}

// route hands request i to a router instance and the replica it picks.
func (s *sim) route(i int) {
	req := s.sc.Requests[i]
	ri := s.spread.IntN(len(s.routers))
	pk := s.routers[ri].Pick(req, s.now, s.rngs[ri])
	o := &s.res.Outcomes[i]
	o.Router, o.Reason = ri, pk.Reason
	if pk.Err != nil {
		s.fail(i, pk.Err.Code)
		return
	}
	rep := s.replicaIndex(pk.Replica)
	o.Replica = rep
	if s.feeds != nil {
		s.feeds[rep].learn(req)
	}
	if pk.Prefill != "" {
		// The prefill leg first, max_tokens 1, on the prefill replica;
		// the decode leg follows when it ends (leg). A prefill engine that
		// refuses the leg leaves the decode replica to prefill the request
		// itself, as its adapter does (+prefill-whole:refused).
		p := s.replicaIndex(pk.Prefill)
		id, err := s.engines[p].Submit(enginesim.Request{PromptTokens: req.PromptTokens, MaxTokens: 1, Prefix: req.Blocks, Lora: req.Lora}, s.now)
		if err == nil {
			if s.feeds != nil {
				// It computes the prompt's blocks; the decode replica
				// stores them once pulled.
				s.feeds[p].learn(req)
			}
			o.Prefill = p
			s.legs[p][id] = i
			s.outstanding[p]++
			return
		}
	}
	s.submit(i, rep, s.live[rep], enginesim.Request{
		PromptTokens: req.PromptTokens, MaxTokens: req.MaxTokens, Prefix: req.Blocks, Lora: req.Lora,
	})
}

// submit hands request i's call q to replica rep's engine and records it
// in into; an engine that refuses it fails the request.
func (s *sim) submit(i, rep int, into map[enginesim.ID]int, q enginesim.Request) {
	id, err := s.engines[rep].Submit(q, s.now)
	switch {
	case errors.Is(err, enginesim.ErrQueueFull):
		s.fail(i, FailQueueFull)
		s.ended(i)
	case err != nil:
		s.fail(i, FailTooLarge)
		s.ended(i)
	default:
		into[id] = i
		s.outstanding[rep]++
		s.ahead[i] = s.queuedPrefill[rep]
		// The wait for a batch slot, as its adapter expects it: the
		// requests it holds (this one included) beyond the batch, a slot
		// freeing every decode time / max_batch.
		mb := s.engines[rep].Config().MaxBatch
		s.slotWait[i] = float64(max(s.outstanding[rep]-mb, 0)) * s.decode[rep] / float64(mb)
		s.queuedPrefill[rep] += s.prompt(i)
		s.changed(rep)
	}
}

// prompt is the prompt tokens request i's serving replica computes, as
// its adapter counts them: none for a decode leg, whose prompt its prefill
// leg computed.
func (s *sim) prompt(i int) int {
	if s.res.Outcomes[i].Prefill >= 0 {
		return 0
	}
	return s.sc.Requests[i].PromptTokens
}

// leg records an event of a prefill leg on replica p: when the leg ends,
// request i's decode leg goes to its decode replica with the prompt's KV
// to pull (vLLM's do_remote_prefill), as the decode replica's adapter
// calls its engine with the leg's kv_transfer_params.
func (s *sim) leg(p int, ev enginesim.Event) {
	if ev.Kind != enginesim.EventFinish {
		return
	}
	i := s.legs[p][ev.ID]
	delete(s.legs[p], ev.ID)
	s.outstanding[p]--
	req := s.sc.Requests[i]
	rep := s.res.Outcomes[i].Replica
	s.submit(i, rep, s.live[rep], enginesim.Request{
		PromptTokens: req.PromptTokens, MaxTokens: req.MaxTokens, Prefix: req.Blocks, Lora: req.Lora,
		Transferred: req.PromptTokens,
	})
}

// ended tells the router that admitted request i that it ended (its
// usage event), when the router listens.
func (s *sim) ended(i int) {
	if u, ok := s.routers[s.res.Outcomes[i].Router].(usageObserver); ok {
		u.ObserveEnd(s.sc.Requests[i], s.now)
	}
}

func (s *sim) fail(i int, code string) {
	s.res.Outcomes[i].Failed = code
	s.resolved++
}

func (s *sim) replicaIndex(id string) int {
	for i, r := range s.sc.Replicas {
		if r.ID == id {
			return i
		}
	}
	panic("lab: router picked unknown replica " + id)
}

// events records first tokens and completions of replica i.
func (s *sim) events(i int, evs []enginesim.Event) {
	for _, ev := range evs {
		if _, ok := s.legs[i][ev.ID]; ok {
			s.leg(i, ev)
			continue
		}
		switch ev.Kind {
		case enginesim.EventFirstToken:
			ri := s.live[i][ev.ID]
			if s.lastTok != nil {
				s.lastTok[ri] = ev.At
			}
			o := &s.res.Outcomes[ri]
			o.TTFT = ev.At.Sub(s.start.Add(s.sc.Requests[ri].At))
			o.Cached = ev.CachedTokens
			s.resolved++
			s.firstAt[ri] = ev.At
			ms := float64(o.TTFT) / float64(time.Millisecond)
			s.queuedPrefill[i] -= s.prompt(ri)
			s.observePrefill(i, s.ahead[ri], s.prompt(ri), ms-s.slotWait[ri])
			s.point[ri] = [2]float64{-1, 0}
			if s.ahead[ri] == 0 && s.prompt(ri) > 0 {
				s.point[ri] = [2]float64{float64(s.prompt(ri) - ev.CachedTokens), ms - s.slotWait[ri]}
			}
			s.changed(i)
			if s.ewma[i] == 0 {
				s.ewma[i], s.ewmaMin[i] = ms, ms
			}
			s.ewma[i] += 0.2 * (ms - s.ewma[i])
			s.ewmaMin[i] = min(s.ewmaMin[i], ms)
		case enginesim.EventToken:
			if s.lastTok != nil {
				ri := s.live[i][ev.ID]
				s.res.Gaps = append(s.res.Gaps, float32(ev.At.Sub(s.lastTok[ri]))/float32(time.Millisecond))
				s.res.GapOf = append(s.res.GapOf, int32(ri))
				s.lastTok[ri] = ev.At
			}
		case enginesim.EventFinish:
			if p := s.point[s.live[i][ev.ID]]; p[0] >= 0 && !s.firstAt[s.live[i][ev.ID]].IsZero() {
				s.fit[i].Add(p[0], p[1])
			}
			s.observeDecode(i, s.live[i][ev.ID], ev.At)
			s.ended(s.live[i][ev.ID])
			delete(s.live[i], ev.ID)
			s.outstanding[i]--
			s.changed(i)
		}
	}
}

// capture takes replica i's heartbeat at t, as its adapter would build it
// from the engine's metrics, and queues its delivery to every router.
func (s *sim) capture(i int, t time.Time) {
	st := s.engines[i].Stats()
	if dq := st.PrefixQueryTokens - s.lastQueries[i]; dq > 0 {
		r := float64(st.PrefixHitTokens-s.lastHits[i]) / float64(dq)
		s.hitRatio[i] += hitRatioAlpha * (r - s.hitRatio[i])
	}
	s.lastQueries[i], s.lastHits[i] = st.PrefixQueryTokens, st.PrefixHitTokens
	r := &s.sc.Replicas[i]
	c := s.engines[i].Config()
	s.hbSeq++
	hb := &subjects.Heartbeat{
		Replica: r.ID, Model: ModelID, Version: Version, Pool: r.Pool, State: subjects.StateReady,
		KVUsage: st.KVUsage, Running: st.Running, Waiting: st.Waiting,
		MaxBatch: c.MaxBatch, MaxQueue: c.MaxQueue, Inflight: s.outstanding[i],
		Lora:           subjects.LoraState{Running: orEmpty(st.RunningLoras), Waiting: orEmpty(st.WaitingLoras), Max: st.MaxLoras},
		TTFTEWMAMillis: s.ewma[i], QueueWaitMillis: max(0, s.ewma[i]-s.ewmaMin[i]),
		PrefillTokensPerSec: s.rate(i), QueuedPrefillTokens: s.queuedUncached(i),
		DecodeMillis: s.decode[i],
		KVBlocks:     c.KVBlocks, BlockSize: c.BlockTokens,
		ScrapeOK: true, Seq: s.hbSeq, SentUnixMillis: t.UnixMilli(),
	}
	if s.feeds != nil {
		hb.KVEvents = s.feeds[i].isLive()
	}
	s.lastHB[i] = s.hbSeq
	s.pending = append(s.pending, delivery{at: t.Add(s.sc.Staleness), captured: t, hb: hb})
}

// changed notes a change of replica i's load: with deltas on, its adapter
// sends one now, or at the end of the period of its last.
func (s *sim) changed(i int) {
	if !s.sc.Deltas || s.deltaWait[i] {
		return
	}
	if !s.deltaAt[i].IsZero() && s.now.Before(s.deltaAt[i].Add(subjects.LoadDeltaEvery)) {
		s.deltaWait[i] = true
		return
	}
	s.captureDelta(i, s.now)
}

// captureDelta takes replica i's load delta at t and queues its delivery.
func (s *sim) captureDelta(i int, t time.Time) {
	s.deltaWait[i], s.deltaAt[i] = false, t
	s.deltaSeq[i]++
	d := &subjects.LoadDelta{Replica: s.sc.Replicas[i].ID, Heartbeat: s.lastHB[i], Seq: s.deltaSeq[i],
		Inflight: s.outstanding[i], QueuedPrefillTokens: s.queuedUncached(i), SentUnixMillis: t.UnixMilli()}
	s.pending = append(s.pending, delivery{at: t.Add(s.sc.Staleness), captured: t, delta: d})
}

// queuedUncached is the queued prefill replica i's heartbeats and load
// deltas carry, as its adapter counts it: the uncached share of the
// queued prompt tokens, by the engine's recent prefix-cache hit ratio.
func (s *sim) queuedUncached(i int) int {
	return int(float64(max(s.queuedPrefill[i], 0)) * (1 - s.hitRatio[i]))
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// observePrefill learns replica i's prefill rate from one first token, as
// its adapter does: the prompt tokens queued ahead of the request when it
// arrived and its own, over the time its first token took beyond the
// fastest one seen, in a moving average. The caller takes the wait for a
// batch slot it expected out of ms: that wait is not prefill.
func (s *sim) observePrefill(i, ahead, tokens int, ms float64) {
	beyond := ms - s.ewmaMin[i]
	if tokens < minRateSample || s.ewmaMin[i] == 0 || beyond <= 0 {
		return
	}
	work := float64(ahead+tokens) * (1 - s.hitRatio[i])
	if s.rateTime[i] == 0 {
		s.rateWork[i], s.rateTime[i] = work, beyond
	} else {
		s.rateWork[i] += 0.2 * (work - s.rateWork[i])
		s.rateTime[i] += 0.2 * (beyond - s.rateTime[i])
	}
	s.prefillRate[i] = min(s.rateWork[i]/s.rateTime[i]*1000, subjects.MaxPrefillTokensPerSec)
}

// rate is the prefill rate replica i's heartbeat carries, as its adapter
// chooses it: the line's slope once it has one (the lab's clients ask
// for usage, so every stream's end says what the engine cached), until
// then the estimate from the hit ratio.
func (s *sim) rate(i int) float64 {
	if r := s.fit[i].Rate(); r > 0 {
		return r
	}
	return s.prefillRate[i]
}

// observeDecode learns replica i's decode time from request ri's end, as
// its adapter does: the time from its first token to its end, in a moving
// average.
func (s *sim) observeDecode(i, ri int, at time.Time) {
	if s.firstAt[ri].IsZero() {
		return
	}
	ms := float64(at.Sub(s.firstAt[ri])) / float64(time.Millisecond)
	if s.decode[i] == 0 {
		s.decode[i] = ms
		return
	}
	s.decode[i] += decodeAlpha * (ms - s.decode[i])
}

// decodeAlpha is the weight of one request in the decode time's average.
const decodeAlpha = 0.2

// hitRatioAlpha is the weight of one scrape in the hit ratio's average.
const hitRatioAlpha = 0.2

// minRateSample is the shortest prompt whose first token teaches the
// prefill rate, as in the adapter.
const minRateSample = 32

// flushKV takes every engine's KV-cache events into its feed and sends
// what changed on its way to the routers.
func (s *sim) flushKV(t time.Time) {
	at := t.Add(s.sc.Staleness + s.sc.KVEventsDelay)
	for i, f := range s.feeds {
		f.take(s.engines[i])
		for _, u := range f.flush() {
			s.kvPending = append(s.kvPending, kvDelivery{at: at, u: u})
		}
	}
}

// deliver hands every heartbeat and KV update due by t to every router.
func (s *sim) deliver(t time.Time) {
	k := 0
	for ; k < len(s.kvPending) && !s.kvPending[k].at.After(t); k++ {
		for _, r := range s.routers {
			if o, ok := r.(kvObserver); ok {
				o.ObserveKV(s.kvPending[k].u, s.kvPending[k].at)
			}
		}
	}
	s.kvPending = s.kvPending[k:]
	k = 0
	for ; k < len(s.pending) && !s.pending[k].at.After(t); k++ {
		d := s.pending[k]
		// Delivered as the broker takes it: at receipt, with the capture
		// time in sent_unix_ms (the policy dates load data by the older).
		for _, r := range s.routers {
			if d.delta != nil {
				if dr, ok := r.(deltaReader); ok {
					dr.ObserveLoadDelta(d.delta, d.at)
				}
				continue
			}
			r.ObserveHeartbeat(d.hb, d.at)
		}
	}
	s.pending = s.pending[k:]
}

// sample measures load imbalance: the busiest replica's outstanding
// requests over the mean.
func (s *sim) sample() {
	if s.now.Sub(s.start) >= s.sc.Horizon {
		return
	}
	if s.sc.Trace {
		var gen int64
		for _, e := range s.engines {
			gen += e.Stats().GenerationTokens
		}
		s.res.Trace = append(s.res.Trace, Sample{At: s.now.Sub(s.start), Imbalance: math.NaN(), Generated: gen})
	}
	total, top := 0, 0
	for _, n := range s.outstanding {
		total += n
		top = max(top, n)
	}
	if total > 0 {
		v := float64(top) * float64(len(s.outstanding)) / float64(total)
		s.imbSum += v
		s.imbN++
		if s.sc.Trace {
			s.res.Trace[len(s.res.Trace)-1].Imbalance = v
		}
	}
}

func (s *sim) sampleBatch(e *enginesim.Engine) {
	if d := s.now.Sub(s.start); d < s.sc.Warmup || d >= s.sc.Horizon {
		return
	}
	if st := e.Stats(); st.Running > 0 {
		s.batchSum += float64(st.BatchLoras)
		s.batchN++
	}
}

func (s *sim) finish() {
	for i := range s.res.Outcomes {
		if o := &s.res.Outcomes[i]; o.TTFT < 0 && o.Failed == "" {
			o.Failed = FailTimeout
		}
	}
	s.res.Imbalance = ratio(s.imbSum, float64(s.imbN))
	s.res.AdaptersPerBatch = ratio(s.batchSum, float64(s.batchN))
	s.res.End = s.now.Sub(s.start)
	for _, e := range s.engines {
		st := e.Stats()
		s.res.LoraLoads += st.LoraLoads
		s.res.Preemptions += st.Preemptions
	}
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return a / b
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
