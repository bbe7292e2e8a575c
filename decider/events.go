package decider

import (
	"encoding/json"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/internal/clip"
	"github.com/switchyard-llm/switchyard/subjects"
)

func encode(v any) ([]byte, error) { return json.Marshal(v) }

func (dec *Decider) onHeartbeat(m *nats.Msg) {
	var hb subjects.Heartbeat
	unhealthy, err := DecodeHeartbeat(m.Subject, m.Data, &hb)
	if err != nil {
		dec.metrics.badMessages.WithLabelValues("heartbeat").Inc()
		return
	}
	// Only a replica registered in the table is routed to or measured:
	// heartbeats of made-up replicas would otherwise grow the load view
	// and the metric series without bound.
	if t := dec.router.Table(); t == nil || t.Replicas[hb.Replica] == nil {
		dec.refuseUnregistered("heartbeat", hb.Replica)
		return
	}
	if unhealthy {
		dec.metrics.unhealthy.WithLabelValues(hb.Replica).Inc()
	}
	// A replica that is not ready says nothing of its engine's health
	// while it fails its scrapes (loading, draining): only a good scrape
	// clears an exclusion.
	if (unhealthy || hb.ScrapeOK) && dec.health.changed(hb.Replica, unhealthy) {
		if unhealthy {
			dec.log.Warn("replica excluded: its engine fails health checks (scrape_ok=false)", "replica", hb.Replica)
		} else {
			dec.log.Info("replica healthy again", "replica", hb.Replica)
		}
	}
	dec.heard.add(hb.Replica)
	now := dec.cfg.Now()
	dec.router.ObserveHeartbeat(&hb, now)
	if hb.KVEvents && !dec.router.KVSynced(hb.Replica) {
		// A feed this decider does not hold exactly (it started late, or
		// an update was refused): ask for it again, at most once a second.
		dec.requestKVSync()
	}
	dec.metrics.heartbeat(&hb, now)
}

func (dec *Decider) onPlacement(m *nats.Msg) {
	if m.Header.Get(subjects.HdrBroker) == dec.cfg.ID {
		return
	}
	var p subjects.Placement
	if err := json.Unmarshal(m.Data, &p); err != nil {
		dec.metrics.badMessages.WithLabelValues("placement").Inc()
		return
	}
	dec.router.ObservePlacement(&p)
}

func (dec *Decider) onUsage(m *nats.Msg) {
	// Usage reserved by another broker is skipped before it is decoded.
	if id := m.Header.Get(subjects.HdrBroker); id != "" && id != dec.cfg.ID {
		return
	}
	var u subjects.Usage
	if len(m.Data) > maxUsageBytes || json.Unmarshal(m.Data, &u) != nil {
		dec.metrics.badMessages.WithLabelValues("usage").Inc()
		return
	}
	if u.Broker != "" && u.Broker != dec.cfg.ID {
		return
	}
	// Only a reservation this broker holds is settled, once, for its own
	// tenant and at most what it reserved.
	dec.settleBudget(&u)
	if !dec.router.ObserveUsage(&u, dec.cfg.Now()) {
		dec.refuse(refusedUsage, "usage without a reservation held by this broker ignored", "request", u.RequestID)
	}
}

// maxUsageBytes bounds a usage event (a few hundred bytes when honest).
const maxUsageBytes = 4 << 10

// presence counts the live deciders from their announcements, so each
// enforces its share of a tenant quota (policy.Router.SetDeciders).
type presence struct {
	mu     sync.Mutex
	self   string
	broker bool // this decider is a broker, in the queue group
	seen   map[string]peer
	// aloneSince is when the deciders counted last fell to this one (zero
	// while others are live, or since rewatch).
	aloneSince time.Time
}

// peer is what another decider said in its last announcement.
type peer struct {
	at time.Time
	// every: it shares every tenant's quota with this decider (a broker
	// beside a broker, or an announcement naming no kind).
	every   bool
	tenants []string
}

func (p *presence) init(self string, broker bool) {
	p.self, p.broker = self, broker
	p.seen = map[string]peer{}
}

// shares are the counts a decider divides quotas by.
type shares struct {
	live int // deciders seen within the ttl, this one included
	// alone: no other decider was seen for a whole ttl, the time every
	// live decider announces itself in.
	alone bool
	all   int            // deciders sharing every tenant's quota, this one included
	per   map[string]int // more deciders sharing one tenant's quota
}

