package adapter

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchyard-llm/switchyard/replica-adapter/prefillfit"
	"github.com/switchyard-llm/switchyard/subjects"
)

// ttftAlpha weighs the newest time to first token in its moving average.
const ttftAlpha = 0.2

// maxScrapeBody bounds what is read from /metrics and /slots.
const maxScrapeBody = 8 << 20

// loadState is what the scraper learned about the engine, read by the
// heartbeat.
type loadState struct {
	mu       sync.Mutex
	sample   LoadSample
	have     bool   // a scrape has succeeded
	fails    int    // consecutive failed scrapes (metrics or /health)
	ready    bool   // /health has answered 200
	flavor   string // the flavor read, once known
	ttftEWMA float64
	ttftMin  float64   // the fastest first token seen: the unloaded baseline
	ttftAt   time.Time // when ttftEWMA was last updated (or decayed)
	// timed counts the first tokens the adapter timed itself (streamed
	// answers) since the last scrape: an interval without any learns
	// from the engine's own histogram (observeEngineTTFT).
	timed atomic.Int64
	// prefillRate is the learned prefill rate, uncached prompt tokens per
	// second (0: none learned), from the averages of what first tokens
	// cost (rateWork tokens in rateTime ms); prefillPeak the highest it
	// reached and prefillAt when it was last updated or decayed;
	// queuedPrefill the prompt tokens of requests at the engine without a
	// first token yet; hitRatio the share of prompt tokens the engine's
	// prefix cache served recently (prefillrate.go).
	prefillRate        float64
	fit                prefillfit.Fit // the rate from engines that say what they cached
	rateWork, rateTime float64
	prefillPeak        float64
	prefillAt          time.Time
	hitRatio           float64
	queuedPrefill      atomic.Int64
	// decode is the decode time learned from streams that ended, in ms (0:
	// none yet; decode.go).
	decode float64

	// unreachableAt is when a request last failed to connect to the
	// engine (l.clock; 0: no such mark). A good scrape or an answer of the
	// engine clears it, if it began after the mark: one begun before says
	// nothing of the engine since. Atomic, so the check on every request's
	// answer takes no lock.
	unreachableAt atomic.Int64
	epoch         time.Time // l.clock's zero, set by New
}

// clock is monotonic nanoseconds since the adapter was made, never 0: a
// step of the wall clock cannot make a mark look newer than it is.
func (l *loadState) clock() int64 { return int64(time.Since(l.epoch)) + 1 }

// markUnreachable moves the mark to at, if later; it reports whether the
// mark is new (there was none).
func (l *loadState) markUnreachable(at int64) bool {
	for {
		old := l.unreachableAt.Load()
		if old >= at {
			return false
		}
		if l.unreachableAt.CompareAndSwap(old, at) {
			return old == 0
		}
	}
}

// clearUnreachable ends the mark if it was set before since (l.clock);
// it reports whether it did.
func (l *loadState) clearUnreachable(since int64) bool {
	for {
		at := l.unreachableAt.Load()
		if at == 0 || at >= since {
			return false
		}
		if l.unreachableAt.CompareAndSwap(at, 0) {
			return true
		}
	}
}

func (l *loadState) observeTTFT(d time.Duration) {
	l.observeTTFTAt(d, time.Now())
}

func (l *loadState) observeTTFTAt(d time.Duration, now time.Time) {
	l.timed.Add(1)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.observeTTFTLocked(d, now)
}

// observeTTFTLocked folds one time to first token into the average and
// the baseline. l.mu must be held.
func (l *loadState) observeTTFTLocked(d time.Duration, now time.Time) {
	ms := float64(d) / float64(time.Millisecond)
	if l.ttftEWMA == 0 {
		l.ttftEWMA, l.ttftMin, l.ttftAt = ms, ms, now
		return
	}
	l.decayLocked(now)
	l.ttftEWMA += ttftAlpha * (ms - l.ttftEWMA)
	l.ttftAt = now
	l.ttftMin = min(l.ttftMin, ms)
}

