package adapter

import (
	"math"
	"time"
)

// waitHalfLife is how fast a time-to-first-token estimate with no fresh
// samples relaxes toward the unloaded baseline. The estimate is only
// updated by requests that reach the engine; without decay, a burst that
// pushed it to seconds would keep every deadline-carrying request away
// (brokers reject what cannot start in time), so no new sample would ever
// bring it down.
const waitHalfLife = 5 * time.Second

// decayLocked relaxes the moving average toward the fastest first token
// seen, by the time since the last sample. l.mu must be held.
func (l *loadState) decayLocked(now time.Time) {
	if l.ttftEWMA == 0 || l.ttftAt.IsZero() {
		return
	}
	age := now.Sub(l.ttftAt)
	if age <= 0 {
		return
	}
	l.ttftEWMA = relax(l.ttftEWMA, l.ttftMin, age)
	l.ttftAt = now
}

// relax moves v toward target by what waitHalfLife takes off the distance
// in age.
func relax(v, target float64, age time.Duration) float64 {
	return target + (v-target)*math.Exp2(-float64(age)/float64(waitHalfLife))
}

// waitEstimateLocked is what the heartbeat says about the time to a first
// token, following the engine's present state: an idle engine (nothing
// running or waiting in its last scrape, nothing in flight here) answers in
// its bare time to first token with no queue; otherwise the moving average,
// decayed by the time since its last sample. l.mu must be held.
func (l *loadState) waitEstimateLocked(now time.Time, inflight int) (ttft, queue float64) {
	l.decayLocked(now)
	if l.have && l.sample.Running == 0 && l.sample.Waiting == 0 && inflight == 0 {
		return l.ttftMin, 0
	}
	return l.ttftEWMA, max(0, l.ttftEWMA-l.ttftMin)
}
