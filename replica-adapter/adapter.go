// Package adapter is the replica adapter: one per engine (vLLM, SGLang,
// llama.cpp server, TGI or the built-in simulator). It registers its replica
// in the routing table, takes requests on llm.replica.<id>, calls the
// engine's OpenAI HTTP API and streams the answer back on the request's reply
// subject (docs/protocol.md, "The reply protocol"), scrapes the engine's load and
// heartbeats it, and drains when its context ends.
package adapter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/switchyard-llm/switchyard/internal/check"
	"github.com/switchyard-llm/switchyard/internal/stages"
	"github.com/switchyard-llm/switchyard/internal/telemetry"
	"github.com/switchyard-llm/switchyard/owners"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// ErrConfig is wrapped by every configuration error of New.
var ErrConfig = errors.New("adapter: invalid config")

// serviceVersion is the micro service's version (micro requires SemVer); the
// model's version travels in the metadata.
const serviceVersion = "0.1.0"

// Defaults of Config.
const (
	DefaultHeartbeatEvery = time.Second
	DefaultScrapeEvery    = time.Second
	DefaultKeepaliveEvery = subjects.KeepaliveEvery * time.Second
	DefaultDrainGrace     = 30 * time.Second
	// DefaultAcceptDelay is how long the accept may wait to ride on the
	// head: well inside the gateway's 1 s accept timeout, and longer than a
	// healthy engine takes to send its response headers.
	DefaultAcceptDelay     = 50 * time.Millisecond
	DefaultScrapeFailLimit = 3
	// DefaultMaxBatch is vLLM's default max_num_seqs; DefaultMaxQueue bounds
	// the waiting requests brokers weigh as a full queue. Brokers divide by
	// both, so neither is ever sent as 0.
	DefaultMaxBatch = 256
	DefaultMaxQueue = 1024
)

// Config configures an Adapter. Replica, Model and EngineURL are required;
// every other field has a documented default.
type Config struct {
	Replica string
	// Model is the model id the replica serves, and the engine's served
	// name unless EngineModel is set.
	Model       string
	EngineModel string
	Version     string
	Pool        string // default "general"
	// Region is the region the replica serves in (--region), carried in
	// its heartbeats; empty is the one default region.
	Region    string
	Flavor    string // "auto" (default), "vllm", "sglang", "llamacpp" or "tgi"
	EngineURL string // e.g. http://127.0.0.1:8000, without /v1
	// EngineAPIKey is sent to the engine as "Authorization: Bearer" (vLLM's
	// --api-key). It is never logged.
	EngineAPIKey string
	// EngineScheduling is the engine's scheduling policy:
	// SchedulingFCFS (default) or SchedulingPriority, for an engine
	// started with vLLM's --scheduling-policy priority. Only then does the
	// adapter send each request's priority field (EnginePriority), and
	// brokers let batch work fill the replica's batch.
	EngineScheduling string

	// MaxBatch and MaxQueue are the engine's batch and queue sizes. 0 reads
	// the batch size from the engine where it exports one, else
	// DefaultMaxBatch; the queue is DefaultMaxQueue. The heartbeat says
	// which (max_batch_from, max_queue_from).
	MaxBatch int
	MaxQueue int
	MaxLoras int // 0: as the engine reports (vLLM's max_lora)
	// Role is what the replica serves of a disaggregated model:
	// table.RolePrefill, table.RoleDecode or table.RoleBoth (default).
	Role string

	// Endpoints are the inference endpoints the engine serves, told to
	// brokers; default: its flavor's (all of them for vLLM).
	Endpoints []string

	Bucket string // KV bucket, default subjects.DefaultBucket
	// OwnersBucket remembers which replica holds each stored response
	// (default owners.DefaultBucket).
	OwnersBucket string
	Prefix       string // subject prefix, default subjects.DefaultPrefix

	HeartbeatEvery time.Duration // default 1s
	ScrapeEvery    time.Duration // default 1s; also the /health poll
	KeepaliveEvery time.Duration // default 5s
	// AcceptDelay holds the accept back this long so that it can ride on the
	// head (one message instead of two); past it the accept goes alone.
	// Default DefaultAcceptDelay; negative sends it at once.
	AcceptDelay     time.Duration
	DrainGrace      time.Duration // default 30s; negative: none
	ScrapeFailLimit int           // consecutive failed scrapes before scrape_ok=false, default 3

	Logger *slog.Logger // nil: discard
	// TracerProvider receives the adapter's spans and its engine calls'
	// (nil: none are made; internal/telemetry builds one from the
	// environment).
	TracerProvider trace.TracerProvider
	// Stages, when set, records the stage timestamps of a sample of the
	// requests (internal/stages); nil records nothing.
	Stages *stages.Recorder
	// HTTPClient calls the engine. nil: a client tuned for many concurrent
	// streams to one host. It must not set Client.Timeout, which would cut
	// long streams: each request carries its own deadline.
	HTTPClient *http.Client
	// KVEvents is the engine's KV-cache event PUB socket to connect to
	// (vLLM binds it: --kv-events-config's endpoint); KVEventsBind binds
	// one instead for an engine that dials out. Empty: no feed, and
	// brokers keep guessing this replica's cache from placements.
	KVEvents, KVEventsBind string
	// KVEventsTopic subscribes to a topic prefix (default: every topic).
	KVEventsTopic string
	// KVEventsReplay is the engine's replay (ROUTER) socket, asked for
	// missed batches; without it a gap drops the replica's keys until
	// they are learned again.
	KVEventsReplay string
	// KVBlocks is the engine's KV capacity in blocks, declared to brokers
	// (it bounds the replica's keys in their index). 0 reads vLLM's
	// cache_config_info.
	KVBlocks int

	// Registerer receives the adapter's metrics (nil: not registered).
	Registerer prometheus.Registerer
}

