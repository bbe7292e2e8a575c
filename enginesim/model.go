// Package enginesim simulates an LLM inference engine.
//
// The model (Engine and the files model.go, step.go, kvcache.go, lora.go) is
// pure: it starts no goroutine and never reads the clock. Every call takes
// the current time, so the same Engine is driven in real time by the HTTP
// shell (Server) and in virtual time by the discrete-event lab. Given the same
// calls with the same times, it produces the same events.
//
// It follows the shape of a vLLM scheduler: continuous batching up to
// MaxBatch running requests, a queue up to MaxQueue served first come first
// served or by priority (Config.Scheduling), KV capacity counted in blocks
// of BlockTokens tokens, an LRU prefix cache over chained block hashes, and
// a bounded set of resident LoRA adapters.
package enginesim

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/switchyard-llm/switchyard/internal/check"
	"github.com/switchyard-llm/switchyard/internal/kvevents"
)

// Config describes one simulated engine. Zero fields take the defaults noted;
// a negative duration means "no cost" for the cost fields whose zero value
// would otherwise pick a default.
type Config struct {
	// Model is the served model name.
	Model string
	// KVBlocks is the KV-cache capacity in blocks (default 8192).
	KVBlocks int
	// BlockTokens is the number of tokens per KV block (default 16).
	BlockTokens int
	// MaxBatch is the most requests running at once (default 32).
	MaxBatch int
	// MaxQueue is the most requests waiting beyond the batch's free slots;
	// beyond it Submit rejects with ErrQueueFull (default 128).
	MaxQueue int
	// MaxLoras is the number of LoRA adapter slots; 0 serves no adapter.
	MaxLoras int
	// TTFTBase is the fixed cost of a step that prefills (default 30ms).
	TTFTBase time.Duration
	// PrefillPerToken is the cost of each uncached prompt token (default 100µs).
	PrefillPerToken time.Duration
	// ITL is the base cost of a decode step (default 5ms).
	ITL time.Duration
	// ITLPerBatch is added to a step for each running request beyond the
	// first (default 100µs).
	ITLPerBatch time.Duration
	// LoraLoad is the cost of loading a non-resident adapter (default 50ms).
	LoraLoad time.Duration
	// LoraPerAdapterStep is added to a step for each distinct adapter in the
	// batch (default 500µs).
	LoraPerAdapterStep time.Duration
	// KVTransferPerToken is the cost of each prompt token whose KV a decode
	// request pulls from a remote prefill instead of computing it (default
	// 10µs: a tenth of a prefilled token, the ratio of a fast interconnect).
	KVTransferPerToken time.Duration
	// PrefixCacheBlocks is how many block hashes the prefix cache remembers
	// (default KVBlocks; negative disables the cache).
	PrefixCacheBlocks int
	// KVEvents makes the prefix cache tell every block it stores and
	// evicts, as vLLM's KV-cache events (TakeKVEvents).
	KVEvents bool
	// Scheduling is the scheduler's policy, as vLLM's --scheduling-policy:
	// SchedulingFCFS (the default) or SchedulingPriority.
	Scheduling Scheduling
}

// Scheduling is a scheduler policy (vLLM's --scheduling-policy).
type Scheduling string

// Scheduler policies.
const (
	// SchedulingFCFS serves the queue in arrival order; a request with a
	// priority other than 0 is refused, as vLLM refuses it.
	SchedulingFCFS Scheduling = "fcfs"
	// SchedulingPriority serves the queue by (Request.Priority, arrival):
	// the lowest value first. When the KV cache runs short, the running
	// request of the worst (priority, arrival) is preempted, where FCFS
	// preempts the one admitted last. As in vLLM's v1 scheduler, a full
	// batch preempts nothing: a better request waits for the next free
	// slot, ahead of every worse one.
	SchedulingPriority Scheduling = "priority"
)

// Validate range-checks c. Zero values stand for their defaults; errors
// name the flag that sets the value.
func (c Config) Validate() error {
	return check.All(
		check.Range("kv-blocks", c.KVBlocks, 0, 1<<24),
		check.Range("block-tokens", c.BlockTokens, 0, 1<<10),
		check.Range("max-batch", c.MaxBatch, 0, 1<<16),
		check.Range("max-queue", c.MaxQueue, 0, 1<<20),
		check.Range("max-loras", c.MaxLoras, 0, 1<<10),
		check.Range("prefix-cache-blocks", c.PrefixCacheBlocks, math.MinInt, 1<<24),
		check.Duration("ttft-base", c.TTFTBase, math.MinInt64, time.Minute),
		check.Duration("prefill-per-token", c.PrefillPerToken, math.MinInt64, time.Second),
		check.Duration("itl", c.ITL, math.MinInt64, time.Minute),
		check.Duration("itl-per-batch", c.ITLPerBatch, math.MinInt64, time.Second),
		check.Duration("kv-transfer-per-token", c.KVTransferPerToken, math.MinInt64, time.Second),
		check.Duration("lora-load", c.LoraLoad, math.MinInt64, time.Minute),
		check.Duration("lora-per-adapter-step", c.LoraPerAdapterStep, math.MinInt64, time.Second),
		c.checkScheduling(),
	)
}