// observeEngineTTFT learns the time to first token from the engine's own
// histogram for the answers the adapter cannot time: a non-streamed answer
// arrives whole, its first token unseen. Between two scrapes in which the
// adapter timed no first token itself (timed, the streamed answers since
// the last scrape), the mean of the histogram's new observations counts
// as one first token; a replica whose first scrape finds observations
// already (an engine that served before its adapter started) takes their
// mean as its first evidence. A histogram that went back (an engine
// restart) or a mean out of range teaches nothing. l.mu must be held.
func (l *loadState) observeEngineTTFT(prev, cur LoadSample, had bool, timed int64, now time.Time) {
	if !cur.TTFTKnown || timed > 0 {
		return
	}
	ds, dc := cur.TTFTSeconds, cur.TTFTCount
	if had && prev.TTFTKnown {
		ds, dc = ds-prev.TTFTSeconds, dc-prev.TTFTCount
	} else if l.ttftEWMA != 0 {
		return
	}
	if dc <= 0 || ds <= 0 {
		return
	}
	mean := ds / dc
	if !(mean > 0 && mean*1000 <= subjects.MaxHeartbeatMillis) {
		return
	}
	l.observeTTFTLocked(time.Duration(mean*float64(time.Second)), now)
}

func (a *Adapter) scrapeLoop(ctx context.Context) {
	t := time.NewTicker(a.cfg.ScrapeEvery)
	defer t.Stop()
	var regErr string // the last registration error, logged once, not every tick
	for {
		a.scrape(ctx)
		a.beats.scrapeEnded(a.load.clock())
		a.svc.refresh(a)
		switch err := a.register(ctx, false); {
		case err != nil && ctx.Err() == nil && err.Error() != regErr:
			regErr = err.Error()
			a.log.Warn("registering replica failed", "err", err)
		case err == nil && regErr != "":
			regErr = ""
			a.log.Info("replica registered")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// scrape polls /health and /metrics once. The replica is "loading" until
// /health first answers 200, "ready" after. A scrape fails when either
// fails; after ScrapeFailLimit consecutive failures the heartbeat says
// scrape_ok=false, and brokers exclude a replica whose heartbeat says so, as
// they would a dead one, without touching its registered state.
//
// A scrape that times out while the engine's streams kept flowing does not
// count towards the limit: a loaded engine (thousands of open streams on a
// busy machine) can be slow to answer /metrics, and is not down. The load
// data then only ages, and brokers treat it as stale.
func (a *Adapter) scrape(ctx context.Context) {
	began, beganClock := time.Now(), a.load.clock()
	ctx, cancel := context.WithTimeout(ctx, max(a.cfg.ScrapeEvery, time.Second))
	defer cancel()
	healthErr := a.health(ctx)
	a.checkAuth(ctx)
	sample, flavor, metricsErr := a.metricsSample(ctx)

	l := &a.load
	l.mu.Lock()
	defer l.mu.Unlock()
	if healthErr == nil {
		l.ready = true
	}
	if metricsErr == nil {
		l.observeHits(l.sample, sample, l.have)
		l.observeEngineTTFT(l.sample, sample, l.have, l.timed.Swap(0), time.Now())
		l.sample, l.have, l.flavor = sample, true, flavor
	}
	if healthErr != nil || metricsErr != nil {
		a.metrics.scrapeFailures.Inc()
		if ctx.Err() == context.DeadlineExceeded && a.engine.streamed.Load() >= began.UnixNano() {
			return // slow, not down: it streamed during the scrape
		}
		l.fails++
		if l.fails == a.cfg.ScrapeFailLimit && ctx.Err() == nil {
			a.log.Warn("engine scrape failing, heartbeat says scrape_ok=false", "health", healthErr, "metrics", metricsErr)
		}
		return
	}
	if l.clearUnreachable(beganClock) || l.fails >= a.cfg.ScrapeFailLimit {
		a.log.Info("engine scrape recovered")
	}
	l.fails = 0
}

// engineUnreachable takes a request that could not connect to the engine
// as a failed health check past the limit: the replica says
// scrape_ok=false at once, rather than after ScrapeFailLimit scrapes, so
// brokers stop sending it requests that would only be retried (an engine
// that is down reports no load, which makes it look like the best choice).
// The next good scrape, or the engine's next answer to a request, clears
// it.
func (a *Adapter) engineUnreachable(err error) {
	if a.load.markUnreachable(a.load.clock()) {
		a.log.Warn("engine unreachable, heartbeat says scrape_ok=false", "err", err)
		a.publishHeartbeat()
	}
}

// engineReached ends an engineUnreachable mark when the engine answers a
// request sent after the mark (sent, l.clock), whatever the status: it is
// reachable again. Such a request was routed before its broker saw the
// mark, as when the engine restarts at once; the heartbeat goes at once,
// so brokers do not leave the replica out until the next scrape (up to
// ScrapeEvery) on the strength of a mark already stale. Failing scrapes
// still count on their own.
func (a *Adapter) engineReached(sent int64) {
	if a.load.clearUnreachable(sent) {
		a.log.Info("engine reachable again")
		a.publishHeartbeat()
	}
}

func (a *Adapter) health(ctx context.Context) error {
	resp, err := a.get(ctx, "/health")
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/health answered %d", resp.StatusCode)
	}
	return nil
}

func (a *Adapter) metricsSample(ctx context.Context) (LoadSample, string, error) {
	resp, err := a.get(ctx, "/metrics")
	if err != nil {
		return LoadSample{}, "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return LoadSample{}, "", fmt.Errorf("/metrics answered %d", resp.StatusCode)
	}
	a.load.mu.Lock()
	flavor := a.load.flavor
	a.load.mu.Unlock()
	if flavor == "" {
		flavor = a.cfg.Flavor
	}
	s, flavor, err := ParseMetrics(flavor, io.LimitReader(resp.Body, maxScrapeBody))
	if err != nil {
		return s, flavor, err
	}
	if flavor == FlavorLlamaCpp {
		// llama.cpp has no KV metric; the share of busy slots stands in.
		if u, n, err := a.slots(ctx); err == nil {
			s.KVUsage, s.KVKnown, s.MaxBatch = u, true, n
		}
	}
	estimateKV(&s, a.limits.withEngine(s).batch)
	return s, flavor, nil
}

func (a *Adapter) slots(ctx context.Context) (float64, int, error) {
	resp, err := a.get(ctx, "/slots")
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("/slots answered %d", resp.StatusCode)
	}
	return slotUsage(io.LimitReader(resp.Body, maxScrapeBody))
}

func (a *Adapter) get(ctx context.Context, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.cfg.EngineURL+path, nil)
	if err != nil {
		return nil, err
	}
	return a.engine.client.Do(req)
}

