package kvindex

import (
	"math/bits"
	"slices"
)

// table maps key fingerprints to the replicas holding them. Each key is one
// uint64 slot: the top 48 bits of the salted key's hash and, in the low 16
// bits, its one holder's id, or multi when several replicas hold it (their
// ids then sit sorted in sets). Most keys have one holder, so most cost
// eight bytes (at most 80% full: 1,000 replicas × 25,000 keys in about
// 160 MiB when half the keys are shared); a 48-bit fingerprint makes a
// false match one in 2^48 per probe. Linear probing from a slot chosen by
// the fingerprint, backward-shift deletion (no tombstones).
type table struct {
	slots []uint64
	shift uint // 64 - log2(len(slots))
	n     int  // keys
	pairs int  // (key, replica) pairs
	sets  map[uint64][]ID
}

const (
	idBits = 16
	idMask = 1<<idBits - 1
	// multi in a slot's id bits: the key's holders are in sets.
	multi = idMask
)

// mix is splitmix64's finalizer.
func mix(h uint64) uint64 {
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	return h ^ h>>31
}

// fp is key's 48-bit fingerprint under salt, never 0, in the top bits.
func fp(key, salt uint64) uint64 {
	f := mix(key^salt) &^ idMask
	if f == 0 {
		f = 1 << idBits
	}
	return f
}

func (t *table) home(f uint64) int { return int((f * 0x9e3779b97f4a7c15) >> t.shift) }

func (t *table) next(i int) int { return (i + 1) & (len(t.slots) - 1) }

// find returns f's slot, or -1.
func (t *table) find(f uint64) int {
	if t.n == 0 {
		return -1
	}
	for i := t.home(f); t.slots[i] != 0; i = t.next(i) {
		if t.slots[i]&^idMask == f {
			return i
		}
	}
	return -1
}

func (t *table) has(f uint64, id ID) bool {
	i := t.find(f)
	if i < 0 {
		return false
	}
	if h := ID(t.slots[i] & idMask); h != multi {
		return h == id
	}
	_, ok := slices.BinarySearch(t.sets[f], id)
	return ok
}

// holders returns the number of replicas holding f.
func (t *table) holders(f uint64) int {
	i := t.find(f)
	switch {
	case i < 0:
		return 0
	case t.slots[i]&idMask != multi:
		return 1
	}
	return len(t.sets[f])
}

func (t *table) each(f uint64, yield func(ID) bool) {
	i := t.find(f)
	if i < 0 {
		return
	}
	if h := ID(t.slots[i] & idMask); h != multi {
		yield(h)
		return
	}
	for _, id := range t.sets[f] {
		if !yield(id) {
			return
		}
	}
}

// insert adds (f, id) and reports whether it was new.
func (t *table) insert(f uint64, id ID) bool {
	if i := t.find(f); i >= 0 {
		h := ID(t.slots[i] & idMask)
		switch {
		case h == id:
			return false
		case h != multi:
			if t.sets == nil {
				t.sets = map[uint64][]ID{}
			}
			t.sets[f] = []ID{min(h, id), max(h, id)}
			t.slots[i] = f | multi
		default:
			s := t.sets[f]
			j, ok := slices.BinarySearch(s, id)
			if ok {
				return false
			}
			t.sets[f] = slices.Insert(s, j, id)
		}
		t.pairs++
		return true
	}
	if (t.n+1)*5 > len(t.slots)*4 {
		t.grow()
	}
	t.place(f | uint64(id))
	t.pairs++
	return true
}

// remove deletes (f, id) and reports whether it was there.
func (t *table) remove(f uint64, id ID) bool {
	i := t.find(f)
	if i < 0 {
		return false
	}
	h := ID(t.slots[i] & idMask)
	switch {
	case h == id:
		t.deleteAt(i)
	case h != multi:
		return false
	default:
		s := t.sets[f]
		j, ok := slices.BinarySearch(s, id)
		if !ok {
			return false
		}
		s = slices.Delete(s, j, j+1)
		if len(s) == 1 {
			delete(t.sets, f)
			t.slots[i] = f | uint64(s[0])
		} else {
			t.sets[f] = s
		}
	}
	t.pairs--
	return true
}

// deleteAt empties slot i, moving later keys of the run back so that every
// key stays reachable from its home.
func (t *table) deleteAt(i int) {
	t.n--
	mask := len(t.slots) - 1
	for {
		t.slots[i] = 0
		j := i
		for {
			j = (j + 1) & mask
			s := t.slots[j]
			if s == 0 {
				return
			}
			h := t.home(s &^ idMask)
			// The key at j may fill the hole at i unless its home lies
			// cyclically in (i, j].
			if (i <= j && (h <= i || h > j)) || (i > j && h <= i && h > j) {
				t.slots[i] = s
				i = j
				break
			}
		}
	}
}

// removeAll deletes every pair of id, rebuilding the table.
func (t *table) removeAll(id ID) {
	old := t.slots
	t.slots = make([]uint64, len(old))
	t.n = 0
	for _, s := range old {
		if s == 0 {
			continue
		}
		f, h := s&^idMask, ID(s&idMask)
		switch {
		case h == id:
			t.pairs--
			continue
		case h == multi:
			set := t.sets[f]
			if j, ok := slices.BinarySearch(set, id); ok {
				set = slices.Delete(set, j, j+1)
				t.pairs--
			}
			if len(set) == 1 {
				delete(t.sets, f)
				s = f | uint64(set[0])
			} else {
				t.sets[f] = set
			}
		}
		t.place(s)
	}
}

func (t *table) grow() {
	size := 2 * len(t.slots)
	if size == 0 {
		size = 1024
	}
	old := t.slots
	t.slots = make([]uint64, size)
	t.shift = uint(64 - bits.TrailingZeros(uint(size)))
	t.n = 0
	for _, s := range old {
		if s != 0 {
			t.place(s)
		}
	}
}

// place puts a key known to be absent.
func (t *table) place(s uint64) {
	i := t.home(s &^ idMask)
	for t.slots[i] != 0 {
		i = t.next(i)
	}
	t.slots[i] = s
	t.n++
}