// Adapter serves one replica. Create it with New and start it with Run.
type Adapter struct {
	nc      *nats.Conn
	cfg     Config
	log     *slog.Logger
	tracer  trace.Tracer // nil: no spans
	subj    subjects.Subjects
	engine  engineHTTP
	metrics *metrics
	reg     *registrar
	owners  *owners.Store

	started atomic.Bool
	book    book   // the work in hand
	accept  []byte // the body of an accept sent alone (acceptBody)

	load   loadState
	beats  beats
	limits limits // as configured; the engine may fill the batch size
	svc    service
	tails  tails // where recent replies ended, marked after a reconnect
	deltas deltas
	kv     *kvFeed // nil without --kv-events
	ledger *ledger
}

// New validates cfg, fills its defaults and returns an Adapter ready to Run.
func New(nc *nats.Conn, cfg Config) (*Adapter, error) {
	if nc == nil {
		return nil, fmt.Errorf("%w: nil NATS connection", ErrConfig)
	}
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer, cfg.Replica)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("adapter: jetstream: %w", err)
	}
	a := &Adapter{
		nc:      nc,
		cfg:     cfg,
		log:     telemetry.Logger(cfg.Logger).With("replica", cfg.Replica),
		tracer:  telemetry.Tracer(cfg.TracerProvider, "github.com/switchyard-llm/switchyard/replica-adapter"),
		subj:    subjects.New(cfg.Prefix),
		metrics: m,
		reg:     &registrar{js: js, bucket: cfg.Bucket, key: table.PrefixReplicas + cfg.Replica},
		owners:  owners.New(js, cfg.OwnersBucket),
		ledger:  newLedger(js, subjects.New(cfg.Prefix), telemetry.Logger(cfg.Logger).With("replica", cfg.Replica)),
		book:    newBook(),
		accept:  acceptBody(cfg.Replica),
		limits:  configuredLimits(&cfg),
		deltas:  newDeltas(),
		beats:   newBeats(),
	}
	a.load.epoch = time.Now()
	if cfg.KVEvents != "" || cfg.KVEventsBind != "" {
		a.kv = newKVFeed(a)
	}
	a.engine.init(cfg.HTTPClient, int(nc.MaxPayload()))
	a.watchEngine()
	return a, nil
}

