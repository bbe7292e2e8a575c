package policy

import (
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchyard-llm/switchyard/broker/policy/kvindex"
	"github.com/switchyard-llm/switchyard/internal/monotime"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// DefaultPrefixEntries is the per-model prefix map capacity.
const DefaultPrefixEntries = 8192

// pendingScale is the pending blocks' map capacity over the prefix map's
// (loadView.pending): replaying Mooncake's conversation trace at capacity,
// where queues are tens of seconds deep, the default's room lost to
// llm-d-sticky's p90 TTFT with four seeds of seven, and four times it with
// one (docs/benchmarks.md, "Prefill work in the choice"). About 3 MB a
// model at the default, only in a decider alone with predicted-ttft and
// the KV-event feed.
const pendingScale = 4

// Config configures a Router.
type Config struct {
	// PrefixEntries caps each model's prefix map (block hash → replicas);
	// 0 means DefaultPrefixEntries.
	PrefixEntries int
	// Self is this broker's id: usage events naming another broker are not
	// ours to settle.
	Self string
	// Region is the region this router decides in: its candidates there
	// come first, and it spills to other regions by the table's
	// policy.regions (README, "Regions"). Empty: no region, every
	// candidate alike.
	Region string
	// Clock, when set, measures Decision.Duration. Nil keeps the Router
	// free of wall-clock reads; the caller then fills Duration.
	Clock func() time.Time
	// OnEject, when set, is called when a replica is ejected for its
	// engine failures (see EjectAfter), with the Router's lock held: it
	// must not call back into the Router, and should only count, log or
	// hand off.
	OnEject func(EjectedReplica)
}

// Router makes routing decisions. It is safe for concurrent use: one mutex
// guards the load view, and a decision holds it for a couple of
// microseconds.
type Router struct {
	cfg  Config
	snap atomic.Pointer[table.Snapshot] // also read without mu by Table

	mu sync.Mutex // guards everything below
	// view is what the router knows of the replicas; quotas the tenants'
	// buckets and reservations; fair the pools' in-flight ledgers.
	view   loadView
	quotas quotas
	fair   fairShares
	rng    *rand.Rand          // used when a caller passes none
	cold   map[string]coldLoad // per model, from the loader's status
	// st is the working state of the decision in progress (one at a time,
	// under mu), reset at every decision. It is kept here, not on decide's
	// stack, because the rows are called through the profile's tables and
	// an indirect call makes its argument escape: kept here it costs no
	// allocation.
	st decision
	// profiles are the table's profiles, resolved by SetTable.
	profiles profiles
	// clock dates what the router stores (hbNano, viewNano, eject.until…)
	// on the monotonic clock, so that a step of the wall clock makes no
	// replica look dead or fresh.
	clock monotime.Scale
	// regions are the table's regions and the router's, interned by
	// SetTable; measured is the round trip to each region, by name, as
	// SetRegionRTT last gave it.
	regions  regionIndex
	measured map[string]time.Duration
	// deciders is how many deciders are live, this one included, 0 when
	// not known (SetDeciders; 1 until told otherwise, for a router on its
	// own): predicted-ttft chooses over every candidate only while it is
	// the one.
	deciders int
}

type groupKey struct{ model, version, pool string }

// replica is the load view of one replica. Lock: Router.mu.
type replica struct {
	// Hot: read, and mark and ci written, for every candidate of every
	// decision, and kept together at the start so that a candidate costs
	// about two cache lines.
	ready  bool  // registered, heartbeat seen, effective state ready
	serves uint8 // the endpoints its engine serves (subjects.EndpointBit)
	// flags are ready, prefillOnly and serves as bits, what the filters
	// with flags test (see filter.flags).
	flags uint16
	// prefillOnly: registered with role prefill, so it runs prefill legs
	// of split requests and never a whole request.
	prefillOnly bool
	// kvLive: its adapter's KV-event feed is live (heartbeat) and the
	// index holds its keys exactly; prefix affinity then reads the index
	// for it, not the placements. kvID is its id in the index.
	kvLive bool
	// region is the id of its heartbeat's region (regionIndex).
	region uint8
	ci     int32  // index in Router.cands while marked
	mark   uint64 // == Router.epoch while a candidate of the current decision
	hbNano int64  // heartbeat receive time, unix ns on the broker's clock: liveness (dead_after)
	// dataNano dates the load data for stale_after: the older of receipt and
	// the adapter's sent_unix_ms, so a heartbeat delivered late (or one the
	// adapter kept resending) is not taken as fresh. Liveness stays on the
	// broker's own clock, so a skewed adapter clock can make load data look
	// stale (routing turns random) but can never make a replica look dead.
	dataNano int64
	// ver counts the changes to the state load reads (heartbeat, load
	// delta, in-flight requests, prefill sent): view is valid while it
	// matches. Everything that changes that state calls touch.
	ver    uint64
	scored scoredView
	// msPerToken is 1/prefillRate (0: unknown): a multiplication per
	// candidate instead of a division, since it changes only with the
	// heartbeat.
	msPerToken float64
	wait       float64 // estimated ms to the first token
	kv         float64
	idHash     uint64 // xxhash of id, for rendezvous hashing

	// Warm: read when the view is computed again.
	running, waiting   int32
	maxBatch, maxQueue int32   // heartbeat, else table; maxQueue 0 = unknown
	perBatch, perQueue float64 // 1/maxBatch, 1/(maxQueue or DefaultMaxQueue)
	// inflight counts requests this broker sent since the last heartbeat
	// or load delta: neither can know them yet, so they are added to its
	// load. delta is the adapter's in-flight count in its last load delta
	// less the heartbeat's (negative when requests ended since), and
	// deltaSeq that delta's Seq; both 0 until a delta follows the heartbeat.
	inflight int32
	delta    int32
	deltaSeq uint64
	// viewNano dates the load view: the data time of the heartbeat or of
	// the load delta on top of it, whichever is newer.
	viewNano int64
	// The prefill view (Predicted TTFT): the heartbeat's prefill rate in
	// tokens per ms (0: unknown), its queued prompt tokens, its base TTFT
	// in ms (the TTFT EWMA less the queue wait), and the uncached prompt
	// tokens this broker sent since it.
	prefillRate float64
	baseTTFT    float64
	// slotMs is how often, in ms, a slot of its full batch frees: its
	// heartbeat's decode time over max_batch (0: unknown).
	slotMs        float64
	queuedPrefill int32
	sentPrefill   int32
	kvID          kvindex.ID
	// byPriority: its engine serves waiting requests by priority and its
	// adapter sends the router's (heartbeat), so batch work may fill its
	// batch (batch-room).
	byPriority bool
	// batchWaiting: of the requests waiting there, the batch lines its
	// adapter counts (byPriority only); an interactive request goes ahead
	// of them.
	batchWaiting int32

	id    string
	reg   *table.Replica // nil when not registered in the table
	hb    subjects.Heartbeat
	hasHB bool
	// sent holds adapters this broker sent since the last heartbeat, so a
	// burst for a new adapter concentrates on the replica that got the first.
	sent  [4]string
	nsent int
	eject ejection
}

// HeardSince reports whether replica id is ready and its last heartbeat
// was received at or after since; while the router lags (SetLagging), the
// time since it last heard any replica is not counted: at now, a router
// that is not listening cannot tell one replica's silence from its own.
func (r *Router) HeardSince(id string, since, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	x := r.view.replicas[id]
	return x != nil && x.ready && x.hbNano >= r.clock.Nanos(since)-r.deafness(r.clock.Nanos(now))
}

// SetLagging says whether this router's decider has evidence that it lags
// behind the bus itself (its own presence is not coming back to it, or
// heartbeats wait to be handled): then the replicas' silence since it last
// heard any of them is taken as its own (deafness).
func (r *Router) SetLagging(lagging bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.view.lagging = lagging
}

// deafness is how long, at now (unix ns), a lagging router has heard no
// heartbeat from any replica: that silence is the observer's, not the
// replicas', and counts toward no replica's dead_after (0 while it does
// not lag). Without evidence of its own lag, a router that hears nobody
// takes them as gone: a fleet that dies at once is seen at dead_after.
// The caller holds r.mu.
func (r *Router) deafness(now int64) int64 {
	if !r.view.lagging || r.view.heardNano == 0 {
		return 0
	}
	return max(now-r.view.heardNano, 0)
}

// Deafness is how long this router, lagging, has heard no replica at now
// (see deafness); 0 while it does not lag.
func (r *Router) Deafness(now time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return time.Duration(r.deafness(r.clock.Nanos(now)))
}

// MarkGone takes replica id out of the candidates until its next
// heartbeat, when a request sent to it found nothing listening there
// (NATS's no-responders) and it is silent past dead_after: a replica kept
// only by the panic threshold that proves gone is not tried again by the
// next requests. A replica heard within dead_after is never taken out on
// such a claim. It reports whether it took the replica out.
func (r *Router) MarkGone(id string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	x, snap := r.view.replicas[id], r.snap.Load()
	if x == nil || snap == nil || !x.ready || r.clock.Nanos(now)-x.hbNano < int64(snap.Policy.DeadAfter) {
		return false
	}
	x.ready = false
	x.flags &^= flagReady
	x.touch()
	return true
}

// LastHeard is when the router last received a heartbeat (zero: never).
func (r *Router) LastHeard() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.view.heardNano == 0 {
		return time.Time{}
	}
	return r.clock.Time(r.view.heardNano)
}

