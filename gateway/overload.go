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
// filter, the limit follows the latency of admitted requests against its
// measured minimum: each window, the limit is multiplied by the gradient
// (minimum + slack) / window p90, clamped to [½, 2], plus a headroom of its
// square root. What it limits and measures is the router's own part: the
// requests admitted and not yet accepted by a replica (a long stream, once
// accepted, no longer counts), and the time from a request's first attempt
// going out to its accept (a retry, a resume or a wait for the link is not
// a sample), less the time the adapter held the accept back to send it with
// the engine's head (Llm-Held), so the engine's time to its headers is not
// taken for the router's. --max-inflight is a hard ceiling over every open
// request.
const (
	// InitialInflightLimit is the limit a gateway starts with: its
	// connection limit's default, so a gateway that is not slow refuses
	// nothing the listener would take.
	InitialInflightLimit = DefaultMaxConns
	// MinInflightLimit is the limit's floor: 16 requests waiting for an
	// accept, which at the accept's usual millisecond is thousands a
	// second.
	MinInflightLimit = 16
	// limitWindow is how often the limit moves, given limitSamples
	// accepts in the window at least.
	limitWindow  = 500 * time.Millisecond
	limitSamples = 16
	// limitSlack is the latency above the minimum that does not count as
	// slower: a quarter of it, and 5 ms, the scheduling and collection
	// pauses of a busy but healthy process (the router's part of an accept
	// takes well under a millisecond on loopback).
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
	open     int            // admitted and not over (the ceiling's count)
	pending  int            // admitted and not yet accepted (the limit's count)
	peak     int            // the most pending in the window
	tenants  map[string]int // pending per tenant
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

// admit takes one request of tenant at now, or refuses it. Past the
// ceiling everything is refused. Past the limit, batch work is refused
// from batchShare of it on; interactive work is refused once the limit is
// reached unless its tenant holds less than its fair share of it (the
// limit over the tenants with requests pending, this one counted), the
// same order as the pools' fair shedding. A limit that has had no sample
// for two windows (nothing admitted reached a replica: all refused, or
// none came) grows back by half a window's gradient each window, so a
// limit cut by a burst does not stay cut for want of samples.
func (c *concurrency) admit(tenant string, batch bool, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ceiling > 0 && c.open >= c.ceiling {
		return false
	}
	if idle := now.Sub(c.windowAt); idle >= 2*limitWindow && len(c.window) == 0 {
		c.limit = c.clamp(c.limit * math.Pow(1.5, float64(idle/limitWindow-1)))
		c.windowAt = now
	}
	lim := c.limit
	if batch {
		lim *= batchShare
	}
	if float64(c.pending) >= lim {
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
	c.open++
	c.pending++
	c.peak = max(c.peak, c.pending)
	c.tenants[tenant]++
	return true
}

// accepted moves a request of tenant from pending to open only: a
// replica took it.
func (c *concurrency) accepted(tenant string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.unpend(tenant)
}

func (c *concurrency) unpend(tenant string) {
	c.pending--
	if n := c.tenants[tenant] - 1; n > 0 {
		c.tenants[tenant] = n
	} else {
		delete(c.tenants, tenant)
	}
}

// done gives back a request of tenant; accepted says whether accepted
// was called for it.
func (c *concurrency) done(tenant string, accepted bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.open--
	if !accepted {
		c.unpend(tenant)
	}
}

// Limit is the limit in force.
func (c *concurrency) Limit() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.limit
}

// observe records a first attempt's publish-to-accept latency at now, and
// moves the limit when the window is over.
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
		// Not slower, and not in use: a limit grown past what is
		// pending would let the next burst through unmeasured.
		next = c.limit
	}
	c.limit, c.peak = c.clamp(next), c.pending
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
