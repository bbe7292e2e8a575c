package policy

import (
	"os"
	"strings"
	"testing"
)

// TestRowsAreInTheREADME: every filter, step and check has its line in
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
	p := pick{step: &steps[len(steps)-1]} // power-of-two
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
