// Package broker is the deciding service: a micro service in the queue
// group switchyard-broker that takes the requests of direct tenants
// (llm.route), batchers (llm.batch) and gateways that leave deciding to it
// (llm.gw), decides each with the shared deciding state (package decider)
// and forwards the untouched body to the chosen replica with the original
// reply subject, so the answer goes straight back to the sender.
// Rejections are answered here.
package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/budget"
	"github.com/switchyard-llm/switchyard/decider"
	"github.com/switchyard-llm/switchyard/internal/check"
	"github.com/switchyard-llm/switchyard/internal/stages"
	"github.com/switchyard-llm/switchyard/internal/telemetry"
	"github.com/switchyard-llm/switchyard/owners"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
	"github.com/switchyard-llm/switchyard/table/kv"
)

// Config configures a broker. Only the zero-value defaults noted are applied.
type Config struct {
	// ID names this broker instance (default: a NUID).
	ID string
	// Prefix is the subject prefix (default "llm").
	Prefix string
	// Region is the region this broker decides in (--region): it chooses
	// among that region's replicas first (broker/policy, "Regions"), and
	// reads the routing table from the region's copy of Bucket when there
	// is one (kv.Config.Region). Empty: no region, every replica alike.
	Region string
	// Bucket is the routing-table KV bucket (default "llm-routing").
	Bucket string
	// OwnersBucket remembers which replica holds each stored response
	// (default owners.DefaultBucket).
	OwnersBucket string
	// StateDir keeps the last good table, loaded when the bucket cannot be read.
	StateDir string
	// PresenceEvery is how often the broker announces itself so brokers can
	// count each other for quota shares (default 1s).
	PresenceEvery time.Duration
	// WarmUp bounds how long a starting broker waits, before it joins the
	// queue group, for a heartbeat from every replica its table has ready
	// (default 2s, negative: no wait; at most a minute).
	WarmUp time.Duration
	Logger *slog.Logger
	// TracerProvider receives the decision spans (nil: none are made;
	// internal/telemetry builds one from the environment).
	TracerProvider trace.TracerProvider
	// Stages, when set, records the stage timestamps of a sample of the
	// requests (internal/stages); nil records nothing.
	Stages *stages.Recorder
	// Registerer receives the broker's metrics (nil: none).
	Registerer prometheus.Registerer
	// Now is the clock (default time.Now); tests may replace it.
	Now func() time.Time
	// LeaseTTL is how long this broker's leases on budgets outlive it
	// when it dies (default budget.DefaultLeaseTTL).
	LeaseTTL time.Duration
	// owners replaces the stored-response owners' reader (tests).
	owners *owners.Store
}

// Broker routes requests. Create it with New and start it with Run.
type Broker struct {
	nc      *nats.Conn
	cfg     Config
	subj    subjects.Subjects
	log     *slog.Logger
	dec     *decider.Decider
	watcher *kv.Watcher
	handled atomic.Uint64 // route messages handled, watched by stop
	// lookups holds a token per request finished on a goroutine of its own
	// (route.go, lookUp); stop sets stopping and waits for lookupsRunning.
	lookups        chan struct{}
	lookupsRunning sync.WaitGroup
	lookMu         sync.Mutex // guards stopping, and lookupsRunning.Add against Wait
	stopping       bool
}

// Validate range-checks cfg without connecting to anything. Zero values
// stand for their defaults; errors name the flag that sets the value.
func (c *Config) Validate() error {
	var idErr error
	if c.ID != "" {
		idErr = check.Wrap("id", c.ID, subjects.ValidToken(c.ID))
	}
	var prefixErr error
	if c.Prefix != "" {
		prefixErr = check.Wrap("prefix", c.Prefix, subjects.ValidToken(c.Prefix))
	}
	return check.All(
		idErr, prefixErr, regionErr(c.Region),
		check.Duration("presence-every", c.PresenceEvery, 0, time.Minute),
		check.Duration("warm-up", c.WarmUp, math.MinInt64, time.Minute),
		leaseErr(c.LeaseTTL),
	)
}

