// Package ui is Switchyard's live dashboard: the replicas with their KV usage,
// cached prefix blocks (from an exact index of the engines' KV-cache
// events, as deciders keep it) and queues, cold models' loads, the routing table and the latest explained
// decisions, pushed to
// the browser as Server-Sent Events. The page is plain HTML, CSS and
// JavaScript embedded in the binary: no build step, nothing fetched from
// elsewhere.
package ui

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/broker/policy/kvindex"
	"github.com/switchyard-llm/switchyard/internal/kvevents"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
	"github.com/switchyard-llm/switchyard/table/kv"
)

// Defaults of Config.
const (
	DefaultInterval     = 500 * time.Millisecond
	DefaultMaxDecisions = 200
	DefaultClientBuffer = 8
)

// forgetAfter drops a replica that stopped heartbeating and is no longer in
// the table, so a dashboard left open does not collect ghosts.
const forgetAfter = 5 * time.Minute

// Config configures the dashboard. Only the zero values noted have defaults.
type Config struct {
	// Prefix is the subject prefix (default "llm").
	Prefix string
	// Bucket is the routing-table bucket, watched by the dashboard itself
	// when Table is nil (default subjects.DefaultBucket).
	Bucket string
	// Table returns the routing table in force, e.g. (*gateway.Gateway).Table.
	// Nil: Run watches Bucket.
	Table func() *table.Snapshot
	// Logger receives subscription trouble (nil: discarded).
	Logger *slog.Logger
	// Interval is the shortest time between two pushes (default 500ms).
	Interval time.Duration
	// MaxDecisions is how many recent decisions are kept (default 200).
	MaxDecisions int
	// ClientBuffer is how many pushes may wait for one browser (default 8);
	// a browser further behind is disconnected, and its EventSource
	// reconnects to a fresh snapshot.
	ClientBuffer int
}

// UI holds the dashboard's state and serves it.
type UI struct {
	nc   *nats.Conn
	cfg  Config
	subj subjects.Subjects
	log  *slog.Logger

	// mu guards everything below. Broadcasts and client registration both
	// hold it, so a new client's full snapshot and the deltas after it
	// never miss or repeat a decision.
	mu        sync.Mutex
	replicas  map[string]heartbeatSeen
	ejections map[string]subjects.Ejection // the latest by replica
	ring      []decisionView               // len MaxDecisions once full; next is the oldest
	next      int
	seq       uint64 // decisions received
	pushedSeq uint64 // decisions already pushed to clients
	pushedRev uint64 // table revision already pushed
	dirty     bool   // a heartbeat arrived since the last push
	clients   map[*client]struct{}
	loads     map[string]loadSeen // model → its latest load status
	stopped   bool
	table     func() *table.Snapshot
	// kv is the exact prefix index the adapters' KV-cache key updates
	// build: the cached blocks per replica.
	kv *kvindex.Index

	kvSyncAt atomic.Int64 // unix ns of the last llm.kvsync sent
}

type loadSeen struct {
	st subjects.LoadStatus
	at time.Time
}

// maxLoads bounds the models whose load status is kept.
const maxLoads = 1024

type heartbeatSeen struct {
	hb subjects.Heartbeat
	at time.Time // receiver's clock: the dashboard shows how long since it heard
}

