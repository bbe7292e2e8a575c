package gateway

import (
	"math"
	"slices"
	"sync"
	"time"
)

// The adaptive concurrency limit: a gateway that is itself the bottleneck
// (its cores starved, its bus hop slow) refuses early and cheaply, before it
// reads a body, instead of timing out late. As Envoy's adaptive concurrency
// filter, the limit on open requests follows the latency of admitted
// requests against its measured minimum: each window, the limit is
// multiplied by the gradient (minimum + slack) / window p90, clamped to
// [½, 2], plus a headroom of its square root. The latency is the time from
// a request's arrival to its replica's accept: what the gateway, the bus
// and the adapter add, without the engine's generation, whose length says
// nothing of the router.
const (
	// InitialInflightLimit is the limit a gateway starts with: its
	// connection limit's default, so a gateway that is not slow refuses
	// nothing the listener would take.
	InitialInflightLimit = DefaultMaxConns
	// MinInflightLimit is the limit's floor.
	MinInflightLimit = 64
	// limitWindow is how often the limit moves, given limitSamples
	// accepts in the window at least.
	limitWindow  = 500 * time.Millisecond
	limitSamples = 16
	// limitSlack is the latency above the minimum that does not count as
	// slower: a quarter of it, and 5 ms (accepts on loopback take well
	// under one, and their jitter is not overload).
	limitSlackShare = 0.25
	limitSlack      = 5 * time.Millisecond
	// minRTTBuckets × minRTTBucket is the memory of the minimum: each
	// bucket keeps its windows' lowest median, and the minimum is the
	// lowest bucket, so a minimum measured under a load that has gone
	// ages out.
	minRTTBuckets = 60
	minRTTBucket  = 10 * time.Second
	// batchShare is the part of the limit batch work may fill: batch is
	// refused before interactive work is.
	batchShare = 0.75
)

// concurrency is a gateway's admission by open requests.
type concurrency struct {
	ceiling int // --max-inflight (0: adaptive only)

	mu       sync.Mutex
	limit    float64
	inflight int
	peak     int            // the most open in the window
	tenants  map[string]int // open requests per tenant
	window   []float64      // accept latencies of the window, seconds
	windowAt time.Time
	mins     [minRTTBuckets]float64 // per bucket, its windows' lowest median (0: none)
	bucketAt time.Time              // the start of the newest bucket
	newest   int                    // its index in mins
}

func newConcurrency(ceiling int, now time.Time) *concurrency {
	c := &concurrency{ceiling: ceiling, limit: InitialInflightLimit, tenants: map[string]int{}, windowAt: now, bucketAt: now}
	c.limit = c.clamp(c.limit)
	return c
}

// clamp bounds a limit to [MinInflightLimit, ceiling].
func (c *concurrency) clamp(l float64) float64 {
	l = max(l, MinInflightLimit)
	if c.ceiling > 0 {
		l = min(l, float64(c.ceiling))
	}
	return l
}

// admit takes one open request of tenant, or refuses it. Past the
// ceiling everything is refused. Past the limit, batch work is refused
// from batchShare of it on; interactive work is refused once the limit is
// reached unless its tenant holds less than its fair share of it (the
// limit over the tenants with requests open, this one counted), the same
// order as the pools' fair shedding.
func (c *concurrency) admit(tenant string, batch bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ceiling > 0 && c.inflight >= c.ceiling {
		return false
	}
	lim := c.limit
	if batch {
		lim *= batchShare
	}
	if float64(c.inflight) >= lim {
		if batch {
			return false
		}
		held := c.tenants[tenant]
		active := len(c.tenants)
		if held == 0 {
			active++
		}
		if float64(held) >= c.limit/float64(active) {
			return false
		}
	}
	c.inflight++
	c.peak = max(c.peak, c.inflight)
	c.tenants[tenant]++
	return true
}

// done gives back an open request of tenant.
func (c *concurrency) done(tenant string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inflight--
	if n := c.tenants[tenant] - 1; n > 0 {
		c.tenants[tenant] = n
	} else {
		delete(c.tenants, tenant)
	}
}

// Limit is the limit in force.
func (c *concurrency) Limit() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.limit
}

// observe records an admitted request's accept latency at now, and moves
// the limit when the window is over.
func (c *concurrency) observe(latency time.Duration, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.window = append(c.window, latency.Seconds())
	if now.Sub(c.windowAt) < limitWindow || len(c.window) < limitSamples {
		return
	}
	slices.Sort(c.window)
	p50 := c.window[len(c.window)/2]
	p90 := c.window[len(c.window)*9/10]
	c.window, c.windowAt = c.window[:0], now
	c.remember(p50, now)
	minRTT := c.minRTT()
	gradient := (minRTT*(1+limitSlackShare) + limitSlack.Seconds()) / max(p90, 1e-9)
	gradient = min(max(gradient, 0.5), 2)
	next := c.limit*gradient + math.Sqrt(c.limit)
	if gradient >= 1 && float64(c.peak) < c.limit/2 {
		// Not slower, and not in use: a limit grown past what is open
		// would let the next burst through unmeasured.
		next = c.limit
	}
	c.limit, c.peak = c.clamp(next), c.inflight
}

// remember keeps a window's median in the bucket of now.
func (c *concurrency) remember(p50 float64, now time.Time) {
	for now.Sub(c.bucketAt) >= minRTTBucket {
		c.bucketAt = c.bucketAt.Add(minRTTBucket)
		c.newest = (c.newest + 1) % minRTTBuckets
		c.mins[c.newest] = 0
		if now.Sub(c.bucketAt) >= minRTTBuckets*minRTTBucket {
			// Silent for longer than the memory: start afresh.
			clear(c.mins[:])
			c.bucketAt = now
		}
	}
	if m := c.mins[c.newest]; m == 0 || p50 < m {
		c.mins[c.newest] = p50
	}
}

// minRTT is the lowest median remembered.
func (c *concurrency) minRTT() float64 {
	low := math.Inf(1)
	for _, m := range c.mins {
		if m > 0 {
			low = min(low, m)
		}
	}
	if math.IsInf(low, 1) {
		return 0
	}
	return low
}
