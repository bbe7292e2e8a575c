// Package stages records where a request's time goes between the client's
// body arriving and the first byte going back to it: a monotonic timestamp
// at each stage of the path (docs/benchmarks.md, "Stage budget"), for a
// sample of the requests, kept in process.
//
// A nil *Recorder records nothing, and every method on it returns at once:
// the parts hold one only when asked (`switchyard dev --stages`, the
// end-to-end bench's stack), so the path pays a nil check when it is off.
// The gateway, broker and adapter of one process share one Recorder, and
// find a request by its Llm-Request-Id, which every hop carries.
package stages

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Stage is one point of the path. The order is the path's order.
type Stage uint8

// The stages, in the order a request passes them. A request the gateway
// decides itself skips BrokerReceived and Forwarded (its Decided is the
// gateway's).
const (
	BodyReceived      Stage = iota // gateway: the client's body read whole
	Published                      // gateway: the request published on NATS
	BrokerReceived                 // broker: the request taken from NATS
	Decided                        // broker or gateway: the policy's decision made
	Forwarded                      // broker: the request published for the replica
	AdapterReceived                // adapter: the request taken from NATS
	EngineWritten                  // adapter: the request written to the engine
	EngineFirstByte                // adapter: the engine's first response byte
	AdapterFirstChunk              // adapter: the first answer bytes published
	GatewayFirstChunk              // gateway: the first answer bytes taken from NATS
	ClientFirstByte                // gateway: the first byte written to the client
	NumStages
)

var names = [NumStages]string{
	"gateway body received", "gateway published", "broker received", "decided", "broker forwarded",
	"adapter received", "engine request written", "engine first byte", "adapter first chunk published",
	"gateway first chunk received", "first byte written to the client",
}

// String is the stage's name as the stage table prints it.
func (s Stage) String() string {
	if s < NumStages {
		return names[s]
	}
	return "unknown"
}

// Limits of the recorder's memory: requests under way sampled at once, and
// finished ones kept for the summary (the oldest are overwritten).
const (
	maxOpen = 4096
	maxDone = 1 << 16
)

// Recorder keeps the stage timestamps of sampled requests. Create it with
// New; the zero value is not usable, a nil one records nothing.
type Recorder struct {
	base  time.Time
	every uint64
	seen  atomic.Uint64

	mu   sync.Mutex // guards open, done, next, legs
	open map[string]*record
	done []record
	next int // where the next finished record goes once done is full

	// legsReply is the reply subject of the legs recorded (legs.go), read
	// without the lock by every reply message.
	legsReply atomic.Pointer[string]
	legs      Legs
}

// record is one request's stages: nanoseconds since the recorder's base,
// 0 for a stage not passed.
type record [NumStages]int64

// New returns a recorder sampling one request in every (1: all of them).
func New(every int) *Recorder {
	return &Recorder{base: time.Now(), every: uint64(max(every, 1)), open: map[string]*record{}}
}

// Now is the monotonic time a stage is stamped with; 0 when r is nil.
func (r *Recorder) Now() int64 {
	if r == nil {
		return 0
	}
	return max(int64(time.Since(r.base)), 1)
}

// Begin decides whether request id is sampled and, when it is, starts its
// record with the body's arrival at bodyAt (a value of Now).
func (r *Recorder) Begin(id string, bodyAt int64) {
	if r == nil || id == "" || bodyAt == 0 {
		return
	}
	if (r.seen.Add(1)-1)%r.every != 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.open) >= maxOpen {
		return
	}
	rec := new(record)
	rec[BodyReceived] = bodyAt
	r.open[id] = rec
}

// Copy starts the record of to, another copy of request from sent
// later (a gateway's resend after --routed-timeout, under a request id of
// its own), when from is sampled: the copy's body arrived with from's. Each
// copy then collects its own marks, and the one that reaches the client
// is the one recorded.
func (r *Recorder) Copy(from, to string) {
	if r == nil || to == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rec := r.open[from]
	if rec == nil || len(r.open) >= maxOpen || r.open[to] != nil {
		return
	}
	c := new(record)
	c[BodyReceived] = rec[BodyReceived]
	r.open[to] = c
}

