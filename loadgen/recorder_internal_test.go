package loadgen

import (
	"testing"
	"time"
)

// TestARefusalIsTimedFromBothSends: a refusal scheduled at t0, sent 3 ms
// late and answered 2 ms after its send counts 5 ms from the schedule
// (Refused, what the targets judge) and 2 ms from the send
// (RefusedService, the generator's lateness left out); a success beside it
// is not counted among the refusals.
func TestARefusalIsTimedFromBothSends(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	rec := newRecorder(1, 2, false)
	rec.add(0, result{sched: t0, sent: t0.Add(3 * time.Millisecond), head: t0.Add(4 * time.Millisecond),
		end: t0.Add(5 * time.Millisecond), errKind: "503", refused: true, code: "gateway_overloaded"})
	rec.add(0, result{sched: t0, sent: t0.Add(time.Millisecond), head: t0.Add(8 * time.Millisecond), end: t0.Add(9 * time.Millisecond)})
	tr := rec.report(&Config{Names: []string{"t"}, Targets: []string{"http://127.0.0.1/"}}, 2).Targets[0]
	if tr.Refused == nil || tr.Refused.N != 1 || tr.Refused.Max.Ms() != 5 {
		t.Errorf("from the scheduled send: %+v, want one refusal of 5 ms", tr.Refused)
	}
	if tr.RefusedService == nil || tr.RefusedService.N != 1 || tr.RefusedService.Max.Ms() != 2 {
		t.Errorf("from the actual send: %+v, want one refusal of 2 ms", tr.RefusedService)
	}
	if tr.Service.N != 1 || tr.Service.Max.Ms() != 8 {
		t.Errorf("the success from its send: %+v, want one of 8 ms", tr.Service)
	}
}