// Reconnected keeps the load view through the router's own absence from
// the bus, from lost (when it stopped hearing it) to now: the heartbeats
// it missed say nothing of the replicas. A replica alive at lost (heard
// within dead_after before it) is taken as heard that much later, its
// silence counted without the absence; one already dead stays dead, and
// one heard after lost keeps its own time. The load data keeps its own
// age (stale_after).
func (r *Router) Reconnected(lost, now time.Time) {
	away := now.Sub(lost)
	if lost.IsZero() || away <= 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	dead := int64(15 * time.Second)
	if s := r.snap.Load(); s != nil {
		dead = int64(s.Policy.DeadAfter)
	}
	l, n := r.clock.Nanos(lost), r.clock.Nanos(now)
	if h := r.view.heardNano; h > 0 && h <= l {
		r.view.heardNano = min(h+int64(away), n)
	}
	for _, x := range r.view.replicas {
		if x.hasHB && x.hbNano <= l && l-x.hbNano < dead {
			x.hbNano = min(x.hbNano+int64(away), n)
		}
	}
}

// ttftKnown reports whether the replica's engine has given any evidence of
// its time to first token: before it has, its prediction is not a time
// that can be judged (the adapter reports no TTFT rather than 0 ms).
func (x *replica) ttftKnown() bool { return x.hb.TTFTEWMAMillis > 0 }

