package decider

import (
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
)

// A decider counts itself alone (predicted-ttft then chooses over every
// replica) only once no other decider was seen for a whole ttl, the time
// in which every live decider announces itself: at start, when a peer
// falls silent, and after a reconnect.
func TestPresenceAloneOnlyAfterAWholeTTL(t *testing.T) {
	const ttl = 3 * time.Second
	var p presence
	p.init("a", false)
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	check := func(when time.Duration, a *subjects.Presence, live int, alone bool) {
		t.Helper()
		if sh := p.observe(a, at(when), ttl); sh.live != live || sh.alone != alone {
			t.Fatalf("at %v: live %d alone %v, want %d %v", when, sh.live, sh.alone, live, alone)
		}
	}
	check(0, nil, 1, false)
	check(2*time.Second, nil, 1, false)
	check(3*time.Second, nil, 1, true)
	check(4*time.Second, &subjects.Presence{ID: "b", Kind: subjects.PresenceGateway}, 2, false)
	check(7*time.Second, nil, 2, false)
	check(8*time.Second, nil, 1, false) // b silent for more than the ttl
	check(10*time.Second, nil, 1, false)
	check(11*time.Second, nil, 1, true)
	p.rewatch()
	check(11500*time.Millisecond, nil, 1, false)
	check(14500*time.Millisecond, nil, 1, true)
}