func (c Config) checkScheduling() error {
	switch c.Scheduling {
	case "", SchedulingFCFS, SchedulingPriority:
		return nil
	}
	return check.Wrap("scheduling-policy", string(c.Scheduling), errors.New("want fcfs or priority"))
}

// WithDefaults returns c with every zero field set to its default and every
// negative cost set to zero.
func (c Config) WithDefaults() Config {
	intDefault(&c.KVBlocks, 8192)
	intDefault(&c.BlockTokens, 16)
	intDefault(&c.MaxBatch, 32)
	intDefault(&c.MaxQueue, 128)
	if c.MaxLoras < 0 {
		c.MaxLoras = 0
	}
	if c.PrefixCacheBlocks == 0 {
		c.PrefixCacheBlocks = c.KVBlocks
	}
	if c.PrefixCacheBlocks < 0 {
		c.PrefixCacheBlocks = 0
	}
	durDefault(&c.TTFTBase, 30*time.Millisecond)
	durDefault(&c.PrefillPerToken, 100*time.Microsecond)
	durDefault(&c.ITL, 5*time.Millisecond)
	durDefault(&c.ITLPerBatch, 100*time.Microsecond)
	durDefault(&c.KVTransferPerToken, 10*time.Microsecond)
	durDefault(&c.LoraLoad, 50*time.Millisecond)
	durDefault(&c.LoraPerAdapterStep, 500*time.Microsecond)
	if c.Scheduling == "" {
		c.Scheduling = SchedulingFCFS
	}
	return c
}

func intDefault(v *int, def int) {
	if *v <= 0 {
		*v = def
	}
}

func durDefault(v *time.Duration, def time.Duration) {
	switch {
	case *v == 0:
		*v = def
	case *v < 0:
		*v = 0
	}
}

// Request is what a client asks the engine to do.
type Request struct {
	PromptTokens int
	// MaxTokens is the number of tokens to generate; the request finishes
	// when it has generated them.
	MaxTokens int
	// Prefix holds the chained hashes of the prompt's full blocks, in order.
	// Blocks already in the prefix cache skip their prefill.
	Prefix []uint64
	// Lora names the adapter to run with; empty for the base model.
	Lora string
	// TokenIDs are the prompt's token ids, told in the KV-cache events;
	// nil makes them up from the block hashes.
	TokenIDs []uint32
	// Transferred is how many prompt tokens' KV a remote prefill computed
	// (vLLM's do_remote_prefill): the request pulls them, at
	// KVTransferPerToken each, instead of prefilling them; those its own
	// prefix cache holds are neither pulled nor computed.
	Transferred int
	// Priority orders the queue under SchedulingPriority: lower is served
	// first (vLLM's priority field, default 0). Under SchedulingFCFS only
	// 0 is accepted.
	Priority int64
}

// ID identifies a submitted request. IDs start at 1 and increase.
type ID uint64

// Errors returned by Submit.
var (
	ErrQueueFull    = errors.New("enginesim: queue full")
	ErrTooLarge     = errors.New("enginesim: request exceeds KV capacity")
	ErrInvalid      = errors.New("enginesim: invalid request")
	ErrLoraDisabled = errors.New("enginesim: LoRA is not enabled")
	// ErrPriorityDisabled: a priority other than 0 on an engine that
	// schedules first come first served.
	ErrPriorityDisabled = errors.New("enginesim: priority scheduling is not enabled")
	ErrTimeBackwards    = errors.New("enginesim: time went backwards")
)

// EventKind says what happened to a request.
type EventKind uint8

// Kinds of events.
const (
	// EventFirstToken is the request's first generated token.
	EventFirstToken EventKind = iota + 1
	// EventToken is every later token.
	EventToken
	// EventFinish follows the last token: the request left the engine.
	EventFinish
)