// touch marks the state load reads as changed.
func (x *replica) touch() { x.ver++ }

// refresh derives the hot fields from the table entry and the heartbeat.
func (x *replica) refresh() {
	x.touch()
	hb := &x.hb
	x.ready = x.reg != nil && x.hasHB && subjects.Restrictive(x.reg.State, hb.State) == subjects.StateReady
	x.prefillOnly = x.reg != nil && x.reg.Role == table.RolePrefill
	var regBatch, regQueue int
	if x.reg != nil {
		regBatch, regQueue = x.reg.MaxBatch, x.reg.MaxQueue
	}
	x.kv, x.wait = hb.KVUsage, max(hb.TTFTEWMAMillis, hb.QueueWaitMillis)
	x.running, x.waiting = clamp32(hb.Running), clamp32(hb.Waiting)
	x.prefillRate = hb.PrefillTokensPerSec / 1000
	x.baseTTFT = max(hb.TTFTEWMAMillis-hb.QueueWaitMillis, 0)
	x.queuedPrefill = clamp32(hb.QueuedPrefillTokens)
	x.maxBatch = clamp32(firstPositive(hb.MaxBatch, regBatch, DefaultMaxBatch))
	x.maxQueue = clamp32(firstPositive(hb.MaxQueue, regQueue, 0))
	x.msPerToken = 0
	if x.prefillRate > 0 {
		x.msPerToken = 1 / x.prefillRate
	}
	x.perBatch = 1 / float64(max(x.maxBatch, 1))
	x.slotMs = hb.DecodeMillis * x.perBatch
	x.perQueue = 1 / float64(firstPositive(int(x.maxQueue), DefaultMaxQueue, DefaultMaxQueue))
	x.byPriority = hb.Scheduling == subjects.SchedulingPriority
	x.batchWaiting = 0
	if x.byPriority {
		x.batchWaiting = clamp32(hb.BatchWaiting)
	}
	switch {
	case x.hasHB && len(hb.Endpoints) > 0:
		x.serves = subjects.EndpointSet(hb.Endpoints)
	case x.reg != nil:
		x.serves = subjects.EndpointSet(x.reg.Endpoints)
	default:
		x.serves = subjects.EndpointSet(nil)
	}
	x.flags = uint16(x.serves) << flagServesShift
	if x.ready {
		x.flags |= flagReady
	}
	if x.prefillOnly {
		x.flags |= flagPrefill
	}
}

