package policy

import "slices"

// prefixWays is how many replicas one block hash remembers, most recent
// first: several brokers may have placed the same prefix on different
// replicas, and prefix affinity draws two of them and takes the lighter.
const prefixWays = 4

// prefixMap maps block hashes to the replicas that last received them, for
// one model. It holds at most capacity blocks: a fixed open-addressing
// table (linear probing, at most half full) indexed by the hash itself,
// since block hashes are already uniform xxhash values, with CLOCK eviction
// (an LRU approximation with one reference bit per entry and no list to
// maintain). It never grows and never allocates after New.
type prefixMap struct {
	slots    []prefixEntry
	mask     uint64
	n        int
	capacity int
	hand     int
}

type prefixEntry struct {
	key  uint64
	reps [prefixWays]*replica
	used bool
	ref  bool
}

func newPrefixMap(capacity int) *prefixMap {
	size := 16
	for size < 2*capacity {
		size <<= 1
	}
	return &prefixMap{slots: make([]prefixEntry, size), mask: uint64(size - 1), capacity: capacity}
}

// find returns the slot of h, or -1.
func (m *prefixMap) find(h uint64) int {
	for i := h & m.mask; ; i = (i + 1) & m.mask {
		e := &m.slots[i]
		if !e.used {
			return -1
		}
		if e.key == h {
			return int(i)
		}
	}
}

// get returns the entry of h, or nil; valid until the next put.
func (m *prefixMap) get(h uint64) *prefixEntry {
	if i := m.find(h); i >= 0 {
		return &m.slots[i]
	}
	return nil
}

// put records that block h went to x and reports whether that taught the
// map something (x was not already its most recent replica).
func (m *prefixMap) put(h uint64, x *replica) bool {
	if i := m.find(h); i >= 0 {
		e := &m.slots[i]
		e.ref = true
		if e.reps[0] == x {
			return false
		}
		j := len(e.reps) - 1
		for k, y := range e.reps {
			if y == x {
				j = k
				break
			}
		}
		for ; j > 0; j-- { // not copy: a call to typedslicecopy for four pointers
			e.reps[j] = e.reps[j-1]
		}
		e.reps[0] = x
		return true
	}
	if m.n >= m.capacity {
		m.evict()
	}
	i := h & m.mask
	for m.slots[i].used {
		i = (i + 1) & m.mask
	}
	m.slots[i] = prefixEntry{key: h, reps: [prefixWays]*replica{x}, used: true}
	m.n++
	return true
}

// evict removes the first entry at or after the hand whose reference bit
// is clear, clearing the bits it passes.
func (m *prefixMap) evict() {
	for {
		i := m.hand
		m.hand = (m.hand + 1) & int(m.mask)
		e := &m.slots[i]
		if !e.used {
			continue
		}
		if e.ref {
			e.ref = false
			continue
		}
		m.remove(uint64(i))
		return
	}
}

// remove deletes slot i by backward shifting: later entries of the probe
// run move up, so lookups never need tombstones.
func (m *prefixMap) remove(i uint64) {
	m.n--
	for {
		m.slots[i] = prefixEntry{}
		j := i
		for {
			j = (j + 1) & m.mask
			if !m.slots[j].used {
				return
			}
			home := m.slots[j].key & m.mask
			// The entry at j may fill the hole at i unless its home lies
			// cyclically in (i, j].
			if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
				m.slots[i] = m.slots[j]
				i = j
				break
			}
		}
	}
}

// remember records the request's blocks on x and reports whether the map
// learned anything (then the broker shares the placement).
func (m *prefixMap) remember(blocks []uint64, x *replica) bool {
	learned := false
	for _, h := range blocks {
		if m.put(h, x) {
			learned = true
		}
	}
	return learned
}

// forget removes x from block h's replicas, and h when none is left.
func (m *prefixMap) forget(h uint64, x *replica) {
	i := m.find(h)
	if i < 0 {
		return
	}
	e := &m.slots[i]
	k := 0
	for _, y := range e.reps {
		if y != nil && y != x {
			e.reps[k] = y
			k++
		}
	}
	if k == 0 {
		m.remove(uint64(i))
		return
	}
	for ; k < len(e.reps); k++ {
		e.reps[k] = nil
	}
}

// forgetReplica removes x from every block, and the blocks left with no
// replica: one pass over the table, a slot checked again when a removal
// shifted another entry into it.
func (m *prefixMap) forgetReplica(x *replica) {
	for i := 0; i < len(m.slots); {
		if e := &m.slots[i]; e.used && slices.Contains(e.reps[:], x) {
			k := e.key
			m.forget(k, x)
			if !m.slots[i].used || m.slots[i].key != k {
				continue
			}
		}
		i++
	}
}

// len is the number of blocks held.
func (m *prefixMap) len() int { return m.n }
