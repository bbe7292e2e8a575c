package batch

import (
	"sync"
	"time"
)

// admission decides how many lines may be in flight: a window that grows
// by one line per answer and, on a refusal, shrinks by a quarter (at most
// once per cutEvery) but never below the lines the pool held then (those
// in flight less those waiting out a refusal): a refusal says the pool is
// full with what it holds, no less. So the batch finds the pool's spare
// room (brokers and adapters refuse batch work past it) and gives it back
// as soon as interactive traffic takes it: lines that end are not
// replaced while the pool refuses, and the window follows. Each tenant
// with running batches gets an equal share of the window, so one tenant's
// batch cannot starve another's. A 429 pauses its tenant for its
// Retry-After; a refused line waits for its own Retry-After, in the
// window.
type admission struct {
	mu          sync.Mutex
	limit       float64
	window      float64
	lastCut     time.Time
	tenantPause map[string]time.Time
	inflight    map[string]int
	total       int
	pacing      int // lines in flight waiting out a refusal
	active      int
	wake        chan struct{}
	m           *metrics
}

const (
	startWindow = 16
	cutEvery    = time.Second
	cutTo       = 0.75
)

func (a *admission) init(limit int, m *metrics) {
	a.limit, a.window = float64(limit), float64(min(startWindow, limit))
	a.tenantPause, a.inflight = map[string]time.Time{}, map[string]int{}
	a.wake = make(chan struct{}, 1)
	a.m = m
	m.window.Set(a.window)
}

// setActive is the number of tenants with running batches.
func (a *admission) setActive(n int) {
	a.mu.Lock()
	a.active = n
	a.mu.Unlock()
}

// room is how many more lines tenant may start now.
func (a *admission) room(tenant string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	if now.Before(a.tenantPause[tenant]) {
		return 0
	}
	w := int(a.window)
	share := max(1, w/max(1, a.active))
	return max(0, min(share-a.inflight[tenant], w-a.total))
}

func (a *admission) take(tenant string) {
	a.mu.Lock()
	a.inflight[tenant]++
	a.total++
	a.mu.Unlock()
	a.m.inflight.Inc()
}

func (a *admission) release(tenant string) {
	a.mu.Lock()
	if a.inflight[tenant]--; a.inflight[tenant] <= 0 {
		delete(a.inflight, tenant)
	}
	a.total--
	a.mu.Unlock()
	a.m.inflight.Dec()
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// refused counts a refusal of one of tenant's lines, which waits out its
// Retry-After in the window and then calls retry.
func (a *admission) refused(tenant string, status int, retryAfter time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	a.pacing++
	if now.Sub(a.lastCut) >= cutEvery {
		held := float64(a.total - a.pacing)
		a.window = max(1, min(a.window, max(a.window*cutTo, held)))
		a.lastCut = now
		a.m.window.Set(a.window)
	}
	if status == 429 {
		a.tenantPause[tenant] = now.Add(retryAfter)
	}
}

// retry ends a refused line's wait: it leaves the window with release.
func (a *admission) retry() {
	a.mu.Lock()
	a.pacing--
	a.mu.Unlock()
}

func (a *admission) answered() {
	a.mu.Lock()
	a.window = min(a.limit, a.window+1)
	w := a.window
	a.mu.Unlock()
	a.m.window.Set(w)
}