// regionErr checks a --region: unset, or a token.
func regionErr(r string) error {
	if r == "" {
		return nil
	}
	return check.Wrap("region", r, subjects.ValidToken(r))
}

// leaseErr checks a budget lease TTL: unset, or 1s to 10m.
func leaseErr(d time.Duration) error {
	if d == 0 {
		return nil
	}
	return check.Duration("budget-lease-ttl", d, time.Second, 10*time.Minute)
}

// New validates cfg and returns a broker bound to nc.
func New(nc *nats.Conn, cfg Config) (*Broker, error) {
	if nc == nil {
		return nil, errors.New("broker: nil NATS connection")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.ID == "" {
		cfg.ID = nuid.Next()
	}
	if cfg.Bucket == "" {
		cfg.Bucket = subjects.DefaultBucket
	}
	if cfg.WarmUp == 0 {
		cfg.WarmUp = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	dec, err := decider.New(nc, decider.Config{
		ID: cfg.ID, Prefix: cfg.Prefix, Region: cfg.Region, OwnersBucket: cfg.OwnersBucket, PresenceEvery: cfg.PresenceEvery,
		Logger: cfg.Logger, Component: "broker", TracerProvider: cfg.TracerProvider, Registerer: cfg.Registerer,
		Now: cfg.Now, Stages: cfg.Stages, Owners: cfg.owners, LeaseTTL: cfg.LeaseTTL,
	})
	if err != nil {
		return nil, err
	}
	b := &Broker{
		nc:      nc,
		cfg:     cfg,
		subj:    subjects.New(cfg.Prefix),
		log:     telemetry.Logger(cfg.Logger).With("component", "broker", "broker", cfg.ID),
		dec:     dec,
		lookups: make(chan struct{}, MaxOwnerLookups),
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	b.watcher = kv.New(js, kv.Config{
		Bucket:     cfg.Bucket,
		Region:     cfg.Region,
		StateDir:   cfg.StateDir,
		Logger:     b.log,
		OnSnapshot: dec.SetTable,
		OnInvalid:  dec.InvalidValue,
	})
	if cfg.Registerer != nil {
		// Labelled as the decider's series are: brokers may share a registry.
		prometheus.WrapRegistererWith(prometheus.Labels{"broker": cfg.ID}, cfg.Registerer).MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "switchyard_broker_table_unreachable_seconds",
			Help: "How long the routing table's bucket has been out of reach, the last good table staying in force (0: in reach); a region cut off from the bucket's says so here.",
		}, func() float64 { return b.watcher.Unreachable().Seconds() }))
	}
	return b, nil
}

// TableUnreachable is how long the table's bucket has been out of reach,
// the last good table staying in force (0: in reach).
func (b *Broker) TableUnreachable() time.Duration { return b.watcher.Unreachable() }

// TableSource says where the table in force came from: kv.SourceKV, or
// kv.SourceStateDir when the bucket could not be read at start-up.
func (b *Broker) TableSource() string { return b.watcher.Source() }

// ID is this broker's id.
func (b *Broker) ID() string { return b.cfg.ID }

// Router exposes the policy state (for the dashboard and tests).
func (b *Broker) Router() *policy.Router { return b.dec.Router() }

// Table returns the routing table in force (nil before the first load).
func (b *Broker) Table() *table.Snapshot { return b.dec.Table() }

// Spender is the budget spend this broker shares (nil until a request
// under a budget needed it).
func (b *Broker) Spender() *budget.Spender { return b.dec.Spender() }

// LiveBrokers is the number of deciders this one counts for quota shares.
func (b *Broker) LiveBrokers() int { return b.dec.LiveBrokers() }

