package decider

import (
	"sync"
	"time"
)

// unregisteredGrace is how long a replica's messages may be refused as
// unregistered before that is warned of. An adapter heartbeats, sends its
// load and its KV-cache feed from its start, and writes replicas.<id> after
// its first scrape (or again, within its 10 s refresh, when the key was
// deleted); the registration reaches a decider through the bucket's watch,
// which a plain NATS message may overtake. So every new replica's first
// messages are refused for a moment: expected, counted, not a warning. A
// replica refused for longer has no registration (a stranger, or an adapter
// that cannot write its key) and is warned of.
const unregisteredGrace = 15 * time.Second

// maxUnregisteredTracked bounds the replicas remembered as refused; past
// it, a refusal of one more is warned of at once (many strangers at a time
// are a fault, not a start).
const maxUnregisteredTracked = 1024

// unregistered remembers, per replica, the refusals of its messages as
// unregistered that follow each other within unregisteredGrace: one run of
// them is one wait for a registration.
type unregistered struct {
	mu   sync.Mutex
	runs map[string]refusalRun
}

type refusalRun struct{ first, last time.Time }

// late records a refusal of replica's message at now and reports how long
// replica has been refused without a gap of unregisteredGrace, and whether
// that is past the grace.
func (u *unregistered) late(replica string, now time.Time) (time.Duration, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.runs == nil {
		u.runs = map[string]refusalRun{}
	}
	r, ok := u.runs[replica]
	if !ok && len(u.runs) >= maxUnregisteredTracked {
		for id, x := range u.runs {
			if now.Sub(x.last) > unregisteredGrace {
				delete(u.runs, id)
			}
		}
		if len(u.runs) >= maxUnregisteredTracked {
			return 0, true
		}
	}
	if !ok || now.Sub(r.last) > unregisteredGrace {
		r.first = now
	}
	r.last = now
	u.runs[replica] = r
	waited := now.Sub(r.first)
	return waited, waited > unregisteredGrace
}
