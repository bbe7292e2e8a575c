package batch

import (
	"sync"
	"time"
)

// admission decides how many lines may be in flight: a window. Where the
// batcher sees the pool (its load view, loadView.room), the window is the
// lines it holds plus its share of the pool's free batch room, less the
// lines the view cannot show yet (those no replica accepted, and those a
// replica accepted since its last load delta): it fills the
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
	view        *loadView // nil: pace on refusals alone
	// unseen counts the lines in flight no replica accepted yet: the
	// view cannot show them (the lines a replica accepted since its last
	// load delta are the view's, loadView.accepted).
	unseen int
	now    func() time.Time
}

// slot is one line's place in the window. Lock: admission.mu.
type slot struct{ accepted bool }

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

// observe brings the window's and the room's metrics up to date, also
// while no batch runs.
func (a *admission) observe() {
	a.mu.Lock()
	a.windowAt(a.now())
	a.mu.Unlock()
}

// windowAt is the window now. Lock should be held.
func (a *admission) windowAt(now time.Time) int {
	w := a.window
	if a.view != nil {
		r := a.view.room(now, a.total)
		a.m.setRoom(r)
		if r.Known {
			if now.Sub(a.lastRefusal) >= probeAfter {
				w = a.limit
			}
			w = min(w, float64(max(0, a.total+r.Share-a.unseen)))
		}
	}
	a.m.window.Set(w)
	return int(w)
}

func (a *admission) take(tenant string) *slot {
	a.mu.Lock()
	a.inflight[tenant]++
	a.total++
	a.unseen++
	a.mu.Unlock()
	a.m.inflight.Inc()
	return new(slot)
}

// accepted records that replica accepted s's line: the load view counts
// it there until the replica's next load delta or heartbeat shows it.
func (a *admission) accepted(s *slot, replica string) {
	a.mu.Lock()
	if !s.accepted {
		s.accepted = true
		a.unseen--
		if a.view != nil {
			a.view.accepted(replica)
		}
	}
	a.mu.Unlock()
}

// release ends s's line (nil: one never accepted).
func (a *admission) release(tenant string, s *slot) {
	a.mu.Lock()
	if a.inflight[tenant]--; a.inflight[tenant] <= 0 {
		delete(a.inflight, tenant)
	}
	a.total--
	if s == nil || !s.accepted {
		a.unseen--
	}
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
}

func (a *admission) answered() {
	a.mu.Lock()
	if a.now().Sub(a.lastRefusal) < probeAfter {
		a.window += 1 / a.window
	} else {
		a.window++
	}
	a.window = min(a.limit, a.window)
	a.mu.Unlock()
}
