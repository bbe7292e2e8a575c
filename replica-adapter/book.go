package adapter

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
)

// book is the work the replica has in hand: the requests and prefill legs
// in flight, and the cancels that came before their requests. Its mutex
// orders the drain against new work: work is counted in wg under mu only
// while not draining, so the drain's wait sees it.
type book struct {
	base context.Context // parent of every engine call; ends when the drain grace runs out

	mu       sync.Mutex
	draining bool
	calls    map[string]*call // by Llm-Request-Id, for cancels
	// prefills are the prefill legs in flight on this (prefill) replica,
	// by the decode replica that sent them and Llm-Request-Id, for that
	// decode replica's cancel; legsFrom counts them by decode replica,
	// for the bound on one sender's legs (legBounds).
	prefills map[prefillKey]context.CancelFunc
	legsFrom map[string]int
	// early holds cancels that arrived before their request (the request
	// and cancel subscriptions are separate, so a backlogged adapter can
	// see the cancel first), so the request is dropped when it comes.
	early map[string]time.Time
	wg    sync.WaitGroup

	inflight atomic.Int64 // requests taken and not yet finished
	// batchHeld counts the batch lines in flight at an engine scheduling
	// by priority (behindInteractive).
	batchHeld atomic.Int64
}

func newBook() book {
	return book{calls: map[string]*call{}, prefills: map[prefillKey]context.CancelFunc{}, legsFrom: map[string]int{}, early: map[string]time.Time{}}
}

// call is one request in flight, findable by its Llm-Request-Id for cancels.
type call struct {
	cancel context.CancelFunc
}

// taken is what the book makes of a request that arrives.
type taken uint8

const (
	takenNow     taken = iota // booked: serve it
	takenNot                  // the replica drains
	takenGone                 // its cancel came first
	takenAlready              // the same request is in hand
)

// take books request id, with the context of its engine call, unless the
// replica drains, the request's cancel came first, or it is in hand
// already. An empty id is booked but cannot be cancelled.
func (b *book) take(id string) (context.Context, *call, taken) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.draining {
		return nil, nil, takenNot
	}
	if id != "" {
		if _, gone := b.early[id]; gone {
			delete(b.early, id)
			return nil, nil, takenGone
		}
		if _, serving := b.calls[id]; serving {
			return nil, nil, takenAlready
		}
	}
	ctx, cancel := context.WithCancel(b.base)
	c := &call{cancel: cancel}
	if id != "" {
		b.calls[id] = c
	}
	b.wg.Add(1)
	return ctx, c, takenNow
}

// forget ends the call of request id; release, after it, lets the drain
// go on.
func (b *book) forget(c *call, id string) {
	c.cancel()
	b.mu.Lock()
	if b.calls[id] == c {
		delete(b.calls, id)
	}
	b.mu.Unlock()
}

func (b *book) release() { b.wg.Done() }

// cancel cancels the call of request id, or remembers the cancel for a
// request that has not arrived (or already finished).
func (b *book) cancel(id string, now time.Time) {
	b.mu.Lock()
	c := b.calls[id]
	if c == nil && id != "" {
		b.rememberEarlyLocked(id, now)
	}
	b.mu.Unlock()
	if c != nil {
		c.cancel()
	}
}

// earlyTTL bounds how long a cancel waits for its request; earlyMax how
// many such cancels are kept.
const (
	earlyTTL = 30 * time.Second
	earlyMax = 4096
)

// rememberEarlyLocked records a cancel whose request has not arrived (or
// already finished). Lock should be held.
func (b *book) rememberEarlyLocked(id string, now time.Time) {
	if len(b.early) >= earlyMax {
		for k, t := range b.early {
			if now.Sub(t) > earlyTTL || len(b.early) >= earlyMax {
				delete(b.early, k)
			}
		}
	}
	b.early[id] = now
}

// takeLeg books prefill leg key, with the context of its engine call and
// the end of its booking, unless the replica drains, the leg is in flight
// already, or its sender or all of them have as many legs in flight as
// legBounds allows (perSender, total): then it returns why, a 503 that
// names replica.
func (b *book) takeLeg(key prefillKey, perSender, total int, replica string) (context.Context, func(), *subjects.APIError) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var code, msg string
	switch {
	case b.draining || b.prefills[key] != nil:
		code, msg = subjects.CodeNoReplicas, "replica "+replica+" takes no prefill leg "+key.id+" now"
	case b.legsFrom[key.decode] >= perSender:
		code, msg = subjects.CodeAllReplicasBusy, "replica "+replica+" has "+strconv.Itoa(perSender)+" prefill legs of "+
			key.decode+" in flight, the most it takes from one decode replica; retry later."
	case len(b.prefills) >= total:
		code, msg = subjects.CodeAllReplicasBusy, "replica "+replica+" has "+strconv.Itoa(total)+" prefill legs in flight, its most; retry later."
	}
	if code != "" {
		return nil, nil, &subjects.APIError{Status: http.StatusServiceUnavailable, Code: code, Message: msg, RetryAfter: time.Second}
	}
	ctx, cancel := context.WithCancel(b.base)
	b.prefills[key] = cancel
	b.legsFrom[key.decode]++
	b.wg.Add(1)
	return ctx, func() {
		cancel()
		b.mu.Lock()
		delete(b.prefills, key)
		if n := b.legsFrom[key.decode] - 1; n > 0 {
			b.legsFrom[key.decode] = n
		} else {
			delete(b.legsFrom, key.decode)
		}
		b.mu.Unlock()
		b.wg.Done()
	}, nil
}

// cancelLeg cancels prefill leg key, if it is in flight.
func (b *book) cancelLeg(key prefillKey) {
	b.mu.Lock()
	cancel := b.prefills[key]
	b.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// drain refuses new work from now on.
func (b *book) drain() {
	b.mu.Lock()
	b.draining = true
	b.mu.Unlock()
}

func (b *book) isDraining() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.draining
}

// wait returns a channel closed when the work in hand has ended.
func (b *book) wait() <-chan struct{} {
	done := make(chan struct{})
	go func() { b.wg.Wait(); close(done) }()
	return done
}
