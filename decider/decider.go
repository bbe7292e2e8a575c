// Package decider is what a part needs to route a request in its own
// process: the load view built from heartbeats, the placements, quota
// reservations and in-flight counts shared with every other decider, the
// presence that divides quotas between them, and the request path that
// turns a request into a decision (broker/policy) and the message for the
// chosen replica. A gateway decides a typed Request (Decide); a broker
// decodes one from a message's headers first (Handle). Brokers and
// gateways both decide with it; neither imports the other.
package decider

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/internal/monotime"
	"github.com/switchyard-llm/switchyard/internal/stages"
	"github.com/switchyard-llm/switchyard/internal/telemetry"
	"github.com/switchyard-llm/switchyard/owners"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// Config configures a decider. Only the zero-value defaults noted are
// applied; the owner (a broker or a gateway) validated the values.
type Config struct {
	// ID names this decider: a broker's id or a gateway's. It is the
	// Llm-Broker of what it reserves and publishes (default: a NUID).
	ID string
	// Prefix is the subject prefix (default "llm").
	Prefix string
	// Region is the region this decider decides in: its replicas are
	// chosen first (policy.Config.Region). Empty: no region.
	Region string
	// OwnersBucket remembers which replica holds each stored response
	// (default owners.DefaultBucket).
	OwnersBucket string
	// PresenceEvery is how often the decider announces itself so deciders
	// can count each other for quota shares (default 1s).
	PresenceEvery time.Duration
	Logger        *slog.Logger
	// Component names the part in logs ("broker" or "gateway").
	Component string
	// TracerProvider receives the decision spans (nil: none are made).
	TracerProvider trace.TracerProvider
	// Registerer receives the decision metrics (nil: none), labelled
	// broker=<ID> whichever part decides.
	Registerer prometheus.Registerer
	// Now is the clock (default time.Now); tests may replace it.
	Now func() time.Time
	// Stages, when set, records the stage timestamps of a sample of the
	// requests (internal/stages); nil records nothing.
	Stages *stages.Recorder
	// Owners reads the stored-response owners (nil: a reader of
	// OwnersBucket).
	Owners *owners.Store
	// BudgetsBucket holds the budgets' spend (default
	// subjects.BudgetsBucket); LeaseTTL is how long a lease on it outlives
	// this decider (default budget.DefaultLeaseTTL).
	BudgetsBucket string
	LeaseTTL      time.Duration
}

