package enginesim

import (
	"slices"
	"time"
)

// Stats is the engine's state as of the last call that moved its clock,
// in the terms an engine's metrics endpoint reports.
type Stats struct {
	// KVUsage is the fraction of KV blocks held by running requests (0–1).
	KVUsage      float64
	KVBlocksUsed int
	KVBlocks     int
	Running      int
	Waiting      int
	// RunningLoras and WaitingLoras are the distinct adapters of running
	// and waiting requests, sorted (vLLM's lora_requests_info labels).
	RunningLoras []string
	WaitingLoras []string
	// ResidentLoras are the adapters loaded in a slot, sorted.
	ResidentLoras []string
	MaxLoras      int
	// BatchLoras is the number of distinct adapters in the current batch.
	BatchLoras int
	// PrefixCachedBlocks is how many block hashes the prefix cache holds.
	PrefixCachedBlocks int

	// Cumulative counts since the engine started.
	PrefixQueryTokens int64 // prompt tokens looked up in the prefix cache
	PrefixHitTokens   int64 // prompt tokens the prefix cache served
	PromptTokens      int64 // prompt tokens of requests that produced a first token
	GenerationTokens  int64
	Finished          int64
	Preemptions       int64
	LoraLoads         int64
	Steps             int64
}

type counters struct {
	prefixQueries, prefixHits      int64
	promptTokens, generationTokens int64
	finished, preemptions, steps   int64
}

// Stats returns the current state.
func (e *Engine) Stats() Stats {
	used := e.usedBlocks()
	return Stats{
		KVUsage:            float64(used) / float64(e.cfg.KVBlocks),
		KVBlocksUsed:       used,
		KVBlocks:           e.cfg.KVBlocks,
		Running:            len(e.running),
		Waiting:            len(e.waiting),
		RunningLoras:       loraNames(e.running),
		WaitingLoras:       loraNames(e.waiting),
		ResidentLoras:      e.loras.names(),
		MaxLoras:           e.cfg.MaxLoras,
		BatchLoras:         e.batchLoras(),
		PrefixCachedBlocks: e.kv.cachedBlocks(),
		PrefixQueryTokens:  e.counts.prefixQueries,
		PrefixHitTokens:    e.counts.prefixHits,
		PromptTokens:       e.counts.promptTokens,
		GenerationTokens:   e.counts.generationTokens,
		Finished:           e.counts.finished,
		Preemptions:        e.counts.preemptions,
		LoraLoads:          e.loras.loads,
		Steps:              e.counts.steps,
	}
}

// CachedTokens is how many of req's prompt tokens the prefix cache would
// serve if req were admitted now. It changes nothing: an observer (the
// lab's oracle router) reads the cache with it.
func (e *Engine) CachedTokens(req Request) int {
	return e.kv.peek(req.Lora, req.Prefix, req.PromptTokens)
}

// Now is the engine's clock: the latest time it was given.
func (e *Engine) Now() time.Time { return e.now }

func loraNames(rs []*request) []string {
	var out []string
	for _, r := range rs {
		if r.req.Lora != "" && !slices.Contains(out, r.req.Lora) {
			out = append(out, r.req.Lora)
		}
	}
	slices.Sort(out)
	return out
}