func clamp32(n int) int32 { return int32(min(max(n, 0), 1<<30)) }

// New returns a Router with no table: every decision is 503
// router_unavailable until SetTable.
func New(cfg Config) *Router {
	if cfg.PrefixEntries <= 0 {
		cfg.PrefixEntries = DefaultPrefixEntries
	}
	return &Router{
		cfg:      cfg,
		view:     newLoadView(cfg.PrefixEntries),
		quotas:   quotas{tenants: map[string]*tenantQuota{}, brokers: 1},
		deciders: 1,
		fair:     newFairShares(),
		rng:      rand.New(rand.NewPCG(1, 2)),
		profiles: newProfiles(table.NewSnapshot()),
		clock:    monotime.New(),
		regions:  newRegionIndex(cfg.Region, table.NewSnapshot(), nil),
	}
}

// Table returns the snapshot in force (nil before the first SetTable).
func (r *Router) Table() *table.Snapshot { return r.snap.Load() }

// SetTable swaps in a new snapshot and re-indexes the registered replicas.
// The snapshot must not be modified afterwards; nil empties the table.
func (r *Router) SetTable(s *table.Snapshot) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.snap.Store(s)
	if s == nil {
		s = table.NewSnapshot()
	}
	for _, x := range r.view.replicas {
		x.reg = nil
	}
	groups := make(map[groupKey][]*replica, 2*len(s.Replicas))
	byModel := make(map[string][]*replica, len(s.Models))
	// Sorted, so the candidate order, and with a seeded rng every decision,
	// is reproducible.
	for _, id := range slices.Sorted(maps.Keys(s.Replicas)) {
		reg := s.Replicas[id]
		x := r.view.replica(id)
		x.reg = reg
		k := groupKey{reg.Model, reg.Version, reg.Pool}
		groups[k] = append(groups[k], x)
		if reg.Version != "" {
			k.version = ""
			groups[k] = append(groups[k], x)
		}
		byModel[reg.Model] = append(byModel[reg.Model], x)
	}
	r.regions = newRegionIndex(r.cfg.Region, s, r.measured)
	for id, x := range r.view.replicas {
		if x.reg == nil && !x.hasHB {
			delete(r.view.replicas, id)
			continue
		}
		x.refresh()
		x.region = r.regions.of(x.hb.Region)
	}
	r.view.groups, r.view.byModel = groups, byModel
	r.profiles = newProfiles(s)
}

// SetRegionRTT sets the round trip measured from the router's region to
// each region of rtt (by name; a region absent is not measured): the
// spill penalty of a region whose table sets none. rtt is kept; the
// caller must not modify it afterwards.
func (r *Router) SetRegionRTT(rtt map[string]time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.measured = rtt
	if r.regions.local != regionNone {
		r.regions.setPenalties(rtt)
	}
}

// SpillPenalty is the penalty a spill to region would add to its
// candidates' predicted TTFT, and where it comes from (PenaltyTable,
// PenaltyMeasured, PenaltyDefault); "" for a router without a region.
func (r *Router) SpillPenalty(region string) (time.Duration, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.regions.local == regionNone {
		return 0, ""
	}
	id := r.regions.of(region)
	return millis(r.regions.penalty[id]), r.regions.source[id]
}

// Regions are the regions the router knows, its own first: its region,
// the table's policy.regions and the tenants' residency lists. Nil for
// a router without a region.
func (r *Router) Regions() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.regions.local == regionNone {
		return nil
	}
	return slices.Clone(r.regions.names[firstRegion:])
}

// HeardRegion is the region replica id's last heartbeat named, and whether
// the router knows the replica (registered, heard): what only the replica's
// own identity may publish.
func (r *Router) HeardRegion(id string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	x := r.view.replicas[id]
	if x == nil || x.hbNano == 0 {
		return "", false
	}
	return x.hb.Region, true
}

