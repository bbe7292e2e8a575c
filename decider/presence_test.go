package decider

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// TestQuotaShares: how many deciders each counts for a tenant's quota,
// from the announcements it heard. Brokers share every tenant with each
// other (the queue group spreads each evenly); a gateway that decides
// shares a tenant with another decider only while that one admits the
// tenant's requests.
func TestQuotaShares(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	const ttl = 3 * time.Second
	for _, c := range []struct {
		name     string
		broker   bool // this decider is a broker
		heard    []string
		stale    []string // heard longer than ttl ago
		all      int
		per      map[string]int
		live     int
		refusals int
	}{
		{name: "a broker beside a broker shares every tenant", broker: true,
			heard: []string{`{"id":"b2","kind":"broker"}`}, all: 2, live: 2},
		{name: "a broker beside a deciding gateway shares the gateway's tenants", broker: true,
			heard: []string{`{"id":"g1","kind":"gateway","tenants":["trial"]}`}, all: 1, per: map[string]int{"trial": 1}, live: 2},
		{name: "a gateway beside an idle broker enforces whole quotas",
			heard: []string{`{"id":"b1","kind":"broker"}`}, all: 1, live: 2},
		{name: "a gateway beside a broker that admits the tenant shares it",
			heard: []string{`{"id":"b1","kind":"broker","tenants":["trial","acme"]}`, `{"id":"g2","kind":"gateway","tenants":["trial"]}`},
			all:   1, per: map[string]int{"trial": 2, "acme": 1}, live: 3},
		{name: "a tenant named twice is shared once",
			heard: []string{`{"id":"b1","kind":"broker","tenants":["trial","trial","trial"]}`}, all: 1, per: map[string]int{"trial": 1}, live: 2},
		{name: "a bare id is a broker sharing every tenant",
			heard: []string{`b-old`}, all: 2, live: 2},
		{name: "a silent decider is forgotten", broker: true,
			stale: []string{`{"id":"b2","kind":"broker"}`}, all: 1, live: 1},
		{name: "its own announcement is not another decider", broker: true,
			heard: []string{`{"id":"self","kind":"broker","tenants":["trial"]}`}, all: 1, live: 1},
		{name: "an unknown kind, a bad id or too many tenants is refused",
			heard: []string{`{"id":"x","kind":"boss"}`, `{"id":"a b","kind":"broker"}`, `{"id":"x","kind":"gateway","tenants":` + manyTenants() + `}`, `{"id":`},
			all:   1, live: 1, refusals: 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			var p presence
			p.init("self", c.broker)
			refused := 0
			hear := func(data string, at time.Time) {
				a, ok := decodePresence([]byte(data))
				if !ok {
					refused++
					return
				}
				p.observeNew(a, at, ttl)
			}
			for _, d := range c.stale {
				hear(d, now.Add(-2*ttl))
			}
			for _, d := range c.heard {
				hear(d, now)
			}
			sh := p.observe(nil, now, ttl)
			if sh.all != c.all || sh.live != c.live || !maps.Equal(sh.per, c.per) && len(sh.per)+len(c.per) > 0 {
				t.Errorf("counted all %d, per tenant %v, live %d; want %d, %v, %d", sh.all, sh.per, sh.live, c.all, c.per, c.live)
			}
			if refused != c.refusals {
				t.Errorf("%d announcements refused, want %d", refused, c.refusals)
			}
		})
	}
}

func manyTenants() string {
	s := "["
	for i := range maxPresenceTenants + 1 {
		if i > 0 {
			s += ","
		}
		s += `"t"`
	}
	return s + "]"
}

// TestAnnouncementNamesTheTenantsAdmitted: a decider announces its kind
// and the tenants whose quota it charged within the last minute.
func TestAnnouncementNamesTheTenantsAdmitted(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	b := newTestBroker(t, 2, now)
	a, ok := decodePresence(b.announcement())
	if !ok || a.Kind != subjects.PresenceBroker || a.ID != b.ID() || len(a.Tenants) != 0 {
		t.Fatalf("announcement before any request: %+v", a)
	}
	next := b.Table().Clone()
	v, err := table.Decode("tenants.trial", []byte(`{"tier":"standard","quota":{"rpm":60}}`))
	if err != nil {
		t.Fatal(err)
	}
	next.Set(v, nil)
	b.SetTable(next)
	h := gatewayHeaders()
	s := b.Get()
	defer b.Release(s)
	if act := b.Handle(s, "llm.gw.trial", "_INBOX.gw.1", h, []byte(`{"model":"chat-large"}`)); act.Do != DoForward {
		t.Fatalf("trial's request not forwarded: %+v", act.Err)
	}
	if a, ok = decodePresence(b.announcement()); !ok || !slices.Equal(a.Tenants, []string{"trial"}) {
		t.Errorf("announcement after admitting trial's request: %+v", a)
	}
}

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
