package batch

import (
	"sync"
	"time"
)

// admission decides how many lines may be in flight: a window. A 503 says
// the pool is full with the lines it holds: the window shrinks to the
// other lines in flight (at least one), and the refused line leaves it at
// once and goes back to the stream for its Retry-After. So a line that
// ends is replaced at once while the pool takes it, a line more than the
// pool holds is refused once, not again every second, and the batch gives
// room back as soon as interactive traffic takes it: its refusals shrink
// the window to what the pool still holds. An answer grows the window by
// one line, or, within probeAfter of a refusal, by one line per window of
// answers: the pool was full a moment ago, so the window probes for room
// slowly instead of sending lines to be refused. Each tenant with running
// batches gets an equal share of the window, so one tenant's batch cannot
// starve another's. A 429 (a quota, the tenant's share of a shedding
// pool) pauses its tenant for its Retry-After and leaves the window.
type admission struct {
	mu          sync.Mutex
	limit       float64
	window      float64
	lastRefusal time.Time
	tenantPause map[string]time.Time
	inflight    map[string]int
	total       int
	active      int
	wake        chan struct{}
	m           *metrics
}

const (
	startWindow = 16
	probeAfter  = time.Second
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

// refused counts a refusal of one of tenant's lines, which then leaves the
// window (release).
func (a *admission) refused(tenant string, status int, retryAfter time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	if status == 429 {
		a.tenantPause[tenant] = now.Add(retryAfter)
		return
	}
	a.lastRefusal = now
	a.window = max(1, min(a.window, float64(a.total-1)))
	a.m.window.Set(a.window)
}

func (a *admission) answered() {
	a.mu.Lock()
	if time.Since(a.lastRefusal) < probeAfter {
		a.window += 1 / a.window
	} else {
		a.window++
	}
	a.window = min(a.limit, a.window)
	w := a.window
	a.mu.Unlock()
	a.m.window.Set(w)
}
