// Package kvindex is a decider's exact prefix index: which replicas' engines
// hold each request key (the Llm-Prefix block hashes of a model), as their
// adapters learn it from the engines' KV-cache events (subjects.KVUpdate).
// A key is dropped the moment its engine evicts it, and a replica holds at
// most the keys its declared KV capacity allows, whatever its adapter says.
//
// It imports nothing of NATS: a broker feeds it from llm.kv.*, and a
// gateway that decides in-process can host the same index.
//
// An Index is not safe for concurrent use: its host serialises calls (the
// policy's Router holds its own lock around both updates and decisions).
package kvindex

import (
	"errors"
	"fmt"

	"github.com/switchyard-llm/switchyard/subjects"
)

// Errors of Apply, each counted by the host.
var (
	// ErrBounds: an update past its replica's declared capacity, past the
	// message bounds, or with an out-of-range capacity.
	ErrBounds = errors.New("kvindex: update out of bounds")
	// ErrSeq: an update after a missed one; the replica's keys were
	// dropped until its next reset.
	ErrSeq = errors.New("kvindex: update out of sequence")
	// ErrFull: the index tracks MaxReplicas replicas already.
	ErrFull = errors.New("kvindex: too many replicas")
)

// MaxReplicas is how many replicas one index tracks: a replica's id is 16
// bits of a slot.
const MaxReplicas = 1<<16 - 2

// ID is a replica's id in the index, 1 to MaxReplicas; 0 is none.
type ID uint16

// Index maps model → key → replicas.
type Index struct {
	t      table
	models map[string]uint64 // model → salt mixed into its keys
	reps   map[string]*replica
	byID   []*replica // by ID; [0] unused
	free   []ID
}

type replica struct {
	id       ID
	name     string
	model    string
	salt     uint64
	capacity int
	keys     int
	seq      uint64
	synced   bool // a reset was applied and no update was missed since
}

// New returns an empty index.
func New() *Index {
	return &Index{models: map[string]uint64{}, reps: map[string]*replica{}, byID: []*replica{nil}}
}

// ID returns replica's id, 0 when the index holds nothing of it. A host
// keeps it beside its own view of the replica to read Holders' answers.
func (x *Index) ID(replica string) ID {
	if r := x.reps[replica]; r != nil {
		return r.id
	}
	return 0
}

// Synced reports whether replica's keys are exact: a reset was applied and
// no update missed since.
func (x *Index) Synced(replica string) bool {
	r := x.reps[replica]
	return r != nil && r.synced
}

// Keys is the number of keys held for replica.
func (x *Index) Keys(replica string) int {
	if r := x.reps[replica]; r != nil {
		return r.keys
	}
	return 0
}

// ModelKeys is the number of (key, replica) entries of model.
func (x *Index) ModelKeys(model string) int {
	n := 0
	for _, r := range x.reps {
		if r.model == model {
			n += r.keys
		}
	}
	return n
}

// Len is the number of (key, replica) entries.
func (x *Index) Len() int { return x.t.pairs }

// HolderCount is the number of replicas holding key of model.
func (x *Index) HolderCount(model string, key uint64) int {
	salt, ok := x.models[model]
	if !ok {
		return 0
	}
	return x.t.holders(fp(key, salt))
}

// Apply applies one update. The caller has checked that the subject it
// came on names u.Replica. Stored keys past the replica's capacity are
// refused (ErrBounds, the update's other keys applied); an update after a
// missed one drops the replica's keys (ErrSeq) until its next reset.
func (x *Index) Apply(u *subjects.KVUpdate) error {
	if u.KVBlocks < 1 || u.KVBlocks > subjects.MaxKVBlocks || len(u.Stored)+len(u.Evicted) > subjects.MaxKVUpdateKeys {
		return fmt.Errorf("%w: kv_blocks %d, %d keys", ErrBounds, u.KVBlocks, len(u.Stored)+len(u.Evicted))
	}
	r := x.reps[u.Replica]
	if r == nil {
		var err error
		if r, err = x.add(u.Replica, u.Model); err != nil {
			return err
		}
	}
	if r.model != u.Model {
		// A replica that now serves another model starts over.
		x.drop(r)
		r.model, r.salt = u.Model, x.salt(u.Model)
		r.synced = false
	}
	r.capacity = u.KVBlocks
	switch prev := r.seq; {
	case u.Reset && u.Resend && r.synced && u.Seq == prev+1:
		// Asked for by a decider, and this one missed nothing: what it
		// holds is what the replica holds, so nothing is rebuilt.
	case u.Reset:
		x.drop(r)
		r.synced = true
	case !r.synced:
		r.seq = u.Seq
		return fmt.Errorf("%w: %s has not reset since updates were missed", ErrSeq, u.Replica)
	case u.Seq != prev+1:
		x.drop(r)
		r.synced, r.seq = false, u.Seq
		return fmt.Errorf("%w: %s sent %d after %d", ErrSeq, u.Replica, u.Seq, prev)
	}
	r.seq = u.Seq
	for _, k := range u.Evicted {
		if x.t.remove(fp(k, r.salt), r.id) {
			r.keys--
		}
	}
	refused := 0
	for _, k := range u.Stored {
		if r.keys >= r.capacity {
			refused++
			continue
		}
		if x.t.insert(fp(k, r.salt), r.id) {
			r.keys++
		}
	}
	if refused > 0 {
		return fmt.Errorf("%w: %s holds its capacity of %d keys, %d refused", ErrBounds, u.Replica, r.capacity, refused)
	}
	return nil
}