// Decider decides requests and keeps the shared deciding state. Create it
// with New, feed it the table with SetTable and start it with Start.
type Decider struct {
	nc  *nats.Conn
	cfg Config
	// away is when the decider's current absence from the bus began
	// (unix ns; 0: connected), as watchConnection reckons it.
	away atomic.Int64
	subj subjects.Subjects
	// direct is the prefix of the direct clients' subjects, llm.route.
	direct string
	// batch is the prefix of the batchers' subjects, llm.batch.
	batch   string
	log     *slog.Logger
	tracer  trace.Tracer // nil: no spans
	router  *policy.Router
	owners  *owners.Store
	metrics *metrics
	budgets *budgets
	out     chan outMsg
	// rng draws the decisions' random choices, inside Router.Decide under
	// the router's lock: requests are decided on several goroutines.
	rng     *rand.Rand
	scratch sync.Pool
	peers   presence
	health  health
	heard   heard
	logged  sync.Map // refused-message kinds already logged
	// unregistered times the refusals of replicas not (yet) in the table.
	unregistered unregistered
	// clock dates kvSyncAt and selfHeard on the monotonic clock: a step
	// of the wall clock is not a silence of the bus.
	clock monotime.Scale
	// kvSyncAt is when this decider last asked adapters to resend their
	// engines' keys (llm.kvsync), on clock.
	kvSyncAt atomic.Int64
	// selfHeard is when its own presence last came back to it (on clock;
	// 0: not yet): the evidence that the bus carries to it (lagWatch).
	selfHeard atomic.Int64

	runMu  sync.Mutex // guards subs and cancel
	subs   []*nats.Subscription
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type outMsg struct {
	subject string
	data    any
}

// New returns a decider bound to nc.
func New(nc *nats.Conn, cfg Config) (*Decider, error) {
	if nc == nil {
		return nil, errors.New("decider: nil NATS connection")
	}
	if cfg.ID == "" {
		cfg.ID = nuid.Next()
	}
	if cfg.PresenceEvery <= 0 {
		cfg.PresenceEvery = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Component == "" {
		cfg.Component = "broker"
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	subj := subjects.New(cfg.Prefix)
	dec := &Decider{
		nc:     nc,
		cfg:    cfg,
		subj:   subj,
		direct: subj.Route(""),
		batch:  subj.Batch(""),
		log:    telemetry.Logger(cfg.Logger).With("component", cfg.Component, cfg.Component, cfg.ID),
		tracer: telemetry.Tracer(cfg.TracerProvider, "github.com/switchyard-llm/switchyard/broker"),
		out:    make(chan outMsg, 4096),
		rng:    rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0x5eed)),
		clock:  monotime.New(),
	}
	dec.router = policy.New(policy.Config{Self: cfg.ID, Region: cfg.Region, OnEject: dec.ejected})
	dec.router.SetDeciders(0, 1, nil) // alone or not, presence will tell (setShares)
	dec.metrics = newMetrics(cfg.Registerer, dec)
	dec.scratch.New = func() any { return NewScratch() }
	dec.peers.init(cfg.ID, cfg.Component == "broker")
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	dec.budgets = newBudgets(js, &dec.cfg, dec.log, cfg.Registerer, dec.budgetCrossed)
	dec.owners = cfg.Owners
	if dec.owners == nil {
		dec.owners = owners.NewReader(js, cfg.OwnersBucket)
	}
	return dec, nil
}

// ID is this decider's id.
func (dec *Decider) ID() string { return dec.cfg.ID }

// Router exposes the policy state (for the dashboard and tests).
func (dec *Decider) Router() *policy.Router { return dec.router }

// Table returns the routing table in force (nil before the first load).
func (dec *Decider) Table() *table.Snapshot { return dec.router.Table() }

// SetTable puts s in force; it is the table watcher's OnSnapshot.
func (dec *Decider) SetTable(s *table.Snapshot) {
	dec.router.SetTable(s)
	dec.metrics.tableLoaded(s, dec.cfg.Now())
}

// InvalidValue counts a table value refused as invalid; it is the table
// watcher's OnInvalid.
func (dec *Decider) InvalidValue(key string, err error) { dec.metrics.invalidValue(key, err) }

// Start opens the subscriptions every decider needs and starts publishing
// (decisions, placements, presence) until ctx ends or Stop.
func (dec *Decider) Start(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	subs, err := dec.subscribe()
	dec.runMu.Lock()
	dec.subs, dec.cancel = subs, cancel
	dec.runMu.Unlock()
	if err != nil {
		dec.Stop()
		return err
	}
	dec.wg.Go(func() { dec.publishLoop(ctx) })
	dec.wg.Go(func() { dec.presenceLoop(ctx) })
	dec.wg.Go(func() { dec.budgets.run(ctx) })
	if dec.cfg.Region != "" {
		dec.wg.Go(func() { dec.rttLoop(ctx) })
	}
	// A lost connection goes RECONNECTING (or DISCONNECTED first), then
	// CONNECTED once back; the listener is registered before Start
	// returns, so no reconnect after it goes unseen.
	status := dec.nc.StatusChanged(nats.DISCONNECTED, nats.RECONNECTING, nats.CONNECTED)
	dec.wg.Go(func() { dec.watchConnection(ctx, status) })
	// A decider that starts after the fleet asks the adapters with a
	// KV-event feed for what their engines hold.
	dec.requestKVSync()
	return nil
}

// lostWindow bounds how long before a lost connection is noticed its
// silence can have begun: the liveness check gives a silent server up
// within 2 s, and heartbeats come every second.
const lostWindow = 5 * time.Second

// watchConnection keeps the load view through the decider's own
// reconnects until ctx ends: the heartbeats it missed while away say
// nothing of the replicas, so their silence is counted without the absence
// (policy.Router.Reconnected), rather than every replica looking dead at
// once; and it asks the adapters with a feed to resend what their engines
// hold. The absence began when the decider last heard a heartbeat, at most
// lostWindow before it noticed the loss: a fleet silent longer than that
// before the loss was silent on its own, and its silence still counts.
func (dec *Decider) watchConnection(ctx context.Context, status chan nats.Status) {
	defer dec.nc.RemoveStatusListener(status)
	var lost time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case st, ok := <-status:
			if !ok {
				return
			}
			switch {
			case st != nats.CONNECTED && lost.IsZero():
				now := dec.cfg.Now()
				lost = dec.router.LastHeard()
				if lost.Before(now.Add(-lostWindow)) {
					lost = now.Add(-lostWindow)
				}
				dec.away.Store(lost.UnixNano())
			case st == nats.CONNECTED && !lost.IsZero():
				dec.router.Reconnected(lost, dec.cfg.Now())
				// The others' presence comes back over a second or so: not
				// alone until it had the time to.
				dec.peers.rewatch()
				dec.setShares(dec.peers.observe(nil, dec.cfg.Now(), 3*dec.cfg.PresenceEvery))
				lost = time.Time{}
				dec.away.Store(0)
				dec.requestKVSync()
			}
		}
	}
}

