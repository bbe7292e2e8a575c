// Package devstack runs the whole of Switchyard in one process: an embedded
// nats-server with JetStream, the routing table seeded from the dev table, a
// broker, a gateway, and one simulated engine with its adapter per dev
// replica. `switchyard dev` and the end-to-end tests both start it.
package devstack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/switchyard-llm/switchyard/auth"
	"github.com/switchyard-llm/switchyard/batch"
	"github.com/switchyard-llm/switchyard/broker"
	"github.com/switchyard-llm/switchyard/budget"
	"github.com/switchyard-llm/switchyard/deploy/examples"
	"github.com/switchyard-llm/switchyard/devstack/fleet"
	"github.com/switchyard-llm/switchyard/enginesim"
	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/internal/buildinfo"
	"github.com/switchyard-llm/switchyard/internal/check"
	"github.com/switchyard-llm/switchyard/internal/kvevents"
	"github.com/switchyard-llm/switchyard/internal/listen"
	"github.com/switchyard-llm/switchyard/internal/stages"
	"github.com/switchyard-llm/switchyard/internal/telemetry"
	"github.com/switchyard-llm/switchyard/loader"
	"github.com/switchyard-llm/switchyard/natsconn"
	"github.com/switchyard-llm/switchyard/owners"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
	"github.com/switchyard-llm/switchyard/table/kv"
	"github.com/switchyard-llm/switchyard/ui"
)

// Replica is one simulated engine and its adapter.
type Replica = fleet.Replica

// Replicas is the deployment `switchyard dev` runs (fleet.Dev).
func Replicas() []Replica { return fleet.Dev() }

// ReplicasNamed is the dev replicas with these ids, in this order; tests
// choose their replicas by name. An unknown id panics.
func ReplicasNamed(ids ...string) []Replica { return fleet.Named(ids...) }

// Config configures the stack. Zero values take the defaults of `switchyard dev`.
type Config struct {
	// Listen is the gateway's HTTP address (default 127.0.0.1:8080; port 0 = any).
	Listen string
	// NATSListen is the embedded server's client address (default 127.0.0.1:4222; port -1 = any).
	NATSListen string
	// DataDir holds JetStream's store, the brokers' state, the NATS keys
	// (auth/) and every identity's creds file (creds/) ("" = a temp dir).
	DataDir string
	// Speed scales the simulated engines' time (default 1).
	Speed float64
	// DeterministicText puts the simulated engines in their deterministic
	// text mode: every answer is the same word sequence, and a continuation
	// goes on with it.
	DeterministicText bool
	// Replicas overrides the dev replicas (tests use fewer).
	Replicas []Replica
	// Brokers is the number of brokers in the queue group (default 1).
	Brokers int
	// Gateway tunes the gateway (Listen, Logger and metrics are set here).
	Gateway gateway.Config
	Logger  *slog.Logger

	// KeepaliveEvery, HeartbeatEvery, ScrapeEvery and DrainGrace tune every
	// adapter (zero: the adapter's defaults of 5s, 1s, 1s and 30s).
	KeepaliveEvery, HeartbeatEvery, ScrapeEvery, DrainGrace time.Duration
	// Faults are in force from the start for the replicas named (the others
	// get an empty one); see Stack.Faults.
	Faults map[string]*Faults
	// ColdReplicas are started by the dev loader when their model is asked
	// for (default ColdReplicas(); an empty, non-nil slice: none), and
	// ColdLoad is their load time at speed 1 (default DefaultColdLoad).
	ColdReplicas []Replica
	ColdLoad     time.Duration
	// Loader tunes the dev loader (Actions, Logger and metrics are set here).
	Loader loader.Config
	// OTLPEndpoint is the collector the gateway, the brokers and the
	// adapters export their spans to, as OTEL_EXPORTER_OTLP_ENDPOINT
	// (`switchyard dev --otlp-endpoint`); "": the environment decides, and
	// without an endpoint there nothing is traced.
	OTLPEndpoint string
	// Batcher tunes the dev batcher (Logger and metrics are set here);
	// NoBatcher runs none.
	Batcher   batch.Config
	NoBatcher bool
	// NoKVEvents runs the simulated engines without their KV-cache event
	// feed (by default each publishes one on loopback and its adapter
	// reads it, so brokers route on what the engines cache).
	NoKVEvents bool
	// FCFSEngines runs the simulated engines first come first served. By
	// default they schedule by priority (vLLM's --scheduling-policy
	// priority) and their adapters send each request's: a batch line
	// waits behind every interactive request (docs/benchmarks.md).
	FCFSEngines bool
	// Stages, when set, is shared by the gateway, the brokers and the
	// adapters: one clock for the whole path (StageSummary reads it).
	Stages *stages.Recorder
}

