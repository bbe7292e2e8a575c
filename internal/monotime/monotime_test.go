package monotime_test

import (
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/internal/monotime"
)

// Times with a monotonic reading convert by the monotonic clock: stripping
// the reading and moving the wall clock alone (what a clock step does to
// time.Now's wall reading) changes the stripped time's nanos, not those of
// the time that kept its reading.
func TestNanosFollowTheMonotonicClock(t *testing.T) {
	s := monotime.New()
	now := time.Now()
	later := now.Add(3 * time.Second)
	if d := s.Nanos(later) - s.Nanos(now); d != int64(3*time.Second) {
		t.Fatalf("3 s apart on the monotonic clock: %d ns", d)
	}
	// A time with no monotonic reading converts to its UnixNano.
	wall := time.Unix(1_700_000_000, 5)
	if got := s.Nanos(wall); got != wall.UnixNano() {
		t.Errorf("a time without a monotonic reading: %d, want %d", got, wall.UnixNano())
	}
	if got := (monotime.Scale{}).Nanos(later); got != later.UnixNano() {
		t.Errorf("the zero Scale: %d, want UnixNano %d", got, later.UnixNano())
	}
	// The scale stays near Unix time (a lag from a sender's wall time is
	// taken on it).
	if d := s.Nanos(now) - now.UnixNano(); d > int64(time.Second) || d < -int64(time.Second) {
		t.Errorf("Nanos(now) is %v from UnixNano", time.Duration(d))
	}
	if monotime.Lag(now, now.Add(time.Second).UnixNano()) != 0 || monotime.Lag(now, 0) != 0 {
		t.Error("a sender ahead of the receiver, or no sent time, is no lag")
	}
	if l := monotime.Lag(now, now.Add(-2*time.Second).UnixNano()); l != int64(2*time.Second) {
		t.Errorf("lag %d, want 2 s", l)
	}
}