func (k EventKind) String() string {
	switch k {
	case EventFirstToken:
		return "first_token"
	case EventToken:
		return "token"
	case EventFinish:
		return "finish"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Event is one state change of one request.
type Event struct {
	ID   ID
	Kind EventKind
	At   time.Time
	// Tokens is the number of tokens generated so far (1 on the first token).
	Tokens int
	// CachedTokens is how many prompt tokens the prefix cache served at the
	// request's (last) admission.
	CachedTokens int
}

// Engine is the simulated engine. It is not safe for concurrent use: one
// owner drives it.
type Engine struct {
	cfg    Config
	now    time.Time
	nextID ID
	seq    uint64 // admission order, for preemption

	waiting []*request
	running []*request
	byID    map[ID]*request

	stepping bool
	stepEnd  time.Time
	wake     time.Time // when idle with work waiting: when to start a step

	kv     kvCache
	loras  loraSlots
	out    []Event
	counts counters
}

type request struct {
	id        ID
	req       Request
	generated int
	blocks    int
	cached    int
	pulled    int // prompt tokens pulled from a remote prefill at the last admission
	seq       uint64
}

// New returns an idle engine; cfg is completed with WithDefaults.
func New(cfg Config) *Engine {
	cfg = cfg.WithDefaults()
	return &Engine{
		cfg:   cfg,
		byID:  make(map[ID]*request),
		kv:    newKVCache(cfg.BlockTokens, cfg.PrefixCacheBlocks, cfg.KVEvents),
		loras: loraSlots{max: cfg.MaxLoras},
	}
}

// TakeKVEvents appends the KV-cache events since the last call to dst, in
// the order they happened (Config.KVEvents).
func (e *Engine) TakeKVEvents(dst []kvevents.Event) []kvevents.Event { return e.kv.takeEvents(dst) }

// Config returns the engine's effective configuration.
func (e *Engine) Config() Config { return e.cfg }

// Submit queues a request that arrives at now. Events that fall due up to
// now are kept for the next Advance.
func (e *Engine) Submit(req Request, now time.Time) (ID, error) {
	if err := e.advance(now, false); err != nil {
		return 0, err
	}
	switch {
	case req.PromptTokens < 1 || req.MaxTokens < 1:
		return 0, fmt.Errorf("%w: prompt_tokens %d, max_tokens %d", ErrInvalid, req.PromptTokens, req.MaxTokens)
	case req.Priority != 0 && e.cfg.Scheduling != SchedulingPriority:
		return 0, fmt.Errorf("%w: %d", ErrPriorityDisabled, req.Priority)
	case req.Lora != "" && e.cfg.MaxLoras == 0:
		return 0, fmt.Errorf("%w: adapter %q", ErrLoraDisabled, req.Lora)
	case e.kv.blocksFor(req.PromptTokens+req.MaxTokens) > e.cfg.KVBlocks:
		return 0, fmt.Errorf("%w: %d tokens, capacity %d", ErrTooLarge,
			req.PromptTokens+req.MaxTokens, e.cfg.KVBlocks*e.cfg.BlockTokens)
	case len(e.waiting) >= e.cfg.MaxQueue+max(0, e.cfg.MaxBatch-len(e.running)):
		// Requests the next step will admit into free batch slots are not
		// queued in the sense of MaxQueue.
		return 0, fmt.Errorf("%w: %d waiting", ErrQueueFull, len(e.waiting))
	}
	e.nextID++
	r := &request{id: e.nextID, req: req}
	e.enqueue(r)
	e.byID[r.id] = r
	if !e.stepping && len(e.waiting) == 1 && len(e.running) == 0 {
		e.wake = now
	}
	return r.id, nil
}

// Cancel removes a request, waiting or running, at now. It reports whether
// the request was still in the engine; a cancelled request emits no more
// events.
func (e *Engine) Cancel(id ID, now time.Time) bool {
	if e.advance(now, false) != nil {
		return false
	}
	r, ok := e.byID[id]
	if !ok {
		return false
	}
	e.remove(r)
	return true
}

// Advance moves the engine to now and returns the events that happened since
// the last call, in order. now must not go backwards.
func (e *Engine) Advance(now time.Time) []Event {
	_ = e.advance(now, true)
	out := e.out
	e.out = nil
	return out
}

// NextEvent returns the time of the next state change, and false when the
// engine is idle and will not change until a request is submitted.
func (e *Engine) NextEvent() (time.Time, bool) {
	switch {
	case e.stepping:
		return e.stepEnd, true
	case e.busy():
		return e.wake, true
	}
	return time.Time{}, false
}

// advance runs the engine up to now. A step that falls due exactly at now
// starts only when startDue is set (from Advance): Submit and Cancel leave it
// pending, so that requests arriving at the same instant share its batch.
func (e *Engine) advance(now time.Time, startDue bool) error {
	if now.Before(e.now) {
		return fmt.Errorf("%w: %v before %v", ErrTimeBackwards, now, e.now)
	}
	e.now = now
	for {
		switch {
		case e.stepping && !e.stepEnd.After(now):
			e.finishStep(e.stepEnd)
		case !e.stepping && e.busy() && (e.wake.Before(now) || startDue && e.wake.Equal(now)):
			e.startStep(e.wake)
		default:
			return nil
		}
	}
}

func (e *Engine) busy() bool { return len(e.running) > 0 || len(e.waiting) > 0 }

// remove takes r out of the engine, wherever it is.
func (e *Engine) remove(r *request) {
	delete(e.byID, r.id)
	e.waiting = without(e.waiting, r)
	e.running = without(e.running, r)
	r.blocks = 0
}

func without(rs []*request, r *request) []*request {
	for i, x := range rs {
		if x == r {
			copy(rs[i:], rs[i+1:])
			rs[len(rs)-1] = nil
			return rs[:len(rs)-1]
		}
	}
	return rs
}