// Stop closes the subscriptions and waits for the publishers.
func (dec *Decider) Stop() {
	dec.runMu.Lock()
	subs, cancel := dec.subs, dec.cancel
	dec.subs = nil
	dec.runMu.Unlock()
	for _, s := range subs {
		_ = s.Unsubscribe()
	}
	if cancel != nil {
		cancel()
	}
	dec.wg.Wait()
}

// subscribe opens the plain subscriptions every decider needs: each must
// see every heartbeat, load delta, placement and usage event, so none is a queue
// subscription. The heartbeats' is the first (heartbeatsPending reads it).
func (dec *Decider) subscribe() ([]*nats.Subscription, error) {
	var subs []*nats.Subscription
	for _, s := range []struct {
		subject string
		h       nats.MsgHandler
	}{
		{dec.subj.HeartbeatAll(), dec.onHeartbeat},
		{dec.subj.LoadAll(), dec.onLoad},
		{dec.subj.PlacementAll(), dec.onPlacement},
		{dec.subj.UsageAll(), dec.onUsage},
		{dec.subj.BrokerPresence(), dec.onPresence},
		{dec.subj.ControlLoadStatus(), dec.onLoadStatus},
		{dec.subj.KVAll(), dec.onKV},
	} {
		sub, err := dec.nc.Subscribe(s.subject, s.h)
		if err != nil {
			return subs, err
		}
		_ = sub.SetPendingLimits(-1, -1)
		subs = append(subs, sub)
	}
	return subs, nil
}

// publishLoop sends decisions and placements off the request path.
func (dec *Decider) publishLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-dec.out:
			data, err := encode(m.data)
			if err != nil {
				dec.log.Warn("encode", "subject", m.subject, "err", err)
				continue
			}
			msg := nats.NewMsg(m.subject)
			msg.Header.Set(subjects.HdrBroker, dec.cfg.ID)
			msg.Data = data
			_ = dec.nc.PublishMsg(msg)
		}
	}
}

// enqueue hands a message to publishLoop without blocking the request path.
func (dec *Decider) enqueue(subject string, v any) {
	select {
	case dec.out <- outMsg{subject: subject, data: v}:
	default:
		dec.metrics.publishDropped.Inc()
	}
}
