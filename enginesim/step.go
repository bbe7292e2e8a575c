package enginesim

import (
	"slices"
	"time"
)

// A step is one scheduler iteration, as in vLLM: its batch is fixed when it
// starts, every request in it produces one token when it ends, and its
// duration is the sum of the batch's costs. Requests that arrive during a
// step wait for the next one.

// startStep composes the batch of a step that starts at `at` and schedules
// its end.
func (e *Engine) startStep(at time.Time) {
	e.stepping = false
	e.reserveDecode()
	loads, prefillTokens, pulled, prefills := e.admit(at)
	if len(e.running) == 0 {
		if len(e.waiting) > 0 {
			// Submit only accepts requests that fit an empty engine, so an
			// empty batch with work waiting is a broken invariant; stepping
			// on would spin forever.
			panic("enginesim: requests waiting but none admissible")
		}
		return
	}
	c := &e.cfg
	var d time.Duration
	if prefills > 0 {
		d += c.TTFTBase + c.PrefillPerToken*time.Duration(prefillTokens) + c.KVTransferPerToken*time.Duration(pulled)
	}
	if prefills < len(e.running) {
		d += c.ITL + c.ITLPerBatch*time.Duration(len(e.running)-1)
	}
	d += c.LoraLoad*time.Duration(loads) + c.LoraPerAdapterStep*time.Duration(e.batchLoras())
	if d <= 0 {
		// All costs configured away: keep virtual time moving.
		d = time.Microsecond
	}
	e.stepping = true
	e.stepEnd = at.Add(d)
}

// reserveDecode gives every running request the blocks its next token needs,
// preempting while the cache is short, as vLLM's recompute preemption does:
// a preempted request goes back to the queue and later prefills its prompt
// and its output again. FCFS preempts the most recently admitted request and
// puts it at the head of the queue; priority scheduling preempts the one of
// the worst (priority, arrival) and queues it in that order.
func (e *Engine) reserveDecode() {
	need := 0
	for _, r := range e.running {
		need += e.kv.blocksFor(r.req.PromptTokens + r.generated + 1)
	}
	for need > e.cfg.KVBlocks && len(e.running) > 1 {
		victim := 0
		for i, r := range e.running {
			if e.preemptsBefore(r, e.running[victim]) {
				victim = i
			}
		}
		r := e.running[victim]
		need -= e.kv.blocksFor(r.req.PromptTokens + r.generated + 1)
		e.running = append(e.running[:victim], e.running[victim+1:]...)
		r.blocks = 0
		e.requeue(r)
		e.counts.preemptions++
	}
	for _, r := range e.running {
		r.blocks = e.kv.blocksFor(r.req.PromptTokens + r.generated + 1)
	}
}

// preemptsBefore reports whether running request a is preempted before b.
func (e *Engine) preemptsBefore(a, b *request) bool {
	if e.cfg.Scheduling == SchedulingPriority {
		return servedBefore(b, a)
	}
	return a.seq > b.seq
}

// servedBefore orders a priority queue: lower priority value first, then
// earlier arrival (IDs increase with arrival), as vLLM orders its requests.
func servedBefore(a, b *request) bool {
	if a.req.Priority != b.req.Priority {
		return a.req.Priority < b.req.Priority
	}
	return a.id < b.id
}

// enqueue queues a newly submitted request.
func (e *Engine) enqueue(r *request) {
	if e.cfg.Scheduling == SchedulingPriority {
		e.insertByPriority(r)
		return
	}
	e.waiting = append(e.waiting, r)
}

// requeue queues a preempted request: at the head under FCFS, in its
// place under priority scheduling.
func (e *Engine) requeue(r *request) {
	if e.cfg.Scheduling == SchedulingPriority {
		e.insertByPriority(r)
		return
	}
	e.waiting = append([]*request{r}, e.waiting...)
}