// Drop forgets every key of replica (its feed went away, or it left).
func (x *Index) Drop(replica string) {
	if r := x.reps[replica]; r != nil {
		x.drop(r)
		r.synced = false
	}
}

// Remove forgets replica and frees its id.
func (x *Index) Remove(replica string) {
	r := x.reps[replica]
	if r == nil {
		return
	}
	x.drop(r)
	delete(x.reps, replica)
	x.byID[r.id] = nil
	x.free = append(x.free, r.id)
}

// Holders calls f with the id of every replica holding key of model until
// f returns false. It allocates nothing.
func (x *Index) Holders(model string, key uint64, f func(ID) bool) {
	salt, ok := x.models[model]
	if !ok {
		return
	}
	x.t.each(fp(key, salt), f)
}

// Holds reports whether replica id holds key of model.
func (x *Index) Holds(model string, key uint64, id ID) bool {
	salt, ok := x.models[model]
	if !ok || id == 0 {
		return false
	}
	return x.t.has(fp(key, salt), id)
}

func (x *Index) add(name, model string) (*replica, error) {
	var id ID
	switch {
	case len(x.free) > 0:
		id = x.free[len(x.free)-1]
		x.free = x.free[:len(x.free)-1]
	case len(x.byID) <= MaxReplicas:
		id = ID(len(x.byID))
		x.byID = append(x.byID, nil)
	default:
		return nil, ErrFull
	}
	r := &replica{id: id, name: name, model: model, salt: x.salt(model)}
	x.reps[name] = r
	x.byID[id] = r
	return r, nil
}

// salt is model's key salt: keys of different models never meet.
func (x *Index) salt(model string) uint64 {
	if s, ok := x.models[model]; ok {
		return s
	}
	s := mix(uint64(len(x.models)+1) * 0x9e3779b97f4a7c15)
	x.models[model] = s
	return s
}

func (x *Index) drop(r *replica) {
	if r.keys > 0 {
		x.t.removeAll(r.id)
	}
	r.keys = 0
}

// AppendHolders appends the ids of the replicas holding key of model to
// dst.
func (x *Index) AppendHolders(dst []ID, model string, key uint64) []ID {
	salt, ok := x.models[model]
	if !ok {
		return dst
	}
	f := fp(key, salt)
	i := x.t.find(f)
	if i < 0 {
		return dst
	}
	if h := ID(x.t.slots[i] & idMask); h != multi {
		return append(dst, h)
	}
	return append(dst, x.t.sets[f]...)
}

// EachModel calls f with every model and its number of (key, replica)
// entries.
func (x *Index) EachModel(f func(model string, entries int)) {
	per := map[string]int{}
	for _, r := range x.reps {
		per[r.model] += r.keys
	}
	for m, n := range per {
		f(m, n)
	}
}

// Holders is the replicas holding one key, valid until the index changes.
type Holders struct {
	one ID
	set []ID
}

// Len is the number of holders.
func (h Holders) Len() int {
	if h.set != nil {
		return len(h.set)
	}
	if h.one != 0 {
		return 1
	}
	return 0
}

// At is the i-th holder's id.
func (h Holders) At(i int) ID {
	if h.set != nil {
		return h.set[i]
	}
	return h.one
}

// Lookup returns the replicas holding key of model, without allocating.
func (x *Index) Lookup(model string, key uint64) Holders {
	salt, ok := x.models[model]
	if !ok {
		return Holders{}
	}
	f := fp(key, salt)
	i := x.t.find(f)
	if i < 0 {
		return Holders{}
	}
	if h := ID(x.t.slots[i] & idMask); h != multi {
		return Holders{one: h}
	}
	return Holders{set: x.t.sets[f]}
}