// Run serves until ctx is cancelled, then stops taking requests and returns.
func (b *Broker) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()

	wg.Go(func() {
		if err := b.watcher.Run(ctx); err != nil && ctx.Err() == nil {
			b.log.Error("table watcher stopped", "err", err)
		}
	})
	select {
	case <-b.watcher.Ready():
	case <-ctx.Done():
		return nil
	}
	if err := b.dec.Start(ctx); err != nil {
		return err
	}
	defer b.dec.Stop()
	if !b.dec.WarmUp(ctx, b.cfg.WarmUp) {
		return nil
	}

	svc, err := micro.AddService(b.nc, micro.Config{
		Name:        subjects.BrokerService,
		Version:     "0.1.0",
		Description: "Switchyard broker: picks model, pool and replica for each request",
		Metadata:    map[string]string{"broker": b.cfg.ID, "prefix": b.subj.Prefix},
	})
	if err != nil {
		return fmt.Errorf("broker: micro service: %w", err)
	}
	defer b.stop(svc)
	if err := svc.AddEndpoint("route", micro.HandlerFunc(b.route),
		micro.WithEndpointSubject(b.subj.RouteAll()),
		micro.WithEndpointQueueGroup(subjects.BrokerQueue),
		micro.WithEndpointPendingLimits(RoutePendingMsgs, RoutePendingBytes)); err != nil {
		return err
	}
	if err := svc.AddEndpoint("gateway", micro.HandlerFunc(b.route),
		micro.WithEndpointSubject(b.subj.GatewayAll()),
		micro.WithEndpointQueueGroup(subjects.BrokerQueue),
		micro.WithEndpointPendingLimits(GatewayPendingMsgs, GatewayPendingBytes)); err != nil {
		return err
	}
	if err := svc.AddEndpoint("batch", micro.HandlerFunc(b.route),
		micro.WithEndpointSubject(b.subj.BatchAll()),
		micro.WithEndpointQueueGroup(subjects.BrokerQueue),
		micro.WithEndpointPendingLimits(RoutePendingMsgs, RoutePendingBytes)); err != nil {
		return err
	}
	if err := svc.AddEndpoint("explain", micro.HandlerFunc(b.explain),
		micro.WithEndpointSubject(b.subj.ExplainAll()),
		micro.WithEndpointQueueGroup(subjects.BrokerQueue)); err != nil {
		return err
	}
	b.log.Info("broker serving", "route", b.subj.RouteAll(), "gateway", b.subj.GatewayAll())
	<-ctx.Done()
	return nil
}

// Pending limits of the request endpoints: what the server has delivered
// and the broker not yet handled. Past them the client library drops
// messages (a slow consumer) and the gateway retries on its timeout; below
// them a flood of direct requests cannot take the broker's memory. The
// broker decides in microseconds, so a full queue means a flood.
const (
	RoutePendingMsgs    = 4096
	RoutePendingBytes   = 64 << 20
	GatewayPendingMsgs  = 65536
	GatewayPendingBytes = 512 << 20
)

// drainWait bounds how long a stopping broker waits for the requests
// already delivered to it.
const drainWait = 2 * time.Second

// stop takes the broker out of the queue group without dropping what the
// server already delivered to it: the endpoints drain (the server stops
// sending; pending requests are still handled), the flush's round trip
// confirms the server saw it, and stop waits until the route handler has
// been idle for a poll interval, at most drainWait, and for the requests
// still reading their stored response's owner (at most OwnerTimeout).
func (b *Broker) stop(svc micro.Service) {
	defer func() {
		b.endLookups()
		b.log.Info("broker stopped", "routed", b.handled.Load())
	}()
	if err := svc.Stop(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		b.log.Warn("stopping micro service", "err", err)
	}
	if b.nc.FlushTimeout(drainWait) != nil {
		return
	}
	deadline := time.Now().Add(drainWait)
	last := b.handled.Load()
	for time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		n := b.handled.Load()
		if n == last {
			break
		}
		last = n
	}
}