// New returns a dashboard bound to nc; call Run to start it.
func New(nc *nats.Conn, cfg Config) *UI {
	if cfg.Bucket == "" {
		cfg.Bucket = subjects.DefaultBucket
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.MaxDecisions <= 0 {
		cfg.MaxDecisions = DefaultMaxDecisions
	}
	if cfg.ClientBuffer <= 0 {
		cfg.ClientBuffer = DefaultClientBuffer
	}
	u := &UI{
		nc: nc, cfg: cfg, subj: subjects.New(cfg.Prefix),
		log:       cfg.Logger.With("component", "ui"),
		replicas:  map[string]heartbeatSeen{},
		ejections: map[string]subjects.Ejection{},
		clients:   map[*client]struct{}{},
		loads:     map[string]loadSeen{},
		table:     cfg.Table,
		kv:        kvindex.New(),
	}
	if u.table == nil {
		u.table = func() *table.Snapshot { return nil }
	}
	return u
}

// Run subscribes to heartbeats and decisions (plain subscriptions: the
// dashboard wants every one) and pushes changes to the browsers until ctx is
// done. Then it disconnects every browser and returns nil.
func (u *UI) Run(ctx context.Context) error {
	if u.nc == nil {
		return errors.New("ui: nil NATS connection")
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer u.stop()

	if u.cfg.Table == nil {
		js, err := jetstream.New(u.nc)
		if err != nil {
			return err
		}
		w := kv.New(js, kv.Config{Bucket: u.cfg.Bucket, Logger: u.log})
		u.mu.Lock()
		u.table = w.Snapshot
		u.mu.Unlock()
		wg.Go(func() {
			if err := w.Run(ctx); err != nil {
				u.log.Error("table watcher stopped", "err", err)
			}
		})
	}
	hbSub, err := u.nc.Subscribe(u.subj.HeartbeatAll(), u.onHeartbeat)
	if err != nil {
		return err
	}
	defer func() { _ = hbSub.Unsubscribe() }()
	decSub, err := u.nc.Subscribe(u.subj.DecisionAll(), u.onDecision)
	if err != nil {
		return err
	}
	defer func() { _ = decSub.Unsubscribe() }()
	ejSub, err := u.nc.Subscribe(u.subj.EjectAll(), u.onEjection)
	if err != nil {
		return err
	}
	defer func() { _ = ejSub.Unsubscribe() }()
	loadSub, err := u.nc.Subscribe(u.subj.ControlLoadStatus(), u.onLoadStatus)
	if err != nil {
		return err
	}
	defer func() { _ = loadSub.Unsubscribe() }()
	kvSub, err := u.nc.Subscribe(u.subj.KVAll(), u.onKV)
	if err != nil {
		return err
	}
	defer func() { _ = kvSub.Unsubscribe() }()
	// What the engines already hold: the adapters resend it.
	u.requestKVSync()

	t := time.NewTicker(u.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			u.push(now)
		}
	}
}

// tableSnapshot is the routing table in force, read under mu (Run swaps
// the function when it watches the bucket itself).
func (u *UI) tableSnapshot() *table.Snapshot {
	u.mu.Lock()
	f := u.table
	u.mu.Unlock()
	return f()
}

// Bounds on what the dashboard keeps: a decision larger than
// maxDecisionBytes (an honest one is a few KB) or a heartbeat larger than
// maxHeartbeatBytes (the broker's bound) is not kept, and at most
// maxReplicas replicas are shown.
const (
	maxDecisionBytes  = 16 << 10
	maxHeartbeatBytes = 64 << 10
	maxReplicas       = 4096
)

func (u *UI) onHeartbeat(m *nats.Msg) {
	var hb subjects.Heartbeat
	if len(m.Data) > maxHeartbeatBytes {
		return
	}
	if err := json.Unmarshal(m.Data, &hb); err != nil || subjects.ValidToken(hb.Replica) != nil {
		u.log.Debug("bad heartbeat", "subject", m.Subject, "err", err)
		return
	}
	if hb.KVEventsRefused != "" && !kvevents.IsRefusal(hb.KVEventsRefused) {
		hb.KVEventsRefused = "" // shown only as a reason an adapter can send
	}
	now := time.Now()
	u.mu.Lock()
	defer u.mu.Unlock()
	if _, known := u.replicas[hb.Replica]; !known && len(u.replicas) >= maxReplicas {
		// Forget replicas silent for a minute; past the bound a new one
		// is not shown.
		for id, h := range u.replicas {
			if now.Sub(h.at) > time.Minute {
				delete(u.replicas, id)
				u.kv.Remove(id)
			}
		}
		if len(u.replicas) >= maxReplicas {
			return
		}
	}
	u.replicas[hb.Replica] = heartbeatSeen{hb: hb, at: now}
	if !hb.KVEvents && u.kv.Keys(hb.Replica) > 0 {
		// Its feed is lost: the keys held are not exact any more, as
		// every decider concludes.
		u.kv.Drop(hb.Replica)
	}
	u.dirty = true
}

// onEjection keeps the latest ejection of each replica (brokers eject on
// the same heartbeats, so theirs agree to within a heartbeat), for at most
// maxReplicas replicas, as heartbeats: an ejection of a replica no
// heartbeat names is only forgotten when the list shows it.
func (u *UI) onEjection(m *nats.Msg) {
	var e subjects.Ejection
	if err := json.Unmarshal(m.Data, &e); err != nil || subjects.ValidToken(e.Replica) != nil {
		u.log.Debug("bad ejection", "subject", m.Subject, "err", err)
		return
	}
	u.mu.Lock()
	last, known := u.ejections[e.Replica]
	if e.UntilUnixMs > last.UntilUnixMs && (known || len(u.ejections) < maxReplicas) {
		u.ejections[e.Replica] = e
		u.dirty = true
	}
	u.mu.Unlock()
}

// onLoadStatus keeps each cold model's latest load status.
func (u *UI) onLoadStatus(m *nats.Msg) {
	var st subjects.LoadStatus
	if err := json.Unmarshal(m.Data, &st); err != nil || !table.ValidName(st.Model) {
		u.log.Debug("bad load status", "err", err)
		return
	}
	u.mu.Lock()
	if _, ok := u.loads[st.Model]; ok || len(u.loads) < maxLoads {
		u.loads[st.Model] = loadSeen{st: st, at: time.Now()}
		u.dirty = true
	}
	u.mu.Unlock()
}

func (u *UI) onDecision(m *nats.Msg) {
	var d subjects.Decision
	// Each kept decision is at most maxDecisionBytes, so the ring is
	// bounded in bytes as well as in number.
	if len(m.Data) > maxDecisionBytes {
		return
	}
	if err := json.Unmarshal(m.Data, &d); err != nil {
		u.log.Debug("bad decision", "subject", m.Subject, "err", err)
		return
	}
	u.mu.Lock()
	u.seq++
	v := decisionView{Seq: u.seq, Decision: d}
	if len(u.ring) < u.cfg.MaxDecisions {
		u.ring = append(u.ring, v)
	} else {
		u.ring[u.next] = v
		u.next = (u.next + 1) % len(u.ring)
	}
	u.mu.Unlock()
}

// decisionsAfter returns the kept decisions with Seq > after, newest first.
// Lock should be held.
func (u *UI) decisionsAfter(after uint64) []decisionView {
	out := []decisionView{}
	n := len(u.ring)
	for i := 1; i <= n; i++ {
		v := u.ring[(u.next-i+n)%n]
		if v.Seq <= after {
			break
		}
		out = append(out, v)
	}
	return out
}