// state is the replica's own state: loading until the engine is healthy,
// ready after, draining once the drain began.
func (a *Adapter) state() string {
	if a.book.isDraining() {
		return subjects.StateDraining
	}
	a.load.mu.Lock()
	defer a.load.mu.Unlock()
	if a.load.ready {
		return subjects.StateReady
	}
	return subjects.StateLoading
}

// beats is the heartbeat's own state: its sequence, and the end of the
// last scrape, which the heartbeat after a tick waits for (heartbeatLoop).
type beats struct {
	seq       atomic.Uint64
	scraped   chan struct{} // signalled when a scrape ends
	scrapedAt atomic.Int64  // when the last scrape ended (load.clock)
}

func newBeats() beats { return beats{scraped: make(chan struct{}, 1)} }

// scrapeEnded records that a scrape ended at (load.clock), and signals it.
func (b *beats) scrapeEnded(at int64) {
	b.scrapedAt.Store(at)
	select {
	case b.scraped <- struct{}{}:
	default:
	}
}

// heartbeatLoop publishes a heartbeat every HeartbeatEvery. When the
// engine is scraped at least as often, each heartbeat after a tick waits
// for the scrape that ends next (at most ScrapeEvery) unless one ended
// within the last tenth of a scrape period: the engine's load a heartbeat
// carries (KV usage, running, waiting) is then milliseconds old when it is
// sent. Sent at its tick instead, a heartbeat left just before the scrape
// of the same period ends carries the load of the period before, a whole
// scrape period old, and deciders route on it as the replica's present.
// An engine that does not answer delays heartbeats by at most ScrapeEvery.
func (a *Adapter) heartbeatLoop(ctx context.Context) {
	t := time.NewTicker(a.cfg.HeartbeatEvery)
	defer t.Stop()
	follow := a.cfg.ScrapeEvery <= a.cfg.HeartbeatEvery
	wait := time.NewTimer(a.cfg.ScrapeEvery)
	defer wait.Stop()
	for {
		a.publishHeartbeat()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !follow {
			continue
		}
		fresh := func() bool { return a.load.clock()-a.beats.scrapedAt.Load() < int64(a.cfg.ScrapeEvery/10) }
		if fresh() {
			continue
		}
		select {
		case <-a.beats.scraped: // an older scrape's signal
		default:
		}
		if fresh() {
			continue
		}
		wait.Reset(a.cfg.ScrapeEvery)
		select {
		case <-ctx.Done():
			return
		case <-a.beats.scraped:
		case <-wait.C:
		}
		wait.Stop()
	}
}

