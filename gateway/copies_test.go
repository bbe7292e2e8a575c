package gateway_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects"
)

// A copy no broker says it routed within the routed timeout (it went to a
// broker cut off) is sent again under a request id of its own, and the next
// broker answers it, long before the accept timeout. When the first copy is
// routed after all (the broker's link healed), its replica is told to
// cancel it.
func TestACopyNoBrokerRoutedIsSentAgainAndALateOneCancelled(t *testing.T) {
	const acceptTimeout = 10 * time.Second
	var mu sync.Mutex
	ids := map[int]string{}
	headers := map[int]nats.Header{}
	late := make(chan struct{})
	u := newUpstream(t, gateway.Config{AcceptTimeout: acceptTimeout, RoutedTimeout: 100 * time.Millisecond}, func(r *reply, attempt int) {
		mu.Lock()
		ids[attempt], headers[attempt] = r.m.Header.Get(subjects.HdrRequestID), r.m.Header
		mu.Unlock()
		switch attempt {
		case 1: // the cut broker, which routes it once its link heals
			<-late
			r.routed("r-late")
		case 2:
			r.stream("r-0", 3)
		}
	})
	cancels := make(chan *nats.Msg, 8)
	if _, err := u.nc.ChanSubscribe("llm.replica.*.cancel", cancels); err != nil {
		t.Fatal(err)
	}
	_ = u.nc.Flush()

	res := u.post(true)
	if res.status != 200 || res.took >= acceptTimeout {
		t.Fatalf("with the first copy at a cut broker: %+v; want 200 before the accept timeout (%v)", res, acceptTimeout)
	}
	close(late)
	mu.Lock()
	first, second := ids[1], ids[2]
	same := headers[1].Get(subjects.HdrClientRequestID) == headers[2].Get(subjects.HdrClientRequestID)
	mu.Unlock()
	if first == "" || first == second || !same {
		t.Errorf("copies: request ids %q and %q, the same client request: %v; want the same request under ids of their own", first, second, same)
	}
	// The late copy's replica is told to cancel it.
	want := map[string]string{"llm.replica.r-late.cancel": first}
	testkit.CheckFor(t, 5*time.Second, 0, func() error {
		select {
		case m := <-cancels:
			if id, ok := want[m.Subject]; ok && m.Header.Get(subjects.HdrRequestID) == id {
				delete(want, m.Subject)
			}
		case <-time.After(100 * time.Millisecond):
		}
		if len(want) > 0 {
			return fmt.Errorf("no cancel yet of %v", want)
		}
		return nil
	})
	if n := u.counter("switchyard_gateway_resends_total", nil); n < 1 {
		t.Errorf("resends = %v, want at least 1", n)
	}
	if n := u.counter("switchyard_gateway_late_routes_cancelled_total", nil); n < 1 {
		t.Errorf("late routes cancelled = %v, want at least 1", n)
	}
}
