package policy

import (
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// coldLoad is what the loader last said about a cold model's load, so that
// model_loading's Retry-After is the expected remaining time rather than a
// constant (llm.control.load.status).
type coldLoad struct {
	eta      time.Time     // when the load in flight should be ready; zero when none
	measured time.Duration // the last measured time to ready
}

// maxColdRetry bounds a Retry-After taken from a load status.
const maxColdRetry = time.Hour

// ObserveLoad takes one load status. A load in flight sets when the model
// should be ready (its start plus the expected time); ready records the
// measured time; a failed load is expected back after its cooldown.
func (r *Router) ObserveLoad(s *subjects.LoadStatus, now time.Time) {
	if s.Model == "" || s.ElapsedMillis < 0 || s.ExpectedMillis < 0 || s.RetryAfterMillis < 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cold == nil {
		r.cold = map[string]coldLoad{}
	}
	c, known := r.cold[s.Model]
	if !known && len(r.cold) >= maxColdModels {
		return
	}
	// A start in the future, or long past, would put the ETA, and with it
	// model_loading's Retry-After, anywhere: it is held to the last hour.
	started := time.UnixMilli(s.StartedUnixMillis)
	if started.After(now) || now.Sub(started) > maxColdRetry {
		started = now
	}
	switch s.Phase {
	case subjects.LoadRequested, subjects.LoadStarted:
		if expected := coldMillis(s.ExpectedMillis); expected > 0 {
			c.eta = started.Add(expected)
		}
	case subjects.LoadReady:
		c.eta = time.Time{}
		c.measured = coldMillis(s.ElapsedMillis)
	case subjects.LoadFailed:
		c.eta = now.Add(coldMillis(s.RetryAfterMillis))
	case subjects.LoadUnloaded:
		c.eta = time.Time{}
	default:
		return
	}
	r.cold[s.Model] = c
}

// coldMillis is a status's milliseconds as a duration of at most
// maxColdRetry, clamped before it is multiplied so a huge count cannot
// overflow into a negative one.
func coldMillis(ms int64) time.Duration {
	return time.Duration(min(ms, maxColdRetry.Milliseconds())) * time.Millisecond
}

// maxColdModels bounds the load statuses remembered.
const maxColdModels = 4096

// coldRetryAfter is the Retry-After of model_loading for model: the time
// left of the load in flight, else the model's expected_load_seconds, else
// the last measured time to ready, else RetryColdLoad. Lock must be held.
func (st *decision) coldRetryAfter(model string, m *table.Model) time.Duration {
	c := st.r.cold[model]
	if !c.eta.IsZero() {
		return max(c.eta.Sub(st.now), RetryColdOverdue)
	}
	switch {
	case m != nil && m.ExpectedLoadSeconds > 0:
		return time.Duration(m.ExpectedLoadSeconds * float64(time.Second))
	case c.measured > 0:
		return c.measured
	}
	return RetryColdLoad
}
