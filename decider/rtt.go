package decider

import (
	"context"
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// Region round trips (README, "Regions"). A decider with a region pings
// the adapters' micro service ($SRV.PING.<subjects.AdapterService>, one
// request to its own inbox) and times each answer; the adapters' service
// metadata names their region. Per region it keeps the quickest answer of
// a round, and over the last rttRounds rounds the least of those: queueing
// on the way (a busy server, a busy adapter) only ever adds, so the least
// is the link's own round trip. The round trip to region X is that of X's
// adapters less that of its own region's, which takes out its own hop to
// its server; without an answer from its own region, X's as it is.
//
// An answer counts only for a replica the router has heard, in the region
// its heartbeat names (which only the replica's own identity may publish),
// once per round: an adapter's answer in another replica's name, or naming
// a region its replica's heartbeat does not, is not counted.
const (
	// rttEvery is the time between rounds; rttEarly between the first
	// rounds (at most rttEarlyRounds of them), until one brings an answer
	// from another region.
	rttEvery       = 10 * time.Second
	rttEarly       = time.Second
	rttEarlyRounds = 10
	// rttWait is how long a round collects answers: an answer later than
	// that is not counted.
	rttWait = 2 * time.Second
	// rttMaxAnswers bounds the answers a round reads, and rttMaxBytes
	// one answer's size.
	rttMaxAnswers = 4096
	rttMaxBytes   = 16 << 10
	// rttRounds is how many rounds the least round trip is taken over.
	rttRounds = 6
)

// rttProbe is the measurement's state, owned by rttLoop.
type rttProbe struct {
	local string
	// rounds are the last rounds' least round trip per region, a ring
	// (next is where the next round goes).
	rounds [rttRounds]map[string]time.Duration
	next   int
	// round is the round being collected; known the regions counted in it
	// (the router's: another region's answers are not kept).
	round map[string]time.Duration
	known map[string]bool
	// regionOf is the region a replica's heartbeat names (false: not
	// heard); seen the replicas answered this round.
	regionOf func(replica string) (string, bool)
	seen     map[string]bool
}

// start begins a round counting the regions known.
func (p *rttProbe) start(known []string) {
	p.round = make(map[string]time.Duration, len(known))
	p.known = make(map[string]bool, len(known))
	p.seen = map[string]bool{}
	for _, r := range known {
		p.known[r] = true
	}
}

// answer counts one answer to the round's ping, received rtt after it was
// sent; it reports whether it was counted. An answer that is not an
// adapter's ping response, names no region the round counts, speaks for a
// replica not heard in that region or already counted this round, or
// comes back outside (0, rttWait] is not.
func (p *rttProbe) answer(data []byte, rtt time.Duration) bool {
	if len(data) > rttMaxBytes || rtt <= 0 || rtt > rttWait {
		return false
	}
	var ping micro.Ping
	if json.Unmarshal(data, &ping) != nil || ping.Type != micro.PingResponseType || ping.Name != subjects.AdapterService {
		return false
	}
	r, replica := ping.Metadata["region"], ping.Metadata["replica"]
	if subjects.ValidToken(r) != nil || !p.known[r] || subjects.ValidToken(replica) != nil || p.seen[replica] {
		return false
	}
	if heard, ok := p.regionOf(replica); !ok || heard != r {
		return false
	}
	p.seen[replica] = true
	if d, ok := p.round[r]; !ok || rtt < d {
		p.round[r] = rtt
	}
	return true
}

// end closes the round and returns the round trip to each other region
// measured over the last rounds.
func (p *rttProbe) end() map[string]time.Duration {
	p.rounds[p.next] = p.round
	p.next = (p.next + 1) % rttRounds
	p.round, p.known, p.seen = nil, nil, nil
	least := map[string]time.Duration{}
	for _, round := range p.rounds {
		for r, d := range round {
			if l, ok := least[r]; !ok || d < l {
				least[r] = d
			}
		}
	}
	own, hasOwn := least[p.local]
	out := make(map[string]time.Duration, len(least))
	for r, d := range least {
		switch {
		case r == p.local:
			continue
		case hasOwn:
			out[r] = max(d-own, 0)
		default:
			out[r] = d
		}
	}
	return out
}

// rttLoop measures the round trip to the other regions until ctx ends,
// and hands each measurement to the router (the spill penalty of a region
// whose table sets none) and the metrics.
func (dec *Decider) rttLoop(ctx context.Context) {
	p := rttProbe{local: dec.cfg.Region, regionOf: dec.router.HeardRegion}
	wait, early := time.Duration(0), 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		known := dec.router.Regions()
		if len(known) < 2 {
			wait = rttEarly // nothing to measure yet: the table names no other region
			continue
		}
		p.start(known[:min(len(known), table.MaxRegions)])
		if err := dec.pingRound(ctx, &p); err != nil {
			dec.log.Warn("measuring the round trip to the other regions", "err", err)
		}
		rtt := p.end()
		dec.router.SetRegionRTT(rtt)
		dec.metrics.regionsMeasured(rtt)
		if wait = rttEvery; len(rtt) == 0 && early < rttEarlyRounds {
			wait = rttEarly
			early++
		}
	}
}

// pingRound sends one ping to every adapter and counts the answers into p
// for rttWait, or until ctx ends or rttMaxAnswers came.
func (dec *Decider) pingRound(ctx context.Context, p *rttProbe) error {
	inbox := dec.nc.NewInbox()
	sub, err := dec.nc.SubscribeSync(inbox)
	if err != nil {
		return err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := sub.SetPendingLimits(rttMaxAnswers, rttMaxAnswers*rttMaxBytes); err != nil {
		return err
	}
	sent := time.Now()
	if err := dec.nc.PublishRequest(dec.pingSubject(), inbox, nil); err != nil {
		return err
	}
	ctx, cancel := context.WithDeadline(ctx, sent.Add(rttWait))
	defer cancel()
	for range rttMaxAnswers {
		m, err := sub.NextMsgWithContext(ctx)
		if ctx.Err() != nil {
			return nil // the round's time is up
		}
		if err != nil {
			return err
		}
		p.answer(m.Data, time.Since(sent))
	}
	return nil
}

// pingSubject is the adapters' micro service's ping subject.
func (dec *Decider) pingSubject() string {
	s, _ := micro.ControlSubject(micro.PingVerb, subjects.AdapterService, "")
	return s
}