// Mark stamps stage s of request id now, once: a later mark of the same
// stage (a retry) is ignored. Requests not sampled are skipped.
func (r *Recorder) Mark(id string, s Stage) {
	if r == nil {
		return
	}
	now := r.Now()
	r.mu.Lock()
	if rec := r.open[id]; rec != nil && s < NumStages && rec[s] == 0 {
		rec[s] = now
	}
	r.mu.Unlock()
}

// Sampled reports whether request id is being recorded, so a part can
// skip work (an HTTP client trace) for the others.
func (r *Recorder) Sampled(id string) bool {
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.open[id] != nil
}

// End closes request id's record: one that reached the client's first
// byte joins the summary, any other (refused, failed, retried) is
// dropped.
func (r *Recorder) End(id string) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rec := r.open[id]
	if rec == nil {
		return
	}
	delete(r.open, id)
	if rec[ClientFirstByte] == 0 {
		return
	}
	if len(r.done) < maxDone {
		r.done = append(r.done, *rec)
		return
	}
	r.done[r.next] = *rec
	r.next = (r.next + 1) % maxDone
}

// Reset forgets every finished record, so that the next Summary covers
// what follows only.
func (r *Recorder) Reset() {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.done, r.next = r.done[:0], 0
	r.mu.Unlock()
}

// StageTime is one stage of the summary: the time from the stage the
// request passed just before it (in time) to this one, over the requests that passed
// it, in milliseconds.
type StageTime struct {
	Stage    string  `json:"stage"`
	Requests int     `json:"requests"`
	P50      float64 `json:"p50_ms"`
	P99      float64 `json:"p99_ms"`
}

// Summary is the stage table of the requests recorded since the last
// Reset.
type Summary struct {
	Requests int         `json:"requests"`
	Stages   []StageTime `json:"stages"`
	// Total is from the body received to the client's first byte.
	Total StageTime `json:"total"`
	// BusFloor is a bare NATS request and reply through the same server,
	// measured by whoever serves the summary (zero when not measured).
	BusFloor StageTime `json:"bus_floor"`
}

// Summary computes the stage table.
func (r *Recorder) Summary() Summary {
	if r == nil {
		return Summary{}
	}
	r.mu.Lock()
	recs := slices.Clone(r.done)
	r.mu.Unlock()
	var per [NumStages][]int64
	var total []int64
	var order []Stage // the stages in the order the first record passed them
	for i := range recs {
		rec := &recs[i]
		// In the order they happened: a gateway that decides itself
		// decides before it publishes.
		passed := make([]Stage, 0, NumStages)
		for s := range NumStages {
			if rec[s] != 0 {
				passed = append(passed, s)
			}
		}
		slices.SortStableFunc(passed, func(a, b Stage) int { return cmp.Compare(rec[a], rec[b]) })
		for j := 1; j < len(passed); j++ {
			per[passed[j]] = append(per[passed[j]], rec[passed[j]]-rec[passed[j-1]])
		}
		if order == nil {
			order = passed
		}
		total = append(total, rec[ClientFirstByte]-rec[BodyReceived])
	}
	sum := Summary{Requests: len(recs), Total: Quantiles("total", total)}
	for _, s := range order {
		if len(per[s]) > 0 {
			sum.Stages = append(sum.Stages, Quantiles(s.String(), per[s]))
		}
	}
	return sum
}

// Quantiles summarises durations in nanoseconds as a stage named name.
func Quantiles(name string, ns []int64) StageTime {
	st := StageTime{Stage: name, Requests: len(ns)}
	if len(ns) == 0 {
		return st
	}
	slices.Sort(ns)
	at := func(q float64) float64 {
		i := min(int(q*float64(len(ns))), len(ns)-1)
		return float64(ns[i]) / 1e6
	}
	st.P50, st.P99 = at(0.50), at(0.99)
	return st
}
