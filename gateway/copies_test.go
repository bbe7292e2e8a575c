package gateway_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/internal/stages"
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

// When a later copy wins, the stage record is that copy's: the marks the
// cut broker made on the first copy are dropped with it, and the ones
// made on the copy that reached the client are recorded.
func TestTheWinningCopysStagesAreRecorded(t *testing.T) {
	rec := stages.New(1)
	late := make(chan struct{})
	defer close(late)
	u := newUpstream(t, gateway.Config{Stages: rec, AcceptTimeout: 10 * time.Second, RoutedTimeout: 100 * time.Millisecond}, func(r *reply, attempt int) {
		id := r.m.Header.Get(subjects.HdrRequestID)
		switch attempt {
		case 1: // the cut broker decided, and its link went
			rec.Mark(id, stages.BrokerReceived)
			rec.Mark(id, stages.Decided)
			<-late
		case 2: // the next broker takes the copy and forwards it
			rec.Mark(id, stages.BrokerReceived)
			rec.Mark(id, stages.Forwarded)
			r.stream("r-0", 3)
		}
	})
	if res := u.post(true); res.status != 200 {
		t.Fatalf("status %d", res.status)
	}
	var sum stages.Summary
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if sum = rec.Summary(); sum.Requests != 1 {
			return fmt.Errorf("%d requests recorded", sum.Requests)
		}
		return nil
	})
	got := map[string]bool{}
	for _, s := range sum.Stages {
		got[s.Stage] = true
	}
	for _, s := range []stages.Stage{stages.Published, stages.BrokerReceived, stages.Forwarded, stages.GatewayFirstChunk, stages.ClientFirstByte} {
		if !got[s.String()] {
			t.Errorf("the record lacks %q: %+v", s, sum.Stages)
		}
	}
	if got[stages.Decided.String()] {
		t.Errorf("the record holds the first copy's %q: %+v", stages.Decided, sum.Stages)
	}
}

// An attempt no broker spoke for by the accept timeout (each copy went to
// a cut broker) waits another accept timeout and sends copies on, without
// a retry: a retry costs the retries' budget, which a cut that loses many
// requests' copies at once runs out of. Here the first six copies are
// lost and the seventh, sent in the second accept timeout, is routed.
func TestCopiesGoOnPastTheAcceptTimeoutUntilABrokerRoutes(t *testing.T) {
	const acceptTimeout, routedTimeout = 400 * time.Millisecond, 100 * time.Millisecond
	u := newUpstream(t, gateway.Config{AcceptTimeout: acceptTimeout, RoutedTimeout: routedTimeout}, func(r *reply, attempt int) {
		if attempt == 7 {
			r.stream("r-0", 3)
		}
	})
	res := u.post(true)
	if res.status != 200 {
		t.Fatalf("six copies lost, the seventh routed: %+v; want 200", res)
	}
	if n := u.counter("switchyard_gateway_retries_total", nil); n != 0 {
		t.Errorf("retries = %v, want 0: the copies go on within one attempt", n)
	}
	if n := u.counter("switchyard_gateway_route_waits_total", nil); n != 1 {
		t.Errorf("route waits = %v, want 1", n)
	}
	if n := u.attempts.Load(); n < 7 {
		t.Errorf("%d copies reached the brokers, want at least 7", n)
	}
}

// Past AcceptWaitsUnseen accept timeouts without a broker's word, the
// attempt fails: the request is not held for ever by copies nobody routes,
// and no more than MaxCopies are sent.
func TestCopiesEndAfterTheWaitsNoBrokerAnswers(t *testing.T) {
	// Ten copies an accept timeout: the waits reach MaxCopies, and no more
	// go out.
	const acceptTimeout, routedTimeout = 200 * time.Millisecond, 20 * time.Millisecond
	u := newUpstream(t, gateway.Config{AcceptTimeout: acceptTimeout, RoutedTimeout: routedTimeout, MaxRetries: -1}, func(*reply, int) {})
	res := u.post(false)
	if res.status != 504 || res.code != subjects.CodeUpstreamTimeout {
		t.Fatalf("no broker routes any copy: %+v; want 504 %s", res, subjects.CodeUpstreamTimeout)
	}
	if n := u.counter("switchyard_gateway_route_waits_total", nil); n != gateway.AcceptWaitsUnseen-1 {
		t.Errorf("route waits = %v, want %d", n, gateway.AcceptWaitsUnseen-1)
	}
	if n := u.attempts.Load(); n != gateway.MaxCopies {
		t.Errorf("%d copies reached the brokers, want MaxCopies (%d)", n, gateway.MaxCopies)
	}
}