// Stack is a running dev stack.
type Stack struct {
	cfg      Config
	log      *slog.Logger
	nats     *natsconn.Embedded
	conns    []*nats.Conn
	gw       *gateway.Gateway
	brokers  []*broker.Broker
	gwLn     net.Listener
	engines  map[string]*enginesim.Server
	kvFeeds  map[string]kvevents.SubscriberConfig // by replica: its engine's event sockets
	registry *prometheus.Registry
	runCtx   context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	// partsMu guards what a test may stop and start while the stack runs.
	partsMu     sync.Mutex
	connect     func(string, auth.Role) (*nats.Conn, error)
	adapters    map[string]*part
	brokerParts []*part
	faults      map[string]*Faults
	storeDir    string
	natsListen  string
	natsDown    bool
	devNC       *nats.Conn // the stack's own connection (seed, heartbeats, pings)
	auth        *auth.Store
	credsDir    string
	tempDir     string // owned auth and creds when DataDir is empty

	engineCtx    context.Context
	engineCancel context.CancelFunc
	engineWG     sync.WaitGroup
	errMu        sync.Mutex
	errs         []error

	hbMu sync.Mutex
	seen map[string]bool

	cold *devActions

	// tracing is the tracer provider of each kind of part (nil: none).
	tracing struct{ gateway, broker, adapter *telemetry.Tracing }
}

// Validate range-checks cfg before anything starts. Zero values stand for
// their defaults; errors name the flag that sets the value.
func (c *Config) Validate() error {
	return check.All(
		check.Range("speed", c.Speed, 0, 1e6),
		check.Range("brokers", c.Brokers, 0, 64),
		check.Duration("keepalive-every", c.KeepaliveEvery, 0, time.Hour),
		check.Duration("heartbeat-every", c.HeartbeatEvery, 0, time.Hour),
		check.Duration("scrape-every", c.ScrapeEvery, 0, time.Hour),
		check.Duration("drain-grace", c.DrainGrace, math.MinInt64, time.Hour),
		check.Duration("cold-load", c.ColdLoad, 0, time.Hour),
		c.Gateway.Validate(),
	)
}

