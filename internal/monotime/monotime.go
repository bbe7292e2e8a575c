// Package monotime dates events in int64 nanoseconds that keep to the
// monotonic clock, so that ages computed from them are elapsed time.
package monotime

import "time"

// Scale converts times into nanoseconds on the Unix scale that follow the
// monotonic clock from the Scale's creation on: a step of the wall clock
// (an NTP correction, a virtual machine's clock sync) moves none of them,
// so the difference of two is the time that passed between them. Stored
// as an int64, a time.Time's monotonic reading is lost; converted here it
// is kept. A time with no monotonic reading (a test's or the lab's virtual
// clock) converts to its UnixNano exactly. The zero Scale converts every
// time to its UnixNano.
type Scale struct {
	epoch     time.Time
	epochNano int64
}

// New starts a Scale now.
func New() Scale {
	now := time.Now()
	return Scale{epoch: now, epochNano: now.UnixNano()}
}

// Nanos is t on the scale.
func (s Scale) Nanos(t time.Time) int64 {
	if s.epoch.IsZero() {
		return t.UnixNano()
	}
	return s.epochNano + int64(t.Sub(s.epoch))
}

// Time is the time of n, a value of Nanos: with the Scale's monotonic
// reading, so comparing it with time.Now() measures elapsed time.
func (s Scale) Time(n int64) time.Time {
	if s.epoch.IsZero() {
		return time.Unix(0, n)
	}
	return s.epoch.Add(time.Duration(n - s.epochNano))
}

// Lag is how long before t a sender's wall clock says it sent (sentNano,
// unix ns): a difference of two wall clocks, as a sender's timestamp can
// only be, never negative.
func Lag(t time.Time, sentNano int64) int64 {
	if sentNano <= 0 {
		return 0
	}
	return max(t.UnixNano()-sentNano, 0)
}