// ObserveHeartbeat records a replica's load as of now and resets this
// broker's in-flight count for it. hb must not be modified afterwards (its
// slices are kept).
func (r *Router) ObserveHeartbeat(hb *subjects.Heartbeat, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	x := r.view.replicas[hb.Replica]
	if x == nil {
		r.view.prune(r.clock.Nanos(now), r.snap.Load())
		x = r.view.replica(hb.Replica)
	}
	x.hb, x.hbNano, x.hasHB = *hb, r.clock.Nanos(now), true
	r.view.heardNano = max(r.view.heardNano, x.hbNano)
	x.dataNano = x.hbNano - monotime.Lag(now, hb.SentUnixMillis*int64(time.Millisecond))
	x.inflight, x.nsent, x.sentPrefill = 0, 0, 0
	x.delta, x.deltaSeq, x.viewNano = 0, 0, x.dataNano
	if !hb.KVEvents && r.view.kv.Keys(x.id) > 0 {
		// The adapter says its feed is lost: its keys are not exact.
		r.view.kv.Drop(x.id)
	}
	r.view.kvRefresh(x)
	x.refresh()
	x.region = r.regions.of(hb.Region)
	if d, ok := x.observeFailures(hb, x.hbNano); ok {
		r.view.ejectHorizon = max(r.view.ejectHorizon, x.eject.until)
		if r.cfg.OnEject != nil {
			r.cfg.OnEject(EjectedReplica{Replica: x.id, Until: now.Add(d), Count: x.eject.count, Failures: hb.EngineFailures})
		}
	}
}

// ObserveLoadDelta applies an adapter's load delta (the caller checked that
// the subject names d.Replica and that its numbers are in range) on top of
// the heartbeat it follows: the adapter's in-flight count and queued
// prefill replace the heartbeat's, and this broker's in-flight count since
// starts over, as at a heartbeat (the adapter counted what reached it). A
// delta that follows another heartbeat than the one held, or an older
// delta, is dropped: the heartbeat in hand is the truth it was measured
// against. It reports whether d was applied.
func (r *Router) ObserveLoadDelta(d *subjects.LoadDelta, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	x := r.view.replicas[d.Replica]
	if x == nil || !x.hasHB || x.hb.Seq != d.Heartbeat || d.Seq <= x.deltaSeq {
		return false
	}
	x.deltaSeq = d.Seq
	x.delta = clamp32(d.Inflight) - clamp32(x.hb.Inflight)
	x.queuedPrefill = clamp32(d.QueuedPrefillTokens)
	x.inflight, x.sentPrefill = 0, 0
	x.touch()
	at := r.clock.Nanos(now) - monotime.Lag(now, d.SentUnixMillis*int64(time.Millisecond))
	x.viewNano = max(x.viewNano, at)
	return true
}

// ObserveKV applies an adapter's KV-cache key update (the caller checked
// that the subject it came on names u.Replica). The error says why part or
// all of it was refused (kvindex.ErrBounds, ErrSeq, ErrFull); what was
// within bounds is applied.
func (r *Router) ObserveKV(u *subjects.KVUpdate) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	err := r.view.kv.Apply(u)
	if x := r.view.replicas[u.Replica]; x != nil {
		r.view.kvRefresh(x)
		// What was sent there is pending only until its engine reports
		// it (matchAll). A reset that is not a resend says the engine or
		// the adapter started over: what was queued may be lost.
		if m := r.view.pending[u.Model]; m != nil && err == nil {
			if u.Reset && !u.Resend {
				m.forgetReplica(x)
			}
			for _, k := range u.Stored {
				m.forget(k, x)
			}
			for _, k := range u.Evicted {
				m.forget(k, x)
			}
		}
	}
	return err
}

// KVSynced reports whether the exact index holds replica's keys exactly: a
// replica whose heartbeat says its feed is live but is not synced needs
// its adapter to resend (llm.kvsync).
func (r *Router) KVSynced(replica string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.view.kv.Synced(replica)
}

// KVKeys is the number of request keys the exact index holds for replica
// (the dashboard's cached blocks per replica).
func (r *Router) KVKeys(replica string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.view.kv.Keys(replica)
}

// PrefixIndexEntries calls f with every model and the number of (key,
// replica) entries the exact prefix index holds for it.
func (r *Router) PrefixIndexEntries(f func(model string, entries int)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.view.kv.EachModel(f)
}