// observe records a (nil: none) and counts the deciders seen within ttl.
func (p *presence) observe(a *subjects.Presence, now time.Time, ttl time.Duration) shares {
	p.mu.Lock()
	defer p.mu.Unlock()
	if a != nil && a.ID != p.self {
		// A broker shares every tenant with another broker (the queue
		// group spreads each tenant evenly); any other pair shares the
		// tenants the other admitted lately.
		every := a.Kind == "" || (p.broker && a.Kind == subjects.PresenceBroker)
		p.seen[a.ID] = peer{at: now, every: every, tenants: a.Tenants}
	}
	sh := shares{live: 1, all: 1}
	for k, x := range p.seen {
		if now.Sub(x.at) > ttl {
			delete(p.seen, k)
			continue
		}
		sh.live++
		if x.every {
			sh.all++
			continue
		}
		for _, t := range x.tenants {
			if sh.per == nil {
				sh.per = map[string]int{}
			}
			sh.per[t]++
		}
	}
	switch {
	case sh.live > 1:
		p.aloneSince = time.Time{}
	case p.aloneSince.IsZero():
		p.aloneSince = now
	}
	sh.alone = sh.live == 1 && now.Sub(p.aloneSince) >= ttl
	return sh
}

// rewatch forgets that no other decider was seen (after a reconnect, the
// others' announcements are yet to come).
func (p *presence) rewatch() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.aloneSince = time.Time{}
}

// maxBrokers bounds the deciders counted, and maxPresenceTenants the
// tenants one announcement names: quota shares are limit ÷ deciders, so
// made-up presences must not shrink them without bound, nor grow the
// memory kept of them.
const (
	maxBrokers         = 256
	maxPresenceTenants = 4096
	maxPresenceBytes   = 512 << 10
)

// observeNew is observe for an announcement: a decider not yet seen is
// counted only while fewer than maxBrokers are.
func (p *presence) observeNew(a *subjects.Presence, now time.Time, ttl time.Duration) (shares, bool) {
	p.mu.Lock()
	_, known := p.seen[a.ID]
	full := !known && len(p.seen) >= maxBrokers
	p.mu.Unlock()
	if full {
		return p.observe(nil, now, ttl), false
	}
	return p.observe(a, now, ttl), true
}

// LiveBrokers is the number of live deciders (brokers and deciding
// gateways) this one counts, itself included.
func (dec *Decider) LiveBrokers() int {
	return dec.peers.observe(nil, dec.cfg.Now(), 3*dec.cfg.PresenceEvery).live
}

// decodePresence reads an announcement: a Presence, or a bare id (a
// broker sharing every tenant's quota).
func decodePresence(data []byte) (*subjects.Presence, bool) {
	a := new(subjects.Presence)
	if len(data) > maxPresenceBytes {
		return nil, false
	}
	if len(data) == 0 || data[0] != '{' {
		a.ID = string(data)
	} else if json.Unmarshal(data, a) != nil {
		return nil, false
	}
	if subjects.ValidToken(a.ID) != nil || len(a.Tenants) > maxPresenceTenants {
		return nil, false
	}
	switch a.Kind {
	case "", subjects.PresenceBroker, subjects.PresenceGateway:
	default:
		return nil, false
	}
	// A tenant named twice is one decider sharing it, not two.
	slices.Sort(a.Tenants)
	a.Tenants = slices.Compact(a.Tenants)
	return a, true
}

func (dec *Decider) onPresence(m *nats.Msg) {
	a, ok := decodePresence(m.Data)
	if !ok {
		dec.refuse(refusedPresence, "presence with an invalid decider id, kind or size ignored")
		return
	}
	if a.ID == dec.cfg.ID {
		// Its own presence come back: the bus carries to it.
		dec.selfHeard.Store(dec.clock.Nanos(dec.cfg.Now()))
	}
	sh, ok := dec.peers.observeNew(a, dec.cfg.Now(), 3*dec.cfg.PresenceEvery)
	if !ok {
		dec.refuse(refusedPresence, "presence beyond the decider limit ignored", "decider", a.ID)
	}
	dec.setShares(sh)
}

// setShares puts the counted shares in force.
func (dec *Decider) setShares(sh shares) {
	live := sh.live
	if live == 1 && !sh.alone {
		live = 0 // not known yet: the others may not have announced themselves
	}
	dec.router.SetDeciders(live, sh.all, sh.per)
	dec.metrics.liveBrokers.Set(float64(sh.live))
}

// announcement is this decider's presence now: its kind and the tenants it
// admitted within the last minute (a bucket holds a minute's share).
func (dec *Decider) announcement() []byte {
	a := subjects.Presence{ID: dec.cfg.ID, Kind: subjects.PresenceGateway}
	if dec.peers.broker {
		a.Kind = subjects.PresenceBroker
	}
	a.Tenants = dec.router.ChargedSince(dec.cfg.Now().Add(-time.Minute), nil)
	if len(a.Tenants) > maxPresenceTenants {
		a.Tenants = a.Tenants[:maxPresenceTenants]
	}
	data, _ := json.Marshal(&a)
	return data
}

