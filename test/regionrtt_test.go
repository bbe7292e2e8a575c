package test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/natsconn/natstest"
	"github.com/switchyard-llm/switchyard/subjects"
)

// TestSpillPenaltyIsTheMeasuredRoundTrip: two regions on one server,
// region b's parts behind a link that holds what the server sends them for
// 40 ms. Region a's gateway measures the round trip to b by pinging the
// adapters (b's answers come back 40 ms late, a's at once) and spills to b
// with that as the penalty, its explanation saying it was measured; b's
// gateway, whose own hop is the slow one, takes it out: a is near.
func TestSpillPenaltyIsTheMeasuredRoundTrip(t *testing.T) {
	_, url := natstest.Start(t)
	seedTwoRegions(t, url)
	relay := testkit.NewRelay(t, strings.TrimPrefix(url, "nats://"))
	const oneWay = 40 * time.Millisecond
	relay.Delay(oneWay)
	a := startRegion(t, url, "a", "l8-a-0")
	b := startRegion(t, relay.URL(), "b", "l8-b-0")

	measured := func(s *regionSite, to string) (time.Duration, error) {
		p, src := s.gw.Decider().Router().SpillPenalty(to)
		if src != policy.PenaltyMeasured {
			return 0, fmt.Errorf("%s's penalty to %s is %v, %q", s.name, to, p, src)
		}
		return p, nil
	}
	testkit.CheckFor(t, 12*time.Second, 20*time.Millisecond, func() error {
		_, errA := measured(a, "b")
		_, errB := measured(b, "a")
		return errors.Join(errA, errB)
	})
	// The ping reaches b's adapter 40 ms late; the answer comes back at
	// once. b's gateway hears every answer 40 ms late, its own region's
	// twice that (the ping to them is late too): its own hop taken out, a
	// is no farther than b. Each is the quickest of the last rounds, so a
	// round slowed by a busy machine is outdone by the next ones.
	var toB, toA time.Duration
	if _, err := testkit.Poll(15*time.Second, 50*time.Millisecond, func() error {
		toB, _ = measured(a, "b")
		toA, _ = measured(b, "a")
		if toB < oneWay*3/4 || toB > oneWay+time.Second {
			return fmt.Errorf("a measured %v to b, want about %v", toB, oneWay)
		}
		if toA > oneWay/2 {
			return fmt.Errorf("b measured %v to a, want its own slow hop taken out", toA)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	t.Logf("measured: a to b %v, b to a %v", toB, toA)
	// The metric shows what the router uses (the next round may have
	// moved both).
	testkit.CheckFor(t, 15*time.Second, 50*time.Millisecond, func() error {
		got := testkit.Sum(a.reg, "switchyard_broker_region_rtt_seconds", map[string]string{"to": "b"})
		if p, _ := measured(a, "b"); math.Abs(got-p.Seconds()) > 1e-6 {
			return fmt.Errorf("switchyard_broker_region_rtt_seconds{to=b} %v, the router's penalty %v", got, p)
		}
		return nil
	})

	// a's replica refused the request already: spill to b, with the
	// measured penalty, explained.
	req := &policy.Request{Tenant: "default", Model: "chat-small", Endpoint: subjects.EndpointChat, PromptTokens: 10, Exclude: []string{"l8-a-0"}}
	d := a.gw.Decider().Router().Explain(req, time.Now(), nil)
	if d.Err != nil || !d.Spilled || d.ReplicaRegion != "b" {
		t.Fatalf("explained %+v, want a spill to b", d)
	}
	if d.SpillPenaltySource != policy.PenaltyMeasured || d.SpillPenalty < oneWay*3/4 {
		t.Errorf("spill penalty %v (%s), want the measured round trip to b", d.SpillPenalty, d.SpillPenaltySource)
	}
	w, err := json.Marshal(d.Wire(req))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(w), `"spill_penalty_source":"measured"`) {
		t.Errorf("the explanation's wire form says %s", w)
	}
}
