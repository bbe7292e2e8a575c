package policy

import (
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// Regions (README, "Regions"). A replica's region is its heartbeat's; a
// router's is Config.Region. Region names are interned into small ids when
// the table is set, so a decision compares bytes and tests bits, never
// strings: the ids are the router's, the table's regions and the
// tenants' residency lists, at most table.MaxRegions of them.
const (
	// regionNone is the id of the empty region: a replica or router
	// without --region.
	regionNone uint8 = 0
	// regionOther is the id of a region the table and the router do not
	// name: never local, never spilled to, never allowed by residency.
	regionOther uint8 = 1
	firstRegion uint8 = 2
	// regionIDs bounds the ids: the two above and table.MaxRegions.
	regionIDs = int(firstRegion) + table.MaxRegions
)

// Where a spill's penalty came from (Decision.SpillPenaltySource).
const (
	PenaltyTable    = "table"    // policy.regions.<from>.penalty
	PenaltyMeasured = "measured" // the round trip the decider measured to the region (SetRegionRTT)
	PenaltyDefault  = "default"  // table.DefaultSpillPenalty: neither set nor measured yet
)

// anyRegion is the residency mask of a tenant without regions.
const anyRegion = ^uint64(0)

// regionIndex is what the router knows of regions, built with each table
// (SetTable). Lock: Router.mu.
type regionIndex struct {
	ids   map[string]uint8 // interned names, from firstRegion
	names []string         // by id
	local uint8            // the router's region, regionNone without one
	// spill is the local region's spill list (policy.regions.<local>),
	// ids in order, with the reason prefix of each ("spill:eu->us+").
	spill   []uint8
	reasons []string
	// explicit is the table's penalty for the local region in ms (0:
	// none set); penalty, by region id, is the one added to a candidate of
	// that region's predicted TTFT when the decision spills there, and
	// source says where it came from (setPenalties).
	explicit float64
	penalty  [regionIDs]float64
	source   [regionIDs]string
}

func newRegionIndex(local string, s *table.Snapshot, measured map[string]time.Duration) regionIndex {
	ix := regionIndex{ids: map[string]uint8{}}
	ix.names = []string{regionNone: "", regionOther: "other"}
	add := func(name string) {
		if _, ok := ix.ids[name]; !ok && name != "" && len(ix.ids) < table.MaxRegions {
			ix.ids[name] = firstRegion + uint8(len(ix.ids))
			ix.names = append(ix.names, name)
		}
	}
	add(local)
	for _, from := range slices.Sorted(maps.Keys(s.Policy.Regions)) {
		add(from)
		for _, to := range s.Policy.Regions[from].Spill {
			add(to)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(s.Tenants)) {
		for _, r := range s.Tenants[name].Regions {
			add(r)
		}
	}
	ix.local = ix.of(local)
	if local == "" {
		return ix
	}
	rp := s.Policy.Regions[local]
	ix.explicit = ms(time.Duration(rp.Penalty))
	ix.setPenalties(measured)
	for _, to := range rp.Spill {
		if id := ix.of(to); id >= firstRegion {
			ix.spill = append(ix.spill, id)
			ix.reasons = append(ix.reasons, ReasonSpill+local+"->"+to+"+")
		}
	}
	return ix
}

// setPenalties sets each region's spill penalty: the table's when it sets
// one, else the round trip measured to the region (measured, by name),
// else table.DefaultSpillPenalty.
func (ix *regionIndex) setPenalties(measured map[string]time.Duration) {
	for id := range ix.names {
		switch rtt, ok := measured[ix.names[id]]; {
		case ix.explicit > 0:
			ix.penalty[id], ix.source[id] = ix.explicit, PenaltyTable
		case ok && id >= int(firstRegion):
			ix.penalty[id], ix.source[id] = ms(rtt), PenaltyMeasured
		default:
			ix.penalty[id], ix.source[id] = ms(table.DefaultSpillPenalty), PenaltyDefault
		}
	}
}

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// of is the id of region name.
func (ix *regionIndex) of(name string) uint8 {
	if name == "" {
		return regionNone
	}
	if id, ok := ix.ids[name]; ok {
		return id
	}
	return regionOther
}

// allowed is the residency mask of tenant t: a bit per region it may be
// served in, anyRegion without a list. A region the index could not
// intern sets no bit: residency fails closed.
func (ix *regionIndex) allowed(t *table.Tenant) uint64 {
	if t == nil || t.Regions == nil {
		return anyRegion
	}
	var m uint64
	for _, r := range t.Regions {
		if id := ix.of(r); id >= firstRegion {
			m |= 1 << id
		}
	}
	return m
}

// regionFilter is the region step's state for one decision: the router's
// region and spill list, the tenant's residency, and what it did.
type regionFilter struct {
	ix      *regionIndex
	allowed uint64 // residency mask
	on      bool   // a region or residency is in force
	// to is the region the candidates were taken from when they are not
	// the router's own (regionNone: not spilled), and reason the prefix of
	// the decision's reason then ("spill:eu->us+").
	to     uint8
	reason string
	// resident counts the candidates residency left out, over the
	// decision (every group tried): a decision left without a candidate
	// after it did is refused naming the rule.
	resident int
	// nlocal counts the group's candidates of the router's region, and
	// localRoom says one of them is not saturated: counted by the walk
	// that makes the candidates (candidates).
	nlocal    int
	localRoom bool
}

// local is the router's region id; regionNone before start, or when no
// region is in force.
func (f *regionFilter) local() uint8 {
	if f.ix == nil {
		return regionNone
	}
	return f.ix.local
}

func (f *regionFilter) start(ix *regionIndex, t *table.Tenant) {
	f.ix, f.allowed = ix, ix.allowed(t)
	f.on = ix.local != regionNone || f.allowed != anyRegion
	f.to, f.reason, f.resident = regionNone, "", 0
}

// regional keeps the candidates of one region, local first: residency
// leaves out every candidate outside the tenant's regions; then, for a
// router with a region, its own region's candidates while any of them is
// neither saturated (by the seed's rule: kv at saturation_kv or a full
// queue) nor gone; else the first region of its spill list with one that
// is not saturated; else its own saturated ones (deprioritised, not
// excluded: the capacity check answers for them); else, none of its own
// being live, the first region of the spill list with any (fail over).
// A tenant that may not be served in the router's region, and whose
// regions the spill list does not lead to, is served in the first of its
// regions with a candidate (with room first): residency is the rule, the
// spill list a preference. A pinned request keeps its replica wherever it
// is, residency allowing: the stored response lives there.
func (p *pick) regional(cands []cand) []cand {
	f := &p.region
	if !f.on {
		return cands
	}
	f.to, f.reason = regionNone, ""
	local := f.ix.local
	if local == regionNone || p.req.Pin != "" {
		if f.allowed == anyRegion {
			return cands
		}
		return p.keepRegion(cands, anyRegion)
	}
	nlocal, localRoom := f.nlocal, f.localRoom
	if f.allowed&(1<<local) == 0 {
		nlocal, localRoom = 0, false
	}
	localLive := nlocal > 0
	if localRoom {
		if nlocal == len(cands) {
			return cands // the healthy case of a region alone: nothing to leave out
		}
		return p.keepRegion(cands, 1<<local)
	}
	// Spill: the first region of the list with room, else (nothing local)
	// the first with any candidate.
	to := -1
	for pass := 0; pass < 2 && to < 0; pass++ {
		if pass == 1 && localLive {
			break
		}
		for k, id := range f.ix.spill {
			if f.allowed&(1<<id) == 0 {
				continue
			}
			for i := range cands {
				if cands[i].x.region == id && (pass == 1 || !cands[i].saturated) {
					to = k
					break
				}
			}
			if to >= 0 {
				break
			}
		}
	}
	var id uint8
	switch {
	case to >= 0:
		id, f.reason = f.ix.spill[to], f.ix.reasons[to]
	case f.allowed&(1<<local) == 0:
		// The tenant may not be served here, and the spill list names
		// none of its regions with a candidate: residency decides, the
		// first of its regions with room, else with any.
		if id = p.residentRegion(cands); id == regionNone {
			return p.keepRegion(cands, 0)
		}
		f.reason = ReasonSpill + f.ix.names[local] + "->" + f.ix.names[id] + "+"
	default:
		return p.keepRegion(cands, 1<<local)
	}
	f.to = id
	kept := p.keepRegion(cands, 1<<id)
	for i := range kept {
		kept[i].ttft += f.penalty()
	}
	return kept
}

// residentRegion is the region of the first candidate residency allows
// with room, else of the first it allows; regionNone when it allows none.
func (p *pick) residentRegion(cands []cand) uint8 {
	f := &p.region
	found := regionNone
	for i := range cands {
		c := &cands[i]
		if f.allowed&(1<<c.x.region) == 0 {
			continue
		}
		if !c.saturated {
			return c.x.region
		}
		if found == regionNone {
			found = c.x.region
		}
	}
	return found
}

// keepRegion compacts cands to those of the regions in mask that
// residency allows, as the filters would have made them, counting what
// residency left out.
func (p *pick) keepRegion(cands []cand, mask uint64) []cand {
	f := &p.region
	mask &= f.allowed
	k := 0
	p.nfresh, p.nfull = 0, 0
	for i := range cands {
		c := &cands[i]
		if bit := uint64(1) << c.x.region; mask&bit == 0 {
			if f.allowed&bit == 0 {
				f.resident++
			}
			c.x.mark = 0 // not a candidate of this decision
			continue
		}
		if c.fresh {
			p.nfresh++
		}
		if c.full {
			p.nfull++
		}
		if k != i {
			c.x.ci = int32(k)
			cands[k] = *c
		}
		k++
	}
	return cands[:k]
}

// penalty is what the region step adds to a candidate's predicted TTFT,
// in ms: the spill penalty of the region the candidates were taken from
// when it is not the router's own, else 0.
func (f *regionFilter) penalty() float64 {
	if f.to == regionNone {
		return 0
	}
	return f.ix.penalty[f.to]
}

// spillPenalty is the penalty of the decision's spill and where it came
// from; zero and "" when it did not spill.
func (f *regionFilter) spillPenalty() (time.Duration, string) {
	if f.to == regionNone {
		return 0, ""
	}
	return millis(f.penalty()), f.ix.source[f.to]
}

// errResidency is the refusal of a request whose tenant's regions have no
// replica for it.
func errResidency(model, tenant string, t *table.Tenant) *subjects.APIError {
	e := subjects.NewError(503, subjects.CodeNoReplicas, "No replica of "+model+" is available in the regions tenant "+tenant+
		" may be served in (residency rule tenants."+tenant+".regions: "+strings.Join(t.Regions, ", ")+").")
	e.RetryAfter = RetryNoReplicas
	return e
}