func (dec *Decider) presenceLoop(ctx interface{ Done() <-chan struct{} }) {
	t := time.NewTicker(dec.cfg.PresenceEvery)
	defer t.Stop()
	_ = dec.nc.Publish(dec.subj.BrokerPresence(), dec.announcement())
	var lag lagWatch
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = dec.nc.Publish(dec.subj.BrokerPresence(), dec.announcement())
			dec.setShares(dec.peers.observe(nil, dec.cfg.Now(), 3*dec.cfg.PresenceEvery))
			lag.check(dec)
		}
	}
}

// heartbeatsPendingHigh is the backlog on the heartbeat subscription the
// decider takes as its own lag: a few seconds of heartbeats from a
// thousand replicas.
const heartbeatsPendingHigh = 5000

// lagWatch decides, every presence period, whether the decider lags behind
// the bus, on evidence of its own: its presence has not come back to it
// within three periods (its process starved or paused, its link silent),
// or heartbeats wait to be handled. While it lags, the router takes the
// replicas' silence as its own (policy.Router.SetLagging), and a metric
// and one log line per episode say so. Owned by presenceLoop.
type lagWatch struct{ lagging bool }

func (w *lagWatch) check(dec *Decider) {
	now := dec.clock.Nanos(dec.cfg.Now())
	pending := dec.heartbeatsPending()
	echo := dec.selfHeard.Load()
	stale := echo != 0 && now-echo > int64(3*dec.cfg.PresenceEvery)
	lagging := stale || pending >= heartbeatsPendingHigh
	dec.router.SetLagging(lagging)
	switch {
	case lagging && !w.lagging:
		dec.metrics.observerLags.Inc()
		dec.log.Warn("this decider lags behind the bus: the replicas' silence meanwhile is taken as its own, and they are kept",
			"own_presence_age", time.Duration(now-echo).Round(time.Millisecond), "heartbeats_pending", pending)
	case !lagging && w.lagging:
		dec.log.Info("this decider keeps up with the bus again")
	}
	w.lagging = lagging
}

// heartbeatsPending is the backlog on the heartbeat subscription (0
// before Start and after Stop).
func (dec *Decider) heartbeatsPending() int {
	dec.runMu.Lock()
	defer dec.runMu.Unlock()
	if len(dec.subs) == 0 {
		return 0
	}
	n, _, _ := dec.subs[0].Pending()
	return max(n, 0)
}

// onLoadStatus takes a loader's progress report on a cold model, so that
// model_loading's Retry-After is the time the load has left.
func (dec *Decider) onLoadStatus(m *nats.Msg) {
	var st subjects.LoadStatus
	if len(m.Data) > maxLoadStatusBytes || json.Unmarshal(m.Data, &st) != nil || len(st.Model) > subjects.MaxModelChars {
		dec.metrics.badMessages.WithLabelValues("load_status").Inc()
		return
	}
	dec.router.ObserveLoad(&st, dec.cfg.Now())
}

// maxLoadStatusBytes bounds a load status (its error text included).
const maxLoadStatusBytes = 16 << 10

// refuse counts a message refused for what it claims, and logs the first
// of each kind: a flood of forgeries must not become a flood of log lines.
func (dec *Decider) refuse(kind, msg string, args ...any) {
	dec.metrics.refused.WithLabelValues(kind).Inc()
	dec.warnOnce(kind, msg, args...)
}

// refuseUnregistered counts a message (what: heartbeat, load delta,
// KV-cache update) of a replica not registered in the table, and logs, once
// a process as every refusal kind, the first replica that stays
// unregistered past unregisteredGrace: a new replica's messages may come
// before its registration. Its own log key keeps another refusal counted
// under the same metric label from silencing it.
func (dec *Decider) refuseUnregistered(what, replica string) {
	dec.metrics.refused.WithLabelValues(refusedReplica).Inc()
	if waited, late := dec.unregistered.late(replica, dec.cfg.Now()); late {
		dec.warnOnceAs("unregistered", refusedReplica, what+" of a replica not registered in the table ignored",
			"replica", clip.Text(replica, 128), "unregistered_for", waited.Round(time.Second))
	}
}

// warnOnce logs the first refusal of each kind.
func (dec *Decider) warnOnce(kind, msg string, args ...any) { dec.warnOnceAs(kind, kind, msg, args...) }

// warnOnceAs logs the first refusal under key, labelled kind.
func (dec *Decider) warnOnceAs(key, kind, msg string, args ...any) {
	if _, logged := dec.logged.LoadOrStore(key, true); !logged {
		dec.log.Warn(msg+" (logged once; see switchyard_broker_refused_messages_total)", append(args, "kind", kind)...)
	}
}

// RefuseReply counts, and logs once, a request dropped for a reply subject
// outside the reply space: an attack, not a client.
func (dec *Decider) RefuseReply(reply string) {
	dec.refuse(refusedReply, "request with a reply subject outside the reply space dropped", "reply", clip.Text(reply, 128))
}

// InReplySpace reports whether reply is a subject a decider may answer on.
func (dec *Decider) InReplySpace(reply string) bool { return dec.subj.InReplySpace(reply) }