// ObservePlacement counts another broker's request as in flight on its
// replica (and on its prefill replica, for a split request), with its
// uncached prompt tokens as sent prefill, until the replica's next load
// delta or heartbeat (which will count it), and merges its blocks into the
// prefix map as the broker that decided remembered them: a split request's
// blocks on its prefill replica, then on its decode replica. Placements for
// replicas this broker does not know are dropped, and so is a prefill
// replica that is not a prefill replica of the model here.
func (r *Router) ObservePlacement(p *subjects.Placement) {
	r.mu.Lock()
	defer r.mu.Unlock()
	x := r.view.replicas[p.Replica]
	if x == nil {
		return
	}
	x.inflight = clamp32(int(x.inflight) + 1)
	x.sentPrefill = clamp32(int(x.sentPrefill) + min(max(p.Uncached, 0), subjects.MaxQueuedPrefillTokens))
	x.touch()
	y := r.view.replicas[p.Prefill]
	if p.Prefill == "" || y == nil || !y.prefillOnly || y.reg == nil || y.reg.Model != p.Model {
		y = nil
	}
	if y != nil {
		y.inflight = clamp32(int(y.inflight) + 1)
		y.touch()
	}
	if len(p.Blocks) == 0 {
		return
	}
	m := r.view.prefixMap(p.Model, r.snap.Load())
	if m == nil {
		return
	}
	if y != nil {
		m.remember(p.Blocks, y)
	}
	m.remember(p.Blocks, x)
}

// Live returns replica id's registration when it can serve now:
// registered, ready and heartbeating within dead_after.
func (r *Router) Live(id string, now time.Time) (table.Replica, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	x, snap := r.view.replicas[id], r.snap.Load()
	if x == nil || snap == nil || !x.liveAt(r.clock.Nanos(now), int64(snap.Policy.DeadAfter)+r.deafness(r.clock.Nanos(now))) {
		return table.Replica{}, false
	}
	return *x.reg, true
}

// SetLiveBrokers sets how many brokers are live and share every tenant
// quota: each enforces limit ÷ n.
func (r *Router) SetLiveBrokers(n int) { r.SetDeciders(n, n, nil) }

// SetDeciders sets how many deciders are live (live, this one included:
// the deciders that send to the same replicas; 0 when not known yet, which
// counts as others being live) and how many share each tenant quota: all
// share
// every tenant's (this decider and, beside a broker, the other brokers: the
// queue group spreads any tenant's requests evenly over them), and per[key]
// more share the quota of tenant key (the other deciders that admitted its
// requests lately). Each enforces limit ÷ (all + per[key]) of a tenant's
// quota, so a gateway holding all of a tenant's HTTP traffic enforces all
// of it, and two deciders that both see its requests half each. per is
// the router's from then on.
func (r *Router) SetDeciders(live, all int, per map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.deciders = max(live, 0)
	r.quotas.brokers, r.quotas.sharing = max(all, 1), per
}

// ChargedSince appends to dst the quota keys of the tenants whose quota
// this router charged at or after since: the tenants it shares quotas with
// the other deciders for.
func (r *Router) ChargedSince(since time.Time, dst []string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, q := range r.quotas.tenants {
		if !q.rpm.at.Before(since) || !q.tpm.at.Before(since) {
			dst = append(dst, k)
		}
	}
	return dst
}

// Decide makes the full decision for req, admission included, and commits
// it when admitted: in-flight count, quota reservation, prefix map.
func (r *Router) Decide(req *Request, now time.Time, rng *rand.Rand) Decision {
	return r.decide(req, now, rng, true)
}

// Explain makes the same decision as Decide without side effects (rng is
// still drawn from).
func (r *Router) Explain(req *Request, now time.Time, rng *rand.Rand) Decision {
	return r.decide(req, now, rng, false)
}

func (r *Router) decide(req *Request, now time.Time, rng *rand.Rand, commit bool) (d Decision) {
	var start time.Time
	if r.cfg.Clock != nil {
		start = r.cfg.Clock()
	}
	r.mu.Lock()
	if rng == nil {
		rng = r.rng
	}
	st := &r.st
	st.start(r, req, now, rng, commit)
	st.run()
	d = st.out
	st.finish()
	r.mu.Unlock()
	if r.cfg.Clock != nil {
		d.Duration = r.cfg.Clock().Sub(start)
	}
	return d
}

// Known is the number of replicas in the load view: registered ones and
// those heard from.
func (r *Router) Known() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.view.replicas)
}