// Start brings the stack up and returns once the gateway listens. Use
// Ready to wait for every replica's first heartbeat, and Close to stop.
func Start(ctx context.Context, cfg Config) (_ *Stack, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:8080"
	}
	if cfg.NATSListen == "" {
		cfg.NATSListen = natsconn.DefaultListen
	}
	if cfg.Speed == 0 {
		cfg.Speed = 1
	}
	if cfg.Replicas == nil {
		cfg.Replicas = Replicas()
	}
	if cfg.ColdReplicas == nil {
		cfg.ColdReplicas = ColdReplicas()
	}
	if cfg.ColdLoad <= 0 {
		cfg.ColdLoad = DefaultColdLoad
	}
	if cfg.Brokers <= 0 {
		cfg.Brokers = 1
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Stack{cfg: cfg, log: cfg.Logger, engines: map[string]*enginesim.Server{}, kvFeeds: map[string]kvevents.SubscriberConfig{}, seen: map[string]bool{}}
	s.registry = prometheus.NewRegistry()
	s.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildinfo.Read().Collector())
	runCtx, cancel := context.WithCancel(context.Background())
	s.runCtx, s.cancel = runCtx, cancel
	s.adapters, s.faults = map[string]*part{}, map[string]*Faults{}
	s.engineCtx, s.engineCancel = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			s.Close()
		}
	}()

	storeDir := ""
	if cfg.DataDir != "" {
		storeDir = cfg.DataDir + "/jetstream"
	}
	if err := s.startTracing(ctx); err != nil {
		return nil, err
	}
	trust, err := s.prepareAuth()
	if err != nil {
		return nil, fmt.Errorf("NATS authorization: %w", err)
	}
	s.nats, err = natsconn.StartEmbedded(natsconn.EmbeddedConfig{Listen: cfg.NATSListen, StoreDir: storeDir, Logger: cfg.Logger, Trust: trust})
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	s.storeDir, s.natsListen = storeDir, s.nats.Server().Addr().String()
	url := s.nats.ClientURL()
	connect := func(name string, role auth.Role) (*nats.Conn, error) {
		// The server is local: reconnect quickly after it restarts.
		nc, err := nats.Connect(url, nats.Name(name), nats.UserCredentials(s.Creds(role)),
			nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
			// A refusal (a stream cut by a server restart outlives the
			// reply permission of the connection it started on) goes to
			// the stack's log, not to stderr.
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				s.log.Warn("NATS asynchronous error", "conn", name, "err", err)
			}))
		if err == nil {
			s.partsMu.Lock()
			s.conns = append(s.conns, nc)
			s.partsMu.Unlock()
		}
		return nc, err
	}
	s.connect = connect
	nc, err := connect("switchyard-dev", auth.Role{Kind: auth.RoleOperator})
	if err != nil {
		return nil, err
	}
	s.devNC = nc
	if err := s.seed(ctx, nc); err != nil {
		return nil, err
	}
	if _, err := nc.Subscribe(subjects.New("").HeartbeatAll(), s.onHeartbeat); err != nil {
		return nil, err
	}

	s.brokers = make([]*broker.Broker, cfg.Brokers)
	s.brokerParts = make([]*part, cfg.Brokers)
	for i := 0; i < cfg.Brokers; i++ {
		if err := s.startBroker(i); err != nil {
			return nil, err
		}
	}

	for _, r := range cfg.Replicas {
		if err := s.startReplica(r); err != nil {
			return nil, err
		}
	}
	if err := s.startLoader(); err != nil {
		return nil, err
	}
	if err := s.startBatcher(); err != nil {
		return nil, err
	}

	// A gateway that decides through the brokers connects with a relay's
	// creds: none of a decider's subjects (docs/security.md).
	gwRole := auth.Role{Kind: auth.RoleGateway, Region: cfg.Gateway.Region}
	if cfg.Gateway.Decide == gateway.DecideBroker {
		gwRole.Kind = auth.RoleGatewayRelay
	}
	gnc, err := connect("switchyard-gateway", gwRole)
	if err != nil {
		return nil, err
	}
	gcfg := cfg.Gateway
	gcfg.Listen = cfg.Listen
	gcfg.Logger = cfg.Logger
	gcfg.TracerProvider = s.tracing.gateway.Provider()
	gcfg.Stages = cfg.Stages
	gcfg.Registerer, gcfg.Gatherer = s.registry, s.registry
	if gcfg.Ready == nil {
		gcfg.Ready = s.heartbeatsReady
	}
	// The dashboard reads the gateway's table; s.gw is set before the
	// dashboard runs or the gateway serves.
	dash := ui.New(gnc, ui.Config{
		Prefix: gcfg.Prefix, Bucket: gcfg.Bucket, Logger: cfg.Logger,
		Table: func() *table.Snapshot { return s.gw.Table() },
	})
	extra := map[string]http.Handler{}
	maps.Copy(extra, dash.Mounts())
	if cfg.Stages != nil {
		// The stage table beside the dashboard (`switchyard bench
		// --stages` reads it), with the bus floor measured through
		// this stack's server.
		maps.Copy(extra, stages.Handlers(s.StageSummary, cfg.Stages.Reset))
	}
	maps.Copy(extra, gcfg.Extra)
	gcfg.Extra = extra
	s.gw, err = gateway.New(gnc, gcfg)
	if err != nil {
		return nil, err
	}
	s.goRun("dashboard", dash.Run, runCtx)
	s.gwLn, err = listen.Listen(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("gateway listen: %w", err)
	}
	ln := s.gwLn
	s.goRun("gateway", func(ctx context.Context) error { return s.gw.Serve(ctx, ln) }, runCtx)
	return s, nil
}