// Validate checks cfg without connecting to anything. Zero values stand
// for their defaults; errors name the flag that sets the value.
func (c *Config) Validate() error {
	var flavorErr, urlErr, modelErr, poolErr error
	switch c.Flavor {
	case "", FlavorAuto, FlavorVLLM, FlavorSGLang, FlavorLlamaCpp, FlavorTGI:
	default:
		flavorErr = check.Wrap("flavor", c.Flavor, errors.New("want auto, vllm, sglang, llamacpp or tgi"))
	}
	if u, err := url.Parse(c.EngineURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		urlErr = check.Wrap("engine", c.EngineURL, errors.New("want http(s)://host[:port]"))
	}
	if !table.ValidName(c.Model) {
		modelErr = check.Wrap("model", c.Model, errors.New("not a valid model id"))
	}
	if c.Pool != "" {
		poolErr = check.Wrap("pool", c.Pool, subjects.ValidToken(c.Pool))
	}
	if c.Region != "" {
		poolErr = errors.Join(poolErr, check.Wrap("region", c.Region, subjects.ValidToken(c.Region)))
	}
	var roleErr error
	if !table.ValidRole(c.Role) {
		roleErr = check.Wrap("pd-role", c.Role, errors.New("want prefill, decode or both"))
	}
	var endpointsErr error
	for _, e := range c.Endpoints {
		if subjects.EndpointBit(e) == 0 {
			endpointsErr = check.Wrap("endpoints", e, errors.New("want one of "+strings.Join(subjects.AllEndpoints(), ", ")))
		}
	}
	var schedErr error
	switch c.EngineScheduling {
	case "", SchedulingFCFS, SchedulingPriority:
	default:
		schedErr = check.Wrap("engine-scheduling", c.EngineScheduling, errors.New("want fcfs or priority"))
	}
	var kvErr error
	if c.KVEvents != "" && c.KVEventsBind != "" {
		kvErr = check.Wrap("kv-events-bind", c.KVEventsBind, errors.New("set --kv-events or --kv-events-bind, not both"))
	}
	for flag, ep := range map[string]string{"kv-events": c.KVEvents, "kv-events-bind": c.KVEventsBind, "kv-events-replay": c.KVEventsReplay} {
		if ep != "" && !strings.HasPrefix(ep, "tcp://") && !strings.HasPrefix(ep, "ipc://") {
			kvErr = errors.Join(kvErr, check.Wrap(flag, ep, errors.New("want tcp://host:port or ipc://path")))
		}
	}
	return check.All(
		check.Wrap("replica", c.Replica, subjects.ValidToken(c.Replica)),
		modelErr, poolErr, flavorErr, urlErr, endpointsErr, roleErr, schedErr,
		check.Range("max-batch", c.MaxBatch, 0, 1<<16),
		check.Range("max-queue", c.MaxQueue, 0, 1<<20),
		check.Range("max-loras", c.MaxLoras, 0, 1<<10),
		check.Range("kv-blocks", c.KVBlocks, 0, subjects.MaxKVBlocks), kvErr,
		check.Range("scrape-fail-limit", c.ScrapeFailLimit, 0, 1000),
		check.Duration("heartbeat-every", c.HeartbeatEvery, 0, time.Hour),
		check.Duration("scrape-every", c.ScrapeEvery, 0, time.Hour),
		check.Duration("keepalive-every", c.KeepaliveEvery, 0, time.Hour),
		check.Duration("accept-delay", c.AcceptDelay, math.MinInt64, time.Second),
		check.Duration("drain-grace", c.DrainGrace, math.MinInt64, time.Hour),
	)
}