func (e *Engine) insertByPriority(r *request) {
	i, _ := slices.BinarySearchFunc(e.waiting, r, func(x, r *request) int {
		if servedBefore(x, r) {
			return -1
		}
		return 1
	})
	e.waiting = slices.Insert(e.waiting, i, r)
}

// admit moves waiting requests into the batch in queue order (arrival, or
// priority): the queue stops at the first request the KV cache cannot hold,
// but a request whose adapter cannot get a slot is passed over, as vLLM
// does. A full batch stops it too: nothing running is preempted for a
// better request waiting.
func (e *Engine) admit(at time.Time) (loads, prefillTokens, pulled, prefills int) {
	free := e.cfg.KVBlocks - e.usedBlocks()
	active := e.activeLoras()
	var admitted []*request
	for i := 0; i < len(e.waiting) && len(e.running) < e.cfg.MaxBatch; {
		r := e.waiting[i]
		need := e.kv.blocksFor(r.req.PromptTokens + r.generated + 1)
		if need > free {
			break
		}
		if r.req.Lora != "" {
			ok, load := e.loras.acquire(r.req.Lora, active, at)
			if !ok {
				i++
				continue
			}
			active[r.req.Lora]++
			if load {
				loads++
			}
		}
		e.waiting = append(e.waiting[:i], e.waiting[i+1:]...)
		free -= need
		r.blocks = need
		e.seq++
		r.seq = e.seq
		r.cached = e.kv.lookup(r.req.Lora, r.req.Prefix, r.req.PromptTokens)
		// A remote prefill's KV covers the prompt but its last token, which
		// computes the first output token here, as with a cache hit.
		r.pulled = max(min(r.req.Transferred, r.req.PromptTokens-1)-r.cached, 0)
		pulled += r.pulled
		prefillTokens += r.req.PromptTokens + r.generated - r.cached - r.pulled
		e.counts.prefixQueries += int64(r.req.PromptTokens)
		e.counts.prefixHits += int64(r.cached)
		e.running = append(e.running, r)
		admitted = append(admitted, r)
	}
	// Blocks become reusable only once computed, so requests admitted in
	// the same step do not hit each other's prefix.
	for _, r := range admitted {
		e.kv.insert(r.req.Lora, r.req.Prefix, r.req.TokenIDs, r.req.PromptTokens)
	}
	return loads, prefillTokens, pulled, len(admitted)
}

// finishStep emits the tokens of the step that ends at `at`.
func (e *Engine) finishStep(at time.Time) {
	e.stepping = false
	e.counts.steps++
	e.loras.touch(e.activeLoras(), at)
	kept := e.running[:0]
	for _, r := range e.running {
		kind := EventToken
		if r.generated == 0 {
			kind = EventFirstToken
			e.counts.promptTokens += int64(r.req.PromptTokens)
		}
		r.generated++
		e.counts.generationTokens++
		e.out = append(e.out, Event{ID: r.id, Kind: kind, At: at, Tokens: r.generated, CachedTokens: r.cached})
		if r.generated >= r.req.MaxTokens {
			e.out = append(e.out, Event{ID: r.id, Kind: EventFinish, At: at, Tokens: r.generated, CachedTokens: r.cached})
			delete(e.byID, r.id)
			r.blocks = 0
			e.counts.finished++
			continue
		}
		kept = append(kept, r)
	}
	clear(e.running[len(kept):])
	e.running = kept
	e.wake = at // the next step, if there is work, starts right away
}

func (e *Engine) usedBlocks() int {
	n := 0
	for _, r := range e.running {
		n += r.blocks
	}
	return n
}

// activeLoras counts the running requests of each adapter.
func (e *Engine) activeLoras() map[string]int {
	m := make(map[string]int)
	for _, r := range e.running {
		if r.req.Lora != "" {
			m[r.req.Lora]++
		}
	}
	return m
}

func (e *Engine) batchLoras() int { return len(e.activeLoras()) }
