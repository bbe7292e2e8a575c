package decider

import (
	"encoding/json"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/subjects"
)

func encode(v any) ([]byte, error) { return json.Marshal(v) }

func (b *Decider) onHeartbeat(m *nats.Msg) {
	var hb subjects.Heartbeat
	unhealthy, err := decodeHeartbeat(m.Subject, m.Data, &hb)
	if err != nil {
		b.metrics.badMessages.WithLabelValues("heartbeat").Inc()
		return
	}
	// Only a replica registered in the table is routed to or measured:
	// heartbeats of made-up replicas would otherwise grow the load view
	// and the metric series without bound.
	if t := b.router.Table(); t == nil || t.Replicas[hb.Replica] == nil {
		b.refuse(refusedReplica, "heartbeat of a replica not registered in the table ignored", "replica", hb.Replica)
		return
	}
	if unhealthy {
		b.metrics.unhealthy.WithLabelValues(hb.Replica).Inc()
	}
	// A replica that is not ready says nothing of its engine's health
	// while it fails its scrapes (loading, draining): only a good scrape
	// clears an exclusion.
	if (unhealthy || hb.ScrapeOK) && b.health.changed(hb.Replica, unhealthy) {
		if unhealthy {
			b.log.Warn("replica excluded: its engine fails health checks (scrape_ok=false)", "replica", hb.Replica)
		} else {
			b.log.Info("replica healthy again", "replica", hb.Replica)
		}
	}
	b.heard.add(hb.Replica)
	now := b.cfg.Now()
	b.router.ObserveHeartbeat(&hb, now)
	if hb.KVEvents && !b.router.KVSynced(hb.Replica) {
		// A feed this decider does not hold exactly (it started late, or
		// an update was refused): ask for it again, at most once a second.
		b.requestKVSync()
	}
	b.metrics.heartbeat(&hb, now)
}

func (b *Decider) onPlacement(m *nats.Msg) {
	if m.Header.Get(subjects.HdrBroker) == b.cfg.ID {
		return
	}
	var p subjects.Placement
	if err := json.Unmarshal(m.Data, &p); err != nil {
		b.metrics.badMessages.WithLabelValues("placement").Inc()
		return
	}
	b.router.ObservePlacement(&p)
}

func (b *Decider) onUsage(m *nats.Msg) {
	// Usage reserved by another broker is skipped before it is decoded.
	if id := m.Header.Get(subjects.HdrBroker); id != "" && id != b.cfg.ID {
		return
	}
	var u subjects.Usage
	if len(m.Data) > maxUsageBytes || json.Unmarshal(m.Data, &u) != nil {
		b.metrics.badMessages.WithLabelValues("usage").Inc()
		return
	}
	if u.Broker != "" && u.Broker != b.cfg.ID {
		return
	}
	// Only a reservation this broker holds is settled, once, for its own
	// tenant and at most what it reserved.
	if !b.router.ObserveUsage(&u, b.cfg.Now()) {
		b.refuse(refusedUsage, "usage without a reservation held by this broker ignored", "request", u.RequestID)
	}
}

// maxUsageBytes bounds a usage event (a few hundred bytes when honest).
const maxUsageBytes = 4 << 10

// presence counts live brokers from their announcements, so each enforces
// its share (limit ÷ live brokers) of a tenant quota.
type presence struct {
	mu   sync.Mutex
	self string
	seen map[string]time.Time
}

func (p *presence) init(self string) {
	p.self = self
	p.seen = map[string]time.Time{}
}

// observe records id and returns the number of brokers seen within ttl.
func (p *presence) observe(id string, now time.Time, ttl time.Duration) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if id != "" {
		p.seen[id] = now
	}
	n := 1 // self
	for k, t := range p.seen {
		switch {
		case k == p.self:
		case now.Sub(t) > ttl:
			delete(p.seen, k)
		default:
			n++
		}
	}
	return n
}

// maxBrokers bounds the brokers counted: quota shares are limit ÷ live
// brokers, so made-up presences must not shrink them without bound.
const maxBrokers = 256

// observeNew is observe for an announcement: a broker not yet seen is
// counted only while fewer than maxBrokers are.
func (p *presence) observeNew(id string, now time.Time, ttl time.Duration) (int, bool) {
	p.mu.Lock()
	_, known := p.seen[id]
	full := !known && len(p.seen) >= maxBrokers
	p.mu.Unlock()
	if full {
		return p.observe("", now, ttl), false
	}
	return p.observe(id, now, ttl), true
}

// LiveBrokers is the number of brokers this one counts for quota shares.
func (b *Decider) LiveBrokers() int {
	return b.peers.observe("", b.cfg.Now(), 3*b.cfg.PresenceEvery)
}

func (b *Decider) onPresence(m *nats.Msg) {
	id := string(m.Data)
	if subjects.ValidToken(id) != nil {
		b.refuse(refusedPresence, "presence with an invalid broker id ignored")
		return
	}
	n, ok := b.peers.observeNew(id, b.cfg.Now(), 3*b.cfg.PresenceEvery)
	if !ok {
		b.refuse(refusedPresence, "presence beyond the broker limit ignored", "broker", id)
	}
	b.router.SetLiveBrokers(n)
	b.metrics.liveBrokers.Set(float64(n))
}

func (b *Decider) presenceLoop(ctx interface{ Done() <-chan struct{} }) {
	t := time.NewTicker(b.cfg.PresenceEvery)
	defer t.Stop()
	_ = b.nc.Publish(b.subj.BrokerPresence(), []byte(b.cfg.ID))
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = b.nc.Publish(b.subj.BrokerPresence(), []byte(b.cfg.ID))
			n := b.peers.observe("", b.cfg.Now(), 3*b.cfg.PresenceEvery)
			b.router.SetLiveBrokers(n)
		}
	}
}

// onLoadStatus takes a loader's progress report on a cold model, so that
// model_loading's Retry-After is the time the load has left.
func (b *Decider) onLoadStatus(m *nats.Msg) {
	var st subjects.LoadStatus
	if len(m.Data) > maxLoadStatusBytes || json.Unmarshal(m.Data, &st) != nil || len(st.Model) > subjects.MaxModelChars {
		b.metrics.badMessages.WithLabelValues("load_status").Inc()
		return
	}
	b.router.ObserveLoad(&st, b.cfg.Now())
}

// maxLoadStatusBytes bounds a load status (its error text included).
const maxLoadStatusBytes = 16 << 10

// refuse counts a message refused for what it claims, and logs the first
// of each kind: a flood of forgeries must not become a flood of log lines.
func (b *Decider) refuse(kind, msg string, args ...any) {
	b.metrics.refused.WithLabelValues(kind).Inc()
	if _, logged := b.logged.LoadOrStore(kind, true); !logged {
		b.log.Warn(msg+" (logged once; see switchyard_broker_refused_messages_total)", append(args, "kind", kind)...)
	}
}

// RefuseReply counts, and logs once, a request dropped for a reply subject
// outside the reply space: an attack, not a client.
func (b *Decider) RefuseReply(reply string) {
	b.refuse(refusedReply, "request with a reply subject outside the reply space dropped", "reply", truncate(reply, 128))
}

// InReplySpace reports whether reply is a subject a decider may answer on.
func (b *Decider) InReplySpace(reply string) bool { return b.subj.InReplySpace(reply) }
