package policy

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// TestAProfileHasItsOwnPicker: a profile whose picker is a step row of its
// own (here the lowest score of all candidates, with kv_usage its only
// scorer) decides by it, with its reason, and explains its losers by
// their scores: the types a profile is made of need nothing of the
// switchyard profile's.
func TestAProfileHasItsOwnPicker(t *testing.T) {
	s := table.NewSnapshot()
	for k, v := range map[string]string{
		"models.m":     `{}`,
		"replicas.r-0": `{"model": "m", "pool": "general", "state": "ready"}`,
		"replicas.r-1": `{"model": "m", "pool": "general", "state": "ready"}`,
		"replicas.r-2": `{"model": "m", "pool": "general", "state": "ready"}`,
	} {
		val, err := table.Decode(k, []byte(v))
		if err != nil {
			t.Fatal(err)
		}
		s.Set(val, []byte(v))
	}
	r := New(Config{Self: "b1"})
	r.SetTable(s)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for id, kv := range map[string]float64{"r-0": 0.5, "r-1": 0.1, "r-2": 0.3} {
		r.ObserveHeartbeat(&subjects.Heartbeat{Replica: id, State: subjects.StateReady, KVUsage: kv, ScrapeOK: true}, now)
	}
	lowest := newStep("lowest-score", func(p *pick) bool {
		p.chosen = 0
		for i := range p.cands {
			if p.cands[i].load < p.cands[p.chosen].load {
				p.chosen = i
			}
		}
		return true
	}, nil, nil)
	kv := scorerNamed(table.ScorerKVUsage)
	r.mu.Lock()
	r.profiles.policy = &profile{name: "lowest-kv", filters: r.profiles.policy.filters, picker: &lowest,
		scorers: []*scorer{kv}, weights: []float64{1}, names: []string{kv.name}, whyHigher: WhyHigherScore}
	r.mu.Unlock()
	for range 20 { // no sample: the same every time
		d := r.Decide(&Request{Tenant: "t", Model: "m", Endpoint: subjects.EndpointChat, PromptTokens: 10}, now, rand.New(rand.NewPCG(1, 2)))
		if d.Err != nil || d.Replica != "r-1" || d.Reason != "lowest-score" || d.Profile != "lowest-kv" || d.Values[0] != 0.1 {
			t.Fatalf("chose %s (%s, profile %s, values %v, err %v), want r-1 by lowest-score", d.Replica, d.Reason, d.Profile, d.Values, d.Err)
		}
		if d.NAlts != 2 || d.Alts[0].Replica != "r-2" || d.Alts[0].Why != WhyHigherScore || d.AltValues[1][0] != 0.5 {
			t.Fatalf("alternatives %+v, values %v", d.Alternatives(), d.AltValues)
		}
	}
}