// DevTenants are the dev table's tenants; each gets an account for direct
// NATS clients.
func DevTenants() []string {
	var ts []string
	for k := range examples.Flat() {
		if t, ok := strings.CutPrefix(k, "tenants."); ok {
			ts = append(ts, t)
		}
	}
	sort.Strings(ts)
	return ts
}

// prepareAuth creates (or reopens) the stack's NATS authorization: keys in
// <data>/auth, a creds file per identity in <data>/creds.
func (s *Stack) prepareAuth() (*natsconn.Trust, error) {
	base := s.cfg.DataDir
	if base == "" {
		dir, err := os.MkdirTemp("", "switchyard-dev-")
		if err != nil {
			return nil, err
		}
		s.tempDir, base = dir, dir
	}
	ids := make([]string, 0, len(s.cfg.Replicas)+len(s.cfg.ColdReplicas))
	for _, r := range s.cfg.Replicas {
		ids = append(ids, r.ID)
	}
	for _, r := range s.cfg.ColdReplicas {
		ids = append(ids, r.ID)
	}
	store, err := auth.Init(filepath.Join(base, "auth"), auth.Config{Prefix: s.cfg.Gateway.Prefix, Tenants: DevTenants(), Replicas: ids})
	if err != nil {
		return nil, err
	}
	s.auth, s.credsDir = store, filepath.Join(base, "creds")
	if err := store.WriteAllCreds(s.credsDir, ids); err != nil {
		return nil, err
	}
	return store.Trust()
}

// Auth is the stack's authorization store (<data>/auth).
func (s *Stack) Auth() *auth.Store { return s.auth }

// CredsDir holds a creds file per identity (<data>/creds).
func (s *Stack) CredsDir() string { return s.credsDir }

// Creds is the path of role's creds file in CredsDir.
func (s *Stack) Creds(role auth.Role) string {
	return filepath.Join(s.credsDir, role.Name()+".creds")
}

// seed creates the buckets and writes the dev table's keys that are absent.
func (s *Stack) seed(ctx context.Context, nc *nats.Conn) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if _, err := owners.Ensure(ctx, js, owners.DefaultBucket, 1); err != nil {
		return fmt.Errorf("stored-response owners bucket: %w", err)
	}
	bucket, err := kv.EnsureBucket(ctx, js, subjects.DefaultBucket, 1)
	if err != nil {
		return fmt.Errorf("routing-table bucket: %w", err)
	}
	if _, err := budget.Ensure(ctx, js, s.cfg.Gateway.Prefix, 1, budget.DefaultLedgerMaxAge); err != nil {
		return err
	}
	flat := examples.Flat()
	// The table tells clients how long the simulated cold models take to
	// load, at this speed.
	secs := (time.Duration(float64(s.cfg.ColdLoad) / s.cfg.Speed)).Seconds()
	for _, r := range s.cfg.ColdReplicas {
		k := table.PrefixModels + r.Model
		raw, ok := flat[k]
		if !ok {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
		m["expected_load_seconds"] = math.Round(secs*10) / 10
		if flat[k], err = json.Marshal(m); err != nil {
			return err
		}
	}
	_, err = kv.Seed(ctx, bucket, flat)
	return err
}

// startLoader runs the dev loader, whose actions start and stop the cold
// dev replicas in this process.
func (s *Stack) startLoader() error {
	nc, err := s.connect("switchyard-loader", auth.Role{Kind: auth.RoleLoader})
	if err != nil {
		return err
	}
	lcfg := s.cfg.Loader
	if lcfg.ID == "" {
		lcfg.ID = "dev-loader"
	}
	s.cold = &devActions{s: s, fallback: &loader.Standard{}, running: map[string]*coldRun{}}
	lcfg.Actions, lcfg.Logger, lcfg.Registerer = s.cold, s.log, replacing{s.registry}
	l, err := loader.New(nc, lcfg)
	if err != nil {
		return err
	}
	s.goRun("loader", l.Run, s.runCtx)
	return nil
}

// startBatcher runs the dev batcher as the batcher identity, unless
// cfg.NoBatcher (a test runs its own).
func (s *Stack) startBatcher() error {
	if s.cfg.NoBatcher {
		return nil
	}
	nc, err := s.connect("switchyard-batcher", auth.Role{Kind: auth.RoleBatcher})
	if err != nil {
		return err
	}
	bcfg := s.cfg.Batcher
	if bcfg.ID == "" {
		bcfg.ID = "dev-batcher"
	}
	bcfg.Prefix, bcfg.Logger, bcfg.Registerer = s.cfg.Gateway.Prefix, s.log, replacing{s.registry}
	b, err := batch.New(nc, bcfg)
	if err != nil {
		return err
	}
	s.goRun("batcher", b.Run, s.runCtx)
	return nil
}

