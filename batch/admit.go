package batch

import (
	"sync"
	"time"
)

// admission decides how many lines may be in flight: a window. Where the
// batcher sees the pool (its load view, loadView.room), the window is the
// lines it holds plus its share of the pool's free batch room, less the
// lines it started that the view cannot show yet (inTransit): it fills the
// room the replicas show without being refused first, and gives room back
// as interactive work takes it. A 503 still cuts the window at once: it
// shrinks to the other lines in flight (at least one), and the refused
// line leaves it and goes back to the stream for its Retry-After. For
// probeAfter after a refusal the window grows by one line per window of
// answers and caps what the view allows; after that the view alone sets
// it. Without a view (no replica heard from) the window is the refusals'
// alone: an answer grows it by one line, or by one line per window of
// answers within probeAfter of a refusal. Each tenant with running
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
	view        *loadView   // nil: pace on refusals alone
	started     []time.Time // when the lines of the last inTransit started
	now         func() time.Time
}

const (
	startWindow = 16
	probeAfter  = time.Second
)

func (a *admission) init(limit int, m *metrics, now func() time.Time) {
	a.limit, a.window = float64(limit), float64(min(startWindow, limit))
	a.tenantPause, a.inflight = map[string]time.Time{}, map[string]int{}
	a.wake = make(chan struct{}, 1)
	a.m, a.now = m, now
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
	now := a.now()
	if now.Before(a.tenantPause[tenant]) {
		return 0
	}
	w := a.windowAt(now)
	share := max(1, w/max(1, a.active))
	return max(0, min(share-a.inflight[tenant], w-a.total))
}

// windowAt is the window now. Lock should be held.
func (a *admission) windowAt(now time.Time) int {
	w := a.window
	if a.view != nil {
		r := a.view.room(now, a.total)
		a.m.setRoom(r)
		if r.Known {
			i := 0
			for i < len(a.started) && now.Sub(a.started[i]) > inTransit {
				i++
			}
			a.started = a.started[i:]
			if now.Sub(a.lastRefusal) >= probeAfter {
				w = a.limit
			}
			w = min(w, float64(max(0, a.total+r.Share-len(a.started))))
		}
	}
	a.m.window.Set(w)
	return int(w)
}

func (a *admission) take(tenant string) {
	a.mu.Lock()
	a.inflight[tenant]++
	a.total++
	if a.view != nil {
		a.started = append(a.started, a.now())
	}
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
	now := a.now()
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
	if a.now().Sub(a.lastRefusal) < probeAfter {
		a.window += 1 / a.window
	} else {
		a.window++
	}
	a.window = min(a.limit, a.window)
	w := a.window
	a.mu.Unlock()
	a.m.window.Set(w)
}