func (c *Config) fill() error {
	if err := c.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if c.EngineModel == "" {
		c.EngineModel = c.Model
	}
	if c.Pool == "" {
		c.Pool = table.PoolGeneral
	}
	if c.Flavor == "" {
		c.Flavor = FlavorAuto
	}
	if c.EngineScheduling == "" {
		c.EngineScheduling = SchedulingFCFS
	}
	c.EngineURL = strings.TrimRight(c.EngineURL, "/")
	c.ScrapeFailLimit = orDefault(c.ScrapeFailLimit, DefaultScrapeFailLimit)
	if c.Bucket == "" {
		c.Bucket = subjects.DefaultBucket
	}
	if c.Prefix == "" {
		c.Prefix = subjects.DefaultPrefix
	}
	c.HeartbeatEvery = orDefault(c.HeartbeatEvery, DefaultHeartbeatEvery)
	c.ScrapeEvery = orDefault(c.ScrapeEvery, DefaultScrapeEvery)
	c.KeepaliveEvery = orDefault(c.KeepaliveEvery, DefaultKeepaliveEvery)
	if c.AcceptDelay == 0 {
		c.AcceptDelay = DefaultAcceptDelay
	}
	switch {
	case c.DrainGrace == 0:
		c.DrainGrace = DefaultDrainGrace
	case c.DrainGrace < 0:
		c.DrainGrace = 0 // no grace, asked for explicitly
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

func orDefault[T int | time.Duration](v, d T) T {
	if v <= 0 {
		return d
	}
	return v
}

// kvBlocks is the engine's KV capacity in blocks: configured, else read
// from the engine.
func (a *Adapter) kvBlocks() int {
	if a.cfg.KVBlocks > 0 {
		return a.cfg.KVBlocks
	}
	a.load.mu.Lock()
	defer a.load.mu.Unlock()
	return a.load.sample.KVBlocks
}

// engineBlockSize is the engine's KV block size in tokens as its metrics
// declare it; 0 while unknown.
func (a *Adapter) engineBlockSize() int {
	a.load.mu.Lock()
	defer a.load.mu.Unlock()
	return a.load.sample.BlockSize
}

// KVEventsAddr is the address of the adapter's KV-event feed once Run has
// opened it: with --kv-events-bind, the one it listens on (a port of 0
// there is chosen by the system), for the engine to dial; "" before, or
// without a feed.
func (a *Adapter) KVEventsAddr() string {
	if a.kv == nil {
		return ""
	}
	addr, _ := a.kv.addr.Load().(string)
	return addr
}

// InFlight is the number of requests taken and not yet finished.
func (a *Adapter) InFlight() int { return int(a.book.inflight.Load()) }

// Run serves until ctx ends, then drains: it marks the replica draining (KV
// and heartbeat), answers new requests with 503, lets in-flight ones finish
// within DrainGrace (then cancels them), deregisters and returns. Run may be
// called once.
func (a *Adapter) Run(ctx context.Context) error {
	if !a.started.CompareAndSwap(false, true) {
		return errors.New("adapter: Run called twice")
	}
	if a.engine.ownHTTP != nil {
		defer a.engine.ownHTTP.CloseIdleConnections()
	}
	// Engine calls and the control loops outlive ctx: they run through the
	// drain and are ended by it.
	reqBase, cancelReqs := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelReqs(nil)
	a.book.base = reqBase
	ctrl, stopCtrl := context.WithCancel(context.WithoutCancel(ctx))
	defer stopCtrl()

	// Read the engine's metrics once first, so the service's metadata
	// names its flavor when it is already up.
	a.probeFlavor(ctrl)
	if a.kv != nil {
		if err := a.kv.open(); err != nil {
			return fmt.Errorf("adapter: kv-events: %w", err)
		}
	}
	if err := a.svc.start(a); err != nil {
		if a.kv != nil {
			a.kv.close()
		}
		return err
	}
	var loops sync.WaitGroup
	loops.Go(func() { a.scrapeLoop(ctrl) })
	loops.Go(func() { a.heartbeatLoop(ctrl) })
	loops.Go(func() { a.deltaLoop(ctrl) })
	loops.Go(func() { a.watchConnection(ctrl.Done()) })
	loops.Go(func() { a.ledger.run(ctrl) })
	if a.kv != nil {
		loops.Go(func() { a.kv.run(ctrl) })
	}
	a.log.Info("adapter serving", "subject", a.subj.Replica(a.cfg.Replica), "engine", a.cfg.EngineURL)

	<-ctx.Done()
	a.drain(cancelReqs)
	stopCtrl()
	loops.Wait()

	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := a.reg.deregister(dctx); err != nil {
		a.log.Warn("deregister failed", "err", err)
	}
	if err := a.svc.stop(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		a.log.Warn("stopping micro service", "err", err)
	}
	a.log.Info("adapter stopped")
	return nil
}

// startService registers the micro service. Requests and cancels are both
// its endpoints, outside any queue group: each replica has its own subject.
// micro.Request gives the reply subject, headers and body, which is all a
// request needs, so no plain subscription is required.
func (a *Adapter) startService(flavor string) (micro.Service, error) {
	svc, err := micro.AddService(a.nc, micro.Config{
		Name:        subjects.AdapterService,
		Version:     serviceVersion,
		Description: "Switchyard replica adapter for " + a.cfg.Model,
		Metadata: map[string]string{
			"replica": a.cfg.Replica,
			"model":   a.cfg.Model,
			"version": a.cfg.Version,
			"pool":    a.cfg.Pool,
			"flavor":  flavor,
			// The deciders time the answers to their pings by region
			// (README, "Regions").
			"region": a.cfg.Region,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("adapter: micro service: %w", err)
	}
	if err := svc.AddEndpoint("request", micro.HandlerFunc(a.onRequest),
		micro.WithEndpointSubject(a.subj.Replica(a.cfg.Replica)), micro.WithEndpointQueueGroupDisabled()); err != nil {
		_ = svc.Stop()
		return nil, fmt.Errorf("adapter: request endpoint: %w", err)
	}
	if err := svc.AddEndpoint("cancel", micro.HandlerFunc(a.onCancel),
		micro.WithEndpointSubject(a.subj.ReplicaCancel(a.cfg.Replica)), micro.WithEndpointQueueGroupDisabled()); err != nil {
		_ = svc.Stop()
		return nil, fmt.Errorf("adapter: cancel endpoint: %w", err)
	}
	if a.cfg.Role == table.RolePrefill {
		if err := svc.AddEndpoint("prefill", micro.HandlerFunc(a.onPrefill),
			micro.WithEndpointSubject(a.subj.PrefillAll(a.cfg.Replica)), micro.WithEndpointQueueGroupDisabled()); err != nil {
			_ = svc.Stop()
			return nil, fmt.Errorf("adapter: prefill endpoint: %w", err)
		}
		if err := svc.AddEndpoint("prefill-cancel", micro.HandlerFunc(a.onPrefillCancel),
			micro.WithEndpointSubject(a.subj.PrefillCancelAll(a.cfg.Replica)), micro.WithEndpointQueueGroupDisabled()); err != nil {
			_ = svc.Stop()
			return nil, fmt.Errorf("adapter: prefill cancel endpoint: %w", err)
		}
	}
	return svc, nil
}

// errHandover is the cause of the engine calls cancelled when the drain
// grace runs out: their answers are handed back to their gateways, which
// continue them on other replicas.
var errHandover = errors.New("the replica drained before the answer ended")

// drain stops taking requests and waits for the in-flight ones, at most
// DrainGrace, then hands what is left back to the gateways (an end with
// Llm-Handover) and waits for it to end.
func (a *Adapter) drain(cancelReqs context.CancelCauseFunc) {
	a.book.drain()
	a.log.Info("draining", "inflight", a.InFlight(), "grace", a.cfg.DrainGrace)
	// Tell brokers at once rather than at the next tick.
	a.publishHeartbeat()
	rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	if err := a.register(rctx, true); err != nil {
		a.log.Warn("marking draining in KV failed", "err", err)
	}
	cancel()

	done := a.book.wait()
	grace := time.NewTimer(a.cfg.DrainGrace)
	defer grace.Stop()
	select {
	case <-done:
	case <-grace.C:
		a.log.Warn("drain grace over, handing in-flight requests back", "inflight", a.InFlight())
		cancelReqs(errHandover)
		<-done
	}
}