func (s *Stack) startReplica(r Replica) error {
	engineURL := r.EngineURL
	if engineURL == "" {
		f := s.cfg.Faults[r.ID]
		if f == nil {
			f = new(Faults)
		}
		// Engines outlive the adapters so that draining adapters can finish
		// their requests: they stop on engineCtx, cancelled after the rest.
		var err error
		if engineURL, _, err = s.startEngine(s.engineCtx, r, f); err != nil {
			return err
		}
	}
	return s.startAdapter(r, engineURL)
}

// startEngine runs r's simulated engine, behind the fault injector f, until
// ctx ends, and returns its URL and a channel closed once it has stopped.
func (s *Stack) startEngine(ctx context.Context, r Replica, f *Faults) (url string, stopped <-chan struct{}, err error) {
	ecfg := r.Engine()
	if s.cfg.FCFSEngines {
		ecfg.Scheduling = enginesim.SchedulingFCFS
	}
	eng := enginesim.NewServer(enginesim.ServerConfig{Engine: ecfg, Speed: s.cfg.Speed, Adapters: r.Adapters, DeterministicText: s.cfg.DeterministicText, Logger: s.log})
	var feed kvevents.SubscriberConfig
	if !s.cfg.NoKVEvents {
		pub, err := eng.PublishKVEvents(kvevents.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Replay: "tcp://127.0.0.1:0", Topic: "kv-events"})
		if err != nil {
			return "", nil, err
		}
		feed = kvevents.SubscriberConfig{Endpoint: pub.Addr(), Replay: pub.ReplayAddr()}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	s.partsMu.Lock()
	s.engines[r.ID], s.faults[r.ID], s.kvFeeds[r.ID] = eng, f, feed
	s.partsMu.Unlock()
	host := newEngineHost(eng, f, s.log)
	done := make(chan struct{})
	s.engineWG.Go(func() {
		defer close(done)
		if err := host.run(ctx, ln); err != nil {
			s.log.Error("engine stopped", "replica", r.ID, "err", err)
		}
	})
	return "http://" + ln.Addr().String(), done, nil
}

func (s *Stack) goRun(what string, run func(context.Context) error, ctx context.Context) {
	s.wg.Go(func() {
		if err := run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			s.log.Error("stopped with an error", "part", what, "err", err)
			s.errMu.Lock()
			s.errs = append(s.errs, fmt.Errorf("%s: %w", what, err))
			s.errMu.Unlock()
		}
	})
}

func (s *Stack) onHeartbeat(m *nats.Msg) {
	var hb subjects.Heartbeat
	if json.Unmarshal(m.Data, &hb) == nil {
		s.hbMu.Lock()
		s.seen[hb.Replica] = hb.State == subjects.StateReady
		s.hbMu.Unlock()
	}
}

// heartbeatsReady is the dev gateway's extra readiness check: every dev
// replica has sent a heartbeat saying ready, and every broker's table has it
// registered as ready.
func (s *Stack) heartbeatsReady() error {
	s.hbMu.Lock()
	defer s.hbMu.Unlock()
	var missing []string
	brokers := s.brokerList()
	for _, r := range s.cfg.Replicas {
		ok := s.seen[r.ID]
		for _, b := range brokers {
			t := b.Table()
			if t == nil || t.Replicas[r.ID] == nil || t.Replicas[r.ID].State != subjects.StateReady {
				ok = false
			}
		}
		if d := s.gw.Decider(); d != nil {
			// The gateway decides: its own load view must have heard the
			// replica, or its first requests would find none.
			if _, live := d.Router().Live(r.ID, time.Now()); !live {
				ok = false
			}
		}
		if !ok {
			missing = append(missing, r.ID)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return fmt.Errorf("waiting for replicas to be ready: %v", missing)
	}
	return nil
}

// Ready waits until the gateway's /readyz would say ready.
func (s *Stack) Ready(ctx context.Context) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		err := s.heartbeatsReady()
		if err == nil && s.gw.Table() != nil {
			_, perr := s.devNC.Request("$SRV.PING."+subjects.BrokerService, nil, 500*time.Millisecond)
			if perr == nil {
				return nil
			}
			err = perr
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stack not ready: %w", err)
		case <-t.C:
		}
	}
}

