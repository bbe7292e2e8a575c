package enginesim

import (
	"slices"
	"time"
)

// loraSlots holds the resident adapters, at most max of them. As in vLLM,
// the batch can only use resident adapters, so max also bounds the distinct
// adapters in one batch; an idle adapter is evicted, least recently used
// first, to make room for a new one.
type loraSlots struct {
	max      int
	resident []loraSlot
	loads    int64
}

type loraSlot struct {
	name     string
	lastUsed time.Time
}

// acquire makes name resident for a request admitted at `at`. It reports
// whether the adapter can run now and whether it had to be loaded. active
// counts the running requests of each adapter; those are never evicted.
func (s *loraSlots) acquire(name string, active map[string]int, at time.Time) (ok, loaded bool) {
	if i := s.find(name); i >= 0 {
		s.resident[i].lastUsed = at
		return true, false
	}
	if len(s.resident) < s.max {
		s.resident = append(s.resident, loraSlot{name: name, lastUsed: at})
		s.loads++
		return true, true
	}
	victim := -1
	for i, sl := range s.resident {
		if active[sl.name] > 0 {
			continue
		}
		if victim < 0 || sl.lastUsed.Before(s.resident[victim].lastUsed) {
			victim = i
		}
	}
	if victim < 0 {
		return false, false
	}
	s.resident[victim] = loraSlot{name: name, lastUsed: at}
	s.loads++
	return true, true
}

// touch marks the adapters of a batch as used at `at`.
func (s *loraSlots) touch(active map[string]int, at time.Time) {
	for i := range s.resident {
		if active[s.resident[i].name] > 0 {
			s.resident[i].lastUsed = at
		}
	}
}

func (s *loraSlots) find(name string) int {
	for i, sl := range s.resident {
		if sl.name == name {
			return i
		}
	}
	return -1
}

// names returns the resident adapters, sorted.
func (s *loraSlots) names() []string {
	out := make([]string, 0, len(s.resident))
	for _, sl := range s.resident {
		out = append(out, sl.name)
	}
	slices.Sort(out)
	return out
}