func (a *Adapter) heartbeat() subjects.Heartbeat {
	hb := subjects.Heartbeat{
		Replica:   a.cfg.Replica,
		Model:     a.cfg.Model,
		Version:   a.cfg.Version,
		Pool:      a.cfg.Pool,
		Region:    a.cfg.Region,
		State:     a.state(),
		Inflight:  a.InFlight(),
		Endpoints: a.endpoints(),
	}
	l := &a.load
	l.mu.Lock()
	s := l.sample
	lim := a.limits.withEngine(s)
	hb.MaxBatch, hb.MaxQueue, hb.MaxBatchFrom, hb.MaxQueueFrom = lim.batch, lim.queue, lim.batchFrom, lim.queueFrom
	hb.KVUsage, hb.Running, hb.Waiting = s.KVUsage, s.Running, s.Waiting
	hb.Lora = subjects.LoraState{Running: orEmpty(s.LoraRunning), Waiting: orEmpty(s.LoraWaiting), Max: s.MaxLora}
	// Queue wait is approximated as the time to first token above the
	// fastest one seen: what an unloaded engine needs is not waiting.
	now := time.Now()
	hb.TTFTEWMAMillis, hb.QueueWaitMillis = l.waitEstimateLocked(now, hb.Inflight)
	hb.PrefillTokensPerSec = l.prefillRateLocked(now)
	hb.QueuedPrefillTokens = l.queuedUncachedLocked()
	hb.DecodeMillis = l.decode
	hb.ScrapeOK = l.have && l.fails < a.cfg.ScrapeFailLimit && l.unreachableAt.Load() == 0
	hb.KVBlocks, hb.BlockSize = s.KVBlocks, s.BlockSize
	l.mu.Unlock()
	if a.cfg.KVBlocks > 0 {
		hb.KVBlocks = a.cfg.KVBlocks
	}
	if a.kv != nil {
		hb.KVEvents, hb.KVEventsRefused = a.kv.state()
	}
	if a.cfg.EngineScheduling == SchedulingPriority {
		hb.Scheduling = subjects.SchedulingPriority
		hb.BatchWaiting = a.batchWaiting(hb.Inflight, hb.MaxBatch)
	}
	hb.EngineFailures, hb.EngineSuccesses, hb.AuthFailed = a.engine.outcomes.snapshot()
	// An engine that refuses the key answers /health and /metrics all the
	// same, but every request: the replica is not healthy.
	hb.ScrapeOK = hb.ScrapeOK && !hb.AuthFailed
	if hb.Lora.Max == 0 {
		hb.Lora.Max = a.cfg.MaxLoras
	}
	hb.Seq = a.beats.seq.Add(1)
	hb.SentUnixMillis = time.Now().UnixMilli()
	return hb
}

func (a *Adapter) publishHeartbeat() {
	hb := a.heartbeat()
	b, err := json.Marshal(hb)
	if err == nil {
		err = a.nc.Publish(a.subj.Heartbeat(a.cfg.Replica), b)
	}
	if err != nil {
		a.log.Warn("heartbeat not sent", "err", err)
		return
	}
	a.metrics.heartbeatSeq.Set(float64(hb.Seq))
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
