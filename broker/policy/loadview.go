package policy

import (
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/switchyard-llm/switchyard/broker/policy/kvindex"
	"github.com/switchyard-llm/switchyard/table"
)

// loadView is what a router knows of the replicas: every replica by id,
// with its heartbeat, load delta and in-flight count; the table's groups
// of them; and who holds which prefix blocks. Lock: Router.mu.
type loadView struct {
	// replicas is every replica known by id, registered in the table or
	// only heartbeating. Entries keep their identity across table swaps,
	// so the heartbeat and in-flight count survive a SetTable.
	replicas map[string]*replica
	// groups indexes registered replicas by (model, version, pool);
	// version "" lists every version. Rebuilt by SetTable only.
	groups   map[groupKey][]*replica
	byModel  map[string][]*replica
	prefixes map[string]*prefixMap // per model id
	// pending holds, per model id, the blocks a decider choosing over
	// every replica sent to a replica with the KV-event feed that its
	// engine has not reported stored or evicted yet (ObserveKV forgets
	// them), for predicted-ttft alone (matchAll).
	pending map[string]*prefixMap
	entries int // a prefix map's capacity
	// kv is the exact prefix index fed by the adapters' KV-event updates;
	// byKV finds a replica by its id there.
	kv      *kvindex.Index
	byKV    []*replica
	pruneAt int    // replicas map size that triggers the next sweep
	epoch   uint64 // stamps the candidates of the current decision
	// heardNano is when the newest heartbeat from any replica was
	// received (unix ns); lagging: the decider has evidence that it lags
	// behind the bus (Router.SetLagging). Together, its deafness.
	heardNano int64
	lagging   bool
	// ejectHorizon is the latest end of an ejection (unix ns): decisions
	// after it skip the ejection check.
	ejectHorizon int64
}

func newLoadView(prefixEntries int) loadView {
	return loadView{
		replicas: map[string]*replica{},
		groups:   map[groupKey][]*replica{},
		byModel:  map[string][]*replica{},
		prefixes: map[string]*prefixMap{},
		pending:  map[string]*prefixMap{},
		entries:  prefixEntries,
		kv:       kvindex.New(),
	}
}

// replica returns the entry for id, creating it.
func (v *loadView) replica(id string) *replica {
	x := v.replicas[id]
	if x == nil {
		x = &replica{id: id, idHash: xxhash.Sum64String(id)}
		v.replicas[id] = x
	}
	return x
}

// kvRefresh updates x's place in the exact prefix index.
func (v *loadView) kvRefresh(x *replica) {
	x.kvID = v.kv.ID(x.id)
	x.kvLive = x.kvID != 0 && x.hb.KVEvents && v.kv.Synced(x.id)
	if x.kvID != 0 {
		for int(x.kvID) >= len(v.byKV) {
			v.byKV = append(v.byKV, nil)
		}
		v.byKV[x.kvID] = x
	}
}

// prune forgets unregistered replicas whose heartbeats stopped, so
// heartbeats of replicas that never register cannot grow the map without
// bound. s is the table in force (nil: none yet).
func (v *loadView) prune(now int64, s *table.Snapshot) {
	registered, dead := 0, 15*time.Second
	if s != nil {
		registered, dead = len(s.Replicas), time.Duration(s.Policy.DeadAfter)
	}
	if len(v.replicas) < max(v.pruneAt, 2*registered+64) {
		return
	}
	for id, x := range v.replicas {
		if x.reg == nil && now-x.hbNano >= int64(dead) {
			delete(v.replicas, id)
			if x.kvID != 0 {
				v.byKV[x.kvID] = nil
				v.kv.Remove(id)
			}
		}
	}
	v.pruneAt = 2 * len(v.replicas) // amortized: the next sweep waits for as many new ones
}

// prefixMap returns model's prefix map, creating it for models the table
// s or a registered replica knows (so a stream of placements for made-up
// models cannot allocate maps).
func (v *loadView) prefixMap(model string, s *table.Snapshot) *prefixMap {
	return v.modelMap(v.prefixes, model, s, v.entries)
}

// pendingMap returns model's map of pending blocks, created as prefixMap
// creates the prefix map.
func (v *loadView) pendingMap(model string, s *table.Snapshot) *prefixMap {
	return v.modelMap(v.pending, model, s, pendingScale*v.entries)
}

// modelMap returns model's map of maps, creating it with capacity
// entries for models the table s or a registered replica knows.
func (v *loadView) modelMap(maps map[string]*prefixMap, model string, s *table.Snapshot, capacity int) *prefixMap {
	if m := maps[model]; m != nil {
		return m
	}
	if s == nil || (s.Models[model] == nil && len(v.byModel[model]) == 0) {
		return nil
	}
	m := newPrefixMap(capacity)
	maps[model] = m
	return m
}
