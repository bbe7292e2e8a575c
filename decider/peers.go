package decider

import "time"

// Peers counts the live members of a group from their announcements, as
// deciders count each other to divide tenant quotas (the same counting,
// with its limit): batchers count each other with it to divide the batch
// room the load view shows. An announcement is a member's id, or a
// Presence naming it; one not heard again within the ttl stops counting.
// At most 256 others are counted, so made-up announcements cannot shrink
// a share without bound. Safe for concurrent use.
type Peers struct{ p presence }

// NewPeers returns the counter of the group self belongs to; self counts
// always, and its own announcement heard back is not another member.
func NewPeers(self string) *Peers {
	x := new(Peers)
	x.p.init(self, false)
	return x
}

// Observe records the announcement data heard at now and returns the
// members heard within ttl, this one included. ok is false when data was
// refused: not an id or a Presence, or a member beyond the limit.
func (x *Peers) Observe(data []byte, now time.Time, ttl time.Duration) (live int, ok bool) {
	a, ok := decodePresence(data)
	if !ok {
		return x.Live(now, ttl), false
	}
	sh, ok := x.p.observeNew(a, now, ttl)
	return sh.live, ok
}

// Live is how many members were heard within ttl, this one included.
func (x *Peers) Live(now time.Time, ttl time.Duration) int {
	return x.p.observe(nil, now, ttl).live
}

// Rank is this member's place among those heard within ttl, by id (0 for
// the lowest), and how many they are, this one included: members that
// split a remainder give it to the lowest ranks, so that each knows
// whether it takes a part without asking the others.
func (x *Peers) Rank(now time.Time, ttl time.Duration) (rank, live int) {
	live = x.p.observe(nil, now, ttl).live
	x.p.mu.Lock()
	defer x.p.mu.Unlock()
	for id := range x.p.seen {
		if id < x.p.self {
			rank++
		}
	}
	return rank, live
}