// GatewayURL is the gateway's base URL.
func (s *Stack) GatewayURL() string { return "http://" + s.gwLn.Addr().String() }

// StageSummary is the stage table of the requests recorded since the
// recorder's last Reset, with the bus floor measured now through the
// embedded server (200 bare requests, on a connection of their own under
// an adapter's permissions: an adapter may publish and take inbox
// subjects, as a bare request and its reply need).
func (s *Stack) StageSummary() (stages.Summary, error) {
	sum := s.cfg.Stages.Summary()
	role := auth.Role{Kind: auth.RoleAdapter, ID: "bus-floor"}
	if _, err := s.auth.WriteCreds(s.credsDir, role); err != nil {
		return sum, err
	}
	nc, err := s.connect("switchyard-bus-floor", role)
	if err != nil {
		return sum, err
	}
	defer nc.Close()
	sum.BusFloor, err = stages.BusFloor(nc, 200)
	return sum, err
}

// NATSURL is the embedded server's client URL.
func (s *Stack) NATSURL() string {
	s.partsMu.Lock()
	defer s.partsMu.Unlock()
	return s.nats.ClientURL()
}

// Broker returns the i-th broker (after StartBroker, the new one).
func (s *Stack) Broker(i int) *broker.Broker { return s.brokerList()[i] }

func (s *Stack) brokerList() []*broker.Broker {
	s.partsMu.Lock()
	defer s.partsMu.Unlock()
	return append([]*broker.Broker(nil), s.brokers...)
}

// Gateway returns the gateway.
func (s *Stack) Gateway() *gateway.Gateway { return s.gw }

// Engine returns a dev replica's simulated engine (nil for a replica with
// an EngineURL).
func (s *Stack) Engine(id string) *enginesim.Server {
	s.partsMu.Lock()
	defer s.partsMu.Unlock()
	return s.engines[id]
}

// Registry is the one Prometheus registry every part reports to.
func (s *Stack) Registry() *prometheus.Registry { return s.registry }

// Close stops every part (adapters drain) and the embedded server, and
// returns the errors the parts stopped with.
func (s *Stack) Close() error {
	if s.cancel != nil {
		s.cancel()
	}
	s.wg.Wait()
	if s.engineCancel != nil {
		s.engineCancel()
	}
	s.engineWG.Wait()
	s.partsMu.Lock()
	defer s.partsMu.Unlock()
	for _, nc := range s.conns {
		nc.Close()
	}
	if s.nats != nil && !s.natsDown {
		s.nats.Shutdown()
	}
	if s.tempDir != "" {
		_ = os.RemoveAll(s.tempDir)
	}
	s.stopTracing()
	s.errMu.Lock()
	defer s.errMu.Unlock()
	return errors.Join(s.errs...)
}

// startTracing builds the parts' tracer providers, one per kind of part so
// that each names its own service.
func (s *Stack) startTracing(ctx context.Context) error {
	for _, p := range []struct {
		t       **telemetry.Tracing
		service string
	}{
		{&s.tracing.gateway, telemetry.ServiceGateway},
		{&s.tracing.broker, telemetry.ServiceBroker},
		{&s.tracing.adapter, telemetry.ServiceAdapter},
	} {
		t, err := telemetry.New(ctx, telemetry.Config{Service: p.service, Endpoint: s.cfg.OTLPEndpoint})
		if err != nil {
			return err
		}
		*p.t = t
	}
	return nil
}

// stopTracing flushes the spans the parts made, once they have stopped.
func (s *Stack) stopTracing() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, t := range []*telemetry.Tracing{s.tracing.gateway, s.tracing.broker, s.tracing.adapter} {
		if err := t.Shutdown(ctx); err != nil {
			s.log.Warn("spans not flushed", "err", err)
		}
	}
	s.tracing.gateway, s.tracing.broker, s.tracing.adapter = nil, nil, nil
}
