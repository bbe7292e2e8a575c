package policy

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// TestRowsAreInTheREADME: every filter, step, check and scorer has its line in
// README.md, named as its row names it, so the rules a reader finds there
// are the rows the pick walks.
func TestRowsAreInTheREADME(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	var names []string
	for _, f := range filters {
		names = append(names, f.name)
	}
	for _, s := range steps {
		names = append(names, s.reason)
	}
	for _, c := range checks {
		names = append(names, c.reason)
	}
	for _, s := range scorers {
		names = append(names, s.name)
	}
	for _, n := range names {
		if !strings.Contains(readme, "   - `"+n+"`:") {
			t.Errorf("README.md has no line for the row %q", n)
		}
	}
}

// TestReasonsJoinModifiersStepAndChecks: a decision's reason is the
// fallback alias, the route modifiers in their order, the deciding step
// and the checks that switched, joined with "+".
func TestReasonsJoinModifiersStepAndChecks(t *testing.T) {
	p := pick{step: stepNamed(ReasonPowerOfTwo)}
	for _, tc := range []struct {
		res      resolution
		switched uint8
		want     string
	}{
		{resolution{}, 0, "power-of-two"},
		{resolution{poolFallback: true}, 0, "pool-fallback-general+power-of-two"},
		{resolution{canaryGone: true}, 1, "canary-unavailable+power-of-two+deadline"},
		{resolution{canaryGone: true, poolFallback: true}, 0, "canary-unavailable+pool-fallback-general+power-of-two"},
		{resolution{fallback: "chat-small", poolFallback: true}, 1, "fallback:chat-small+pool-fallback-general+power-of-two+deadline"},
	} {
		p.switched = tc.switched
		if got := p.reason(tc.res.fallback, tc.res.modifiers()); got != tc.want {
			t.Errorf("%+v, switched %b: %q, want %q", tc.res, tc.switched, got, tc.want)
		}
	}
}

// TestProfilesAndScorersAreTheTables: the profiles and scorers the table
// package accepts are the rows declared here, both ways, and every row a
// profile names exists.
func TestProfilesAndScorersAreTheTables(t *testing.T) {
	var ps, ss []string
	for _, p := range profileRows {
		ps = append(ps, p.name)
		for _, n := range append(slices.Clone(p.steps), p.picker) {
			stepNamed(n) // panics on a name without a row
		}
		for _, n := range p.filters {
			filterNamed(n)
		}
		for _, w := range p.scorers {
			if scorerNamed(w.scorer) == nil {
				t.Errorf("profile %s weighs %q, which no scorer row declares", p.name, w.scorer)
			}
		}
	}
	for _, s := range scorers {
		ss = append(ss, s.name)
	}
	slices.Sort(ps)
	if !slices.Equal(ps, table.Profiles()) {
		t.Errorf("profile rows %v, the table accepts %v", ps, table.Profiles())
	}
	if !slices.Equal(ss, table.Scorers()) {
		t.Errorf("scorer rows %v, the table accepts %v", ss, table.Scorers())
	}
	if len(profileRows[0].scorers) > table.MaxScorers {
		t.Errorf("the default profile weighs %d scorers, more than %d", len(profileRows[0].scorers), table.MaxScorers)
	}
}

// TestPredictedTTFTIsAStepOfTheDefaultProfile: policy.replica_choice
// predicted-ttft puts the predicted-ttft step in the switchyard profile
// and ranks prefix holders by predicted TTFT; power-of-two leaves it out.
func TestPredictedTTFTIsAStepOfTheDefaultProfile(t *testing.T) {
	for _, choice := range []string{"", table.ChoicePowerOfTwo, table.ChoicePredictedTTFT} {
		s := table.NewSnapshot()
		s.Policy.ReplicaChoice = choice
		ps := newProfiles(s)
		p := ps.of(table.PoolGeneral)
		on := slices.Contains(p.steps, stepNamed(ReasonPredicted))
		if want := choice == table.ChoicePredictedTTFT; on != want || p.byTTFT != want {
			t.Errorf("replica_choice %q: predicted-ttft step %v, holders by TTFT %v; want %v", choice, on, p.byTTFT, want)
		}
		if p.name != table.ProfileSwitchyard || p.picker.reason != ReasonPowerOfTwo {
			t.Errorf("replica_choice %q: profile %s picks by %s", choice, p.name, p.picker.reason)
		}
	}
}

// TestFilterFlagsAreKeep: a filter's flags say what its keep says, for
// every combination of the states they read.
func TestFilterFlagsAreKeep(t *testing.T) {
	now := int64(100e9)
	for _, state := range []string{subjects.StateReady, subjects.StateDraining} {
		for _, role := range []string{table.RoleBoth, table.RolePrefill} {
			for _, eps := range [][]string{nil, {subjects.EndpointEmbeddings}, {subjects.EndpointChat, subjects.EndpointResponses}} {
				for _, age := range []int64{0, 14e9, 15e9, -1e9} {
					x := &replica{id: "r", hasHB: true, hbNano: now - age,
						reg: &table.Replica{Model: "m", Pool: "general", State: state, Role: role, Endpoints: eps},
						hb:  subjects.Heartbeat{State: subjects.StateReady}}
					x.refresh()
					for _, ep := range []string{"", subjects.EndpointChat, subjects.EndpointEmbeddings, subjects.EndpointResponses} {
						p := &pick{req: &Request{Endpoint: ep}, nowNano: now, dead: 15e9}
						p.endpoint.start(p.req)
						for _, f := range filters {
							if f.flags == nil {
								continue
							}
							m, w := f.flags(p)
							byFlags := x.flags&m == w && (!f.heard || max(now-x.hbNano, 0) < p.dead)
							if got := f.keep(p, x); got != byFlags {
								t.Errorf("%s: %s, role %q, endpoints %v, age %v, endpoint %q: keep %v, flags %v",
									f.name, state, role, eps, age, ep, got, byFlags)
							}
						}
					}
				}
			}
		}
	}
}
