package adapter_test

import (
	"slices"
	"testing"
	"time"
)

// A heartbeat carries the engine's load from the scrape that ended just
// before it, not from the scrape of the period before: with scrapes that
// take 300 ms (a slow /health), a heartbeat sent at its tick would carry
// load about 700 ms old; following the scrape it carries load milliseconds
// old.
func TestHeartbeatFollowsTheScrape(t *testing.T) {
	e := newEnv(t)
	const stall = 300 * time.Millisecond
	e.eng.stall.Store(int64(stall))
	cfg := e.config()
	cfg.HeartbeatEvery, cfg.ScrapeEvery = time.Second, time.Second
	nextHB := heartbeats(t, e.nc, cfg.Replica)
	e.start(cfg)
	var ages []time.Duration
	for i := range 7 {
		hb := nextHB()
		if i < 2 { // the first heartbeats precede the first scrapes
			continue
		}
		ages = append(ages, time.Duration(hb.SentUnixMillis-e.eng.metricsAt.Load())*time.Millisecond)
	}
	slices.Sort(ages)
	if median := ages[len(ages)/2]; median >= stall {
		t.Errorf("heartbeats sent %v after the scrape they carry (median); want well under the %v a scrape takes", ages, stall)
	}
	t.Logf("load age when sent: %v", ages)
}
