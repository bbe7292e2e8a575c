// Package gateway is Switchyard's OpenAI-compatible HTTP ingress. It
// authenticates, parses the body once, puts the routing features in NATS
// headers, publishes to llm.gw.<tenant> and relays the seq-numbered reply
// to HTTP (SSE flushed per chunk), retrying only before the first byte
// reaches the client.
package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/switchyard-llm/switchyard/batch"
	"github.com/switchyard-llm/switchyard/decider"
	"github.com/switchyard-llm/switchyard/internal/check"
	"github.com/switchyard-llm/switchyard/internal/listen"
	"github.com/switchyard-llm/switchyard/internal/stages"
	"github.com/switchyard-llm/switchyard/internal/telemetry"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
	"github.com/switchyard-llm/switchyard/table/kv"
)

// DefaultMaxBody is the body limit when --max-body is not given.
const DefaultMaxBody = 8 << 20

// HeaderRoom is what a request message keeps free for its NATS headers: a
// body may take the server's max payload less this.
const HeaderRoom = 64 << 10

// MaxBodyCeiling is the largest body limit any NATS server can carry: a
// server's max payload cannot exceed 64 MiB (its max pending), less
// HeaderRoom. The server actually connected to may carry less; New checks.
const MaxBodyCeiling = 64<<20 - HeaderRoom

// MaxFileBytesCeiling bounds --max-file-bytes: a batch file is read whole
// by the batch creation and the batcher.
const MaxFileBytesCeiling = 8 << 30

// MaxRetriesCeiling bounds MaxRetries: each retry is another replica tried.
const MaxRetriesCeiling = 10

// DefaultRoutedTimeout is the default RoutedTimeout: a broker sends its
// routed notice within milliseconds of taking a request, so a quarter of
// the default accept timeout without one means the copy is stuck.
const DefaultRoutedTimeout = 250 * time.Millisecond

// DefaultOfflineWait is how long a request waits for a NATS link that is
// down to carry again: a silent server is given up within about 2 s
// (natsconn's liveness check), and the reconnect to another member takes
// a moment more.
const DefaultOfflineWait = 3 * time.Second

// MaxCopies bounds the copies of one attempt sent to the broker queue group
// (RoutedTimeout), the first included.
const MaxCopies = 16

// Config configures a gateway. Zero values take the documented defaults.
type Config struct {
	// ID names this gateway; it is a token of its reply subjects (default NUID).
	ID string
	// Listen is the HTTP address (default 127.0.0.1:8080): the API,
	// /healthz and /readyz. fd:N serves on the listening socket inherited
	// as file descriptor N (internal/listen), as from a systemd .socket
	// unit.
	Listen string
	// AdminListen is the address (or fd:N) of the dashboard (Extra) and
	// /metrics.
	// Empty: they share the public listener, as in `switchyard dev`.
	AdminListen string
	// TLSCert and TLSKey (PEM files, both or neither) make the public
	// listener speak HTTPS, HTTP/2 included.
	TLSCert, TLSKey string
	// BodyTimeout bounds the time a request body takes to arrive in full
	// after its headers (default 30s); the response is not bounded by it.
	BodyTimeout time.Duration
	// HeaderTimeout bounds the time a request's headers take to arrive
	// (default DefaultHeaderTimeout); past it the connection is closed.
	HeaderTimeout time.Duration
	// KeepAliveTimeout is how long a keep-alive connection may sit idle
	// between requests (default DefaultKeepAliveTimeout) before it is closed.
	KeepAliveTimeout time.Duration
	// MaxConns bounds the open client connections (default
	// DefaultMaxConns); one more is refused at once.
	MaxConns int
	// OfflineWait is how long a request whose attempt failed with the
	// gateway's NATS link (before any replica accepted it) waits for the
	// link to carry again (reconnected, not silent) before it is answered
	// 503 router_unavailable (default DefaultOfflineWait; negative: not at
	// all). Within it, the request goes through the new connection. A new
	// request on a link that is down is answered at once. A request whose
	// replicas left the bus under it waits as long after the first it found
	// gone, for them to reconnect to another server (replicasBack).
	OfflineWait time.Duration
	// MaxInflight is a hard ceiling on open inference requests, accepted
	// or not, over the adaptive limit on those not yet accepted (0: the
	// adaptive limit only; overload.go); past either, a request is
	// refused 503 gateway_overloaded before its body is read.
	MaxInflight int
	// Prefix is the subject prefix (default "llm"); Bucket the table bucket.
	Prefix, Bucket string
	// StateDir keeps the last good table.
	StateDir string
	// MaxBody caps request bodies (default 8 MiB, or the server's max
	// payload less HeaderRoom when that is less). A limit set above what
	// the server carries is an error, never quietly lowered.
	MaxBody int64
	// AcceptTimeout is how long to wait for an adapter's accept (default 1s).
	AcceptTimeout time.Duration
	// RoutedTimeout is how long an attempt waits for a broker to say where
	// it routed the request (its routed notice, or a rejection) before it
	// sends another copy to the broker queue group (default
	// DefaultRoutedTimeout; negative: never). NATS picks a queue member at
	// random, so a copy finds a live broker where the first went to one
	// cut off or stalled, which the server keeps in the group until its
	// pings give the connection up. Each copy has a request id of its own;
	// the first a broker speaks for is the attempt's, and a replica routed
	// another copy is told to cancel it. Copies are sent within the accept
	// timeout, and within up to AcceptWaitsUnseen of them while no broker
	// spoke for any (leg.copyLonger), at most MaxCopies, by half the
	// active requests at most (at least 16).
	RoutedTimeout time.Duration
	// IdleTimeout fails a reply silent for this long (default 60s; keepalives reset it).
	IdleTimeout time.Duration
	// ProbeAfter is the silence after which the gateway asks NATS whether
	// the replica's adapter is still there, and again after as long while
	// the silence lasts: an adapter found gone twice in a row, a fifth of
	// ProbeAfter apart, fails the answer then (continued elsewhere when it
	// can be), not at IdleTimeout. Default two keepalive periods (10s);
	// negative: never. Only a value below IdleTimeout probes.
	ProbeAfter time.Duration
	// DefaultTimeout bounds a request without X-Request-Timeout (default 10m).
	DefaultTimeout time.Duration
	// MaxRetries per request (default 2, -1: none) under a budget of
	// RetryBudget of the active requests (default 0.2, at least 3
	// concurrent retries).
	MaxRetries  int
	RetryBudget float64
	// ShutdownGrace lets in-flight requests finish on shutdown (default 30s).
	ShutdownGrace time.Duration
	// WriteTimeout bounds each write to a streaming client (default 10s;
	// the deadline is renewed once less than three quarters of it remain,
	// so a write has from ¾ of it to all of it): a client that stops
	// reading fails its own stream, never the others.
	WriteTimeout time.Duration
	// HandoffDepth is the per-request buffer between the NATS reply
	// subscription and the HTTP writer (default 256 messages); a client
	// slower than that fails its own stream.
	HandoffDepth int
	Logger       *slog.Logger
	// TracerProvider receives the gateway's spans (nil: none are made;
	// internal/telemetry builds one from the environment).
	TracerProvider trace.TracerProvider
	// Decide says which part decides the HTTP requests: DecideLocal (the
	// default) runs the policy in this process and publishes each body
	// once, straight to the chosen replica; DecideBroker publishes to
	// llm.gw.<tenant> for the brokers, as direct tenants' requests go.
	Decide string
	// Region is the region a gateway deciding locally decides in: its
	// replicas first (broker/policy, "Regions"). The gateway reads the
	// routing table from the region's copy of Bucket when there is one
	// (kv.Config.Region). Empty: no region.
	Region string
	// WarmUp bounds how long a gateway deciding locally waits, after it
	// starts, for a heartbeat from every replica its table has ready
	// before /readyz passes (default 2s, negative: no wait; at most a
	// minute), as broker.Config.WarmUp bounds a broker's wait before it
	// joins the queue group. The command's --warm-up 0 is "no wait" for
	// both.
	WarmUp time.Duration
	// Stages, when set, records the stage timestamps of a sample of the
	// requests (internal/stages); nil records nothing.
	Stages *stages.Recorder
	// Registerer receives the gateway's metrics; Gatherer serves /metrics.
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer
	// LinkCheck is how often the gateway pings its NATS server (default
	// 1s). Two pings in a row without a pong within LinkCheck (the checks'
	// own or /readyz's) mark the link silent, about three LinkChecks after
	// a cut: /readyz fails and new requests get 503 router_unavailable at
	// once, until a pong comes back. One late pong changes nothing. A cut
	// link that still looks open is otherwise noticed only by the
	// connection's own pings (three missed, 15 s), and requests sent
	// meanwhile wait for the accept timeout.
	LinkCheck time.Duration
	// Ready adds a readiness condition to /readyz (nil: none).
	Ready func() error
	// Extra mounts more handlers on the gateway's mux (the dashboard).
	Extra map[string]http.Handler
	// MaxColdWaits bounds the requests held while their cold model loads
	// (on_cold: wait; default 256); more get the 503 at once.
	MaxColdWaits int
	// ColdKeepalive is the interval of the SSE comments sent to a held
	// stream (default 10s).
	ColdKeepalive time.Duration
	// MaxFileBytes and MaxFileLines bound an upload to /v1/files (default
	// 200 MiB and 50,000 lines); MaxBody does not apply to it.
	MaxFileBytes int64
	MaxFileLines int
	// BatchReplicas are the replicas of the files object store and the
	// batches bucket when the gateway creates them (default 1).
	BatchReplicas int
	// CORSOrigins are the browser origins allowed to call the gateway
	// ("*": any); none, the default, answers no preflight.
	CORSOrigins []string
}

// Where the gateway's HTTP requests are decided (Config.Decide).
const (
	DecideLocal  = "local"
	DecideBroker = "broker"
)

// Gateway serves the OpenAI API over NATS.
type Gateway struct {
	nc      *nats.Conn
	cfg     Config
	subj    subjects.Subjects
	log     *slog.Logger
	tracer  trace.Tracer // nil: no spans
	table   atomic.Pointer[table.Snapshot]
	watcher *kv.Watcher
	// watcherRef is watcher for the readers outside the start goroutine
	// (/readyz, the metric), nil before start.
	watcherRef atomic.Pointer[kv.Watcher]
	disp       *dispatcher
	metrics    *metrics
	budget     retryBudget
	conc       *concurrency // the adaptive concurrency limit
	cold       *coldWaits
	replyPfx   string
	// routedPfx is the subject space of the brokers' routed notices to
	// this gateway (subjects.RoutedPrefix), with its trailing dot.
	routedPfx string
	mux       http.Handler
	adminMux  *http.ServeMux // nil: the admin handlers are on mux
	tls       *tls.Config
	maxBody   int64
	exposed   string    // Access-Control-Expose-Headers
	parsed    sync.Pool // *parsed, the feature extraction's buffers
	batch     batchStore
	// dec decides requests in this process (nil: the brokers decide);
	// warm is set, and warmed closed, once it has heard the replicas its
	// table has ready.
	dec    *decider.Decider
	warm   atomic.Bool
	warmed chan struct{}

	silent     atomic.Bool // PongsToMiss pings in a row got no pong in time, and none since
	probeMu    sync.Mutex
	ping       *linkPing       // the link check's ping under way; nil: none
	misses     int             // pings in a row without a pong in time (probeMu)
	lastPong   atomic.Int64    // unix ns of the link's last pong (or reconnect)
	probeWG    *sync.WaitGroup // the owner of the pings: serve's
	probeCtx   context.Context // ends the pings: serve's
	readyMu    sync.Mutex
	readyAt    time.Time
	readyErr   error
	listenAddr atomic.Value // string
	adminAddr  atomic.Value // string
}

// Validate range-checks cfg without connecting to anything. Zero values
// stand for their defaults; errors name the flag that sets the value.
func (c *Config) Validate() error {
	var idErr error
	if c.ID != "" {
		idErr = check.Wrap("id", c.ID, subjects.ValidToken(c.ID))
	}
	var originErr error
	for _, o := range c.CORSOrigins {
		if !validOrigin(o) {
			originErr = check.Wrap("cors-origin", o, errors.New("want * or scheme://host[:port]"))
		}
	}
	var regionErr error
	if c.Region != "" {
		regionErr = check.Wrap("region", c.Region, subjects.ValidToken(c.Region))
	}
	var decideErr error
	switch c.Decide {
	case "", DecideLocal, DecideBroker:
	default:
		decideErr = check.Wrap("decide", c.Decide, errors.New("want local or broker"))
	}
	return check.All(
		idErr, originErr, decideErr, regionErr,
		check.Duration("warm-up", c.WarmUp, math.MinInt64, time.Minute),
		check.Size("max-body", c.MaxBody, 0, MaxBodyCeiling),
		check.Duration("accept-timeout", c.AcceptTimeout, 0, time.Minute),
		check.Duration("routed-timeout", c.RoutedTimeout, math.MinInt64, time.Minute),
		check.Duration("idle-timeout", c.IdleTimeout, 0, time.Hour),
		check.Duration("probe-after", c.ProbeAfter, math.MinInt64, time.Hour),
		check.Duration("default-timeout", c.DefaultTimeout, 0, 24*time.Hour),
		check.Range("max-retries", c.MaxRetries, -1, MaxRetriesCeiling),
		check.Range("retry-budget", c.RetryBudget, 0, 1),
		check.Duration("shutdown-grace", c.ShutdownGrace, 0, time.Hour),
		check.Duration("write-timeout", c.WriteTimeout, 0, 10*time.Minute),
		check.Range("handoff-depth", c.HandoffDepth, 0, 1<<16),
		check.Range("max-cold-waits", c.MaxColdWaits, 0, 1<<20),
		check.Duration("cold-keepalive", c.ColdKeepalive, 0, time.Hour),
		check.Duration("body-timeout", c.BodyTimeout, 0, time.Hour),
		check.Duration("header-timeout", c.HeaderTimeout, 0, time.Hour),
		check.Duration("keepalive-timeout", c.KeepAliveTimeout, 0, time.Hour),
		check.Duration("LinkCheck", c.LinkCheck, 0, time.Minute),
		check.Range("max-conns", c.MaxConns, 0, 1<<20),
		check.Range("max-inflight", c.MaxInflight, 0, 1<<20),
		check.Duration("offline-wait", c.OfflineWait, math.MinInt64, time.Minute),
		check.Size("max-file-bytes", c.MaxFileBytes, 0, MaxFileBytesCeiling),
		check.Range("max-file-lines", c.MaxFileLines, 0, 10_000_000),
		check.Range("batch-replicas", c.BatchReplicas, 0, 5),
		tlsErr(c.TLSCert, c.TLSKey),
	)
}

// New validates cfg and returns a gateway bound to nc.
func New(nc *nats.Conn, cfg Config) (*Gateway, error) {
	if nc == nil {
		return nil, errors.New("gateway: nil NATS connection")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.ID == "" {
		cfg.ID = nuid.Next()
	}
	// The body limit must fit in one message of the server connected to.
	room := int64(math.MaxInt64)
	if mp := nc.MaxPayload(); mp > 0 {
		room = mp - HeaderRoom
	}
	if cfg.MaxBody > room {
		return nil, fmt.Errorf("--max-body %s: the NATS server carries at most %s (max_payload %s less %s for headers)",
			check.FormatSize(cfg.MaxBody), check.FormatSize(room), check.FormatSize(nc.MaxPayload()), check.FormatSize(HeaderRoom))
	}
	if cfg.MaxBody == 0 {
		cfg.MaxBody = min(DefaultMaxBody, room)
	}
	setDefaults(&cfg)
	g := &Gateway{nc: nc, cfg: cfg, subj: subjects.New(cfg.Prefix), warmed: make(chan struct{})}
	g.log = telemetry.Logger(cfg.Logger).With("component", "gateway")
	g.tracer = telemetry.Tracer(cfg.TracerProvider, "github.com/switchyard-llm/switchyard/gateway")
	g.replyPfx = g.subj.ReplyPrefix(cfg.ID) + "."
	g.routedPfx = g.subj.RoutedPrefix(cfg.ID) + "."
	g.disp = newDispatcher(cfg.HandoffDepth, g.lateRoute)
	g.metrics = newMetrics(cfg.Registerer)
	g.cold = newColdWaits(cfg.MaxColdWaits, cfg.Registerer)
	g.conc = newConcurrency(cfg.MaxInflight, time.Now())
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "switchyard_gateway_inflight_limit",
			Help: "The adaptive concurrency limit on inference requests admitted and not yet accepted by a replica (bounded by --max-inflight): past it, requests are refused 503 gateway_overloaded.",
		}, g.conc.Limit))
		cfg.Registerer.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "switchyard_gateway_table_unreachable_seconds",
			Help: "How long the routing table's bucket has been out of reach, the last good table staying in force (0: in reach); a region cut off from the bucket's says so here.",
		}, func() float64 { return g.tableUnreachable().Seconds() }))
	}
	g.budget.ratio = cfg.RetryBudget
	g.maxBody = cfg.MaxBody
	g.exposed = exposedHeaders()
	tlsCfg, err := loadTLS(cfg.TLSCert, cfg.TLSKey)
	if err != nil {
		return nil, err
	}
	g.tls = tlsCfg
	if cfg.Decide == DecideLocal {
		// Decisions, their samples and spans, quota reservations and
		// placements are the brokers' own: the same package, the same
		// metrics (labelled with this gateway's id).
		g.dec, err = decider.New(nc, decider.Config{
			ID: cfg.ID, Prefix: cfg.Prefix, Region: cfg.Region, Logger: cfg.Logger, Component: "gateway",
			TracerProvider: cfg.TracerProvider, Registerer: cfg.Registerer, Stages: cfg.Stages,
		})
		if err != nil {
			return nil, err
		}
	}
	public, admin := g.routes()
	g.mux, g.adminMux = g.edge(public), admin
	return g, nil
}

// DefaultProbeAfter is two of the adapters' keepalive periods: a reply
// silent that long has missed a keepalive.
const DefaultProbeAfter = 2 * subjects.KeepaliveEvery * time.Second

func setDefaults(cfg *Config) {
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:8080"
	}
	if cfg.Bucket == "" {
		cfg.Bucket = subjects.DefaultBucket
	}
	if cfg.MaxBody == 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	if cfg.AcceptTimeout <= 0 {
		cfg.AcceptTimeout = time.Second
	}
	if cfg.OfflineWait == 0 {
		cfg.OfflineWait = DefaultOfflineWait
	}
	if cfg.RoutedTimeout == 0 {
		cfg.RoutedTimeout = DefaultRoutedTimeout
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 60 * time.Second
	}
	if cfg.ProbeAfter == 0 {
		cfg.ProbeAfter = DefaultProbeAfter
	}
	if cfg.DefaultTimeout <= 0 {
		cfg.DefaultTimeout = 10 * time.Minute
	}
	if cfg.MaxRetries < 0 {
		cfg.MaxRetries = 0 // none, asked for explicitly
	} else if cfg.MaxRetries == 0 {
		cfg.MaxRetries = 2
	}
	if cfg.RetryBudget == 0 {
		cfg.RetryBudget = 0.2
	}
	if cfg.ShutdownGrace <= 0 {
		cfg.ShutdownGrace = 30 * time.Second
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 10 * time.Second
	}
	if cfg.HandoffDepth <= 0 {
		cfg.HandoffDepth = 256
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxColdWaits == 0 {
		cfg.MaxColdWaits = DefaultMaxColdWaits
	}
	if cfg.ColdKeepalive <= 0 {
		cfg.ColdKeepalive = DefaultColdKeepalive
	}
	if cfg.BodyTimeout <= 0 {
		cfg.BodyTimeout = DefaultBodyTimeout
	}
	if cfg.HeaderTimeout <= 0 {
		cfg.HeaderTimeout = DefaultHeaderTimeout
	}
	if cfg.KeepAliveTimeout <= 0 {
		cfg.KeepAliveTimeout = DefaultKeepAliveTimeout
	}
	if cfg.MaxFileBytes == 0 {
		cfg.MaxFileBytes = batch.DefaultMaxFileBytes
	}
	if cfg.MaxFileLines == 0 {
		cfg.MaxFileLines = batch.DefaultMaxFileLines
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.LinkCheck <= 0 {
		cfg.LinkCheck = time.Second
	}
	if cfg.Decide == "" {
		cfg.Decide = DecideLocal
	}
	if cfg.WarmUp == 0 {
		cfg.WarmUp = 2 * time.Second
	}
}

// Decider is the deciding state of a gateway that decides its requests
// (nil with --decide broker).
func (g *Gateway) Decider() *decider.Decider { return g.dec }

// ID is the gateway's id: its reply and routed subjects carry it.
func (g *Gateway) ID() string { return g.cfg.ID }

// Handler is the gateway's HTTP handler (for tests and embedding).
func (g *Gateway) Handler() http.Handler { return g.mux }

// Table returns the routing table in force (nil before the first load).
func (g *Gateway) Table() *table.Snapshot { return g.table.Load() }

// Addr is the address the HTTP listener is bound to, once Run listens.
func (g *Gateway) Addr() string {
	s, _ := g.listenAddr.Load().(string)
	return s
}

// AdminAddr is the address the admin listener is bound to, once Serve
// listens ("" when there is none).
func (g *Gateway) AdminAddr() string {
	s, _ := g.adminAddr.Load().(string)
	return s
}

// start subscribes to replies and loads the table.
func (g *Gateway) start(ctx context.Context, wg *sync.WaitGroup) error {
	js, err := jetstream.New(g.nc)
	if err != nil {
		return err
	}
	sub, err := g.nc.Subscribe(g.replyPfx+"*", g.disp.onMsg)
	if err != nil {
		return err
	}
	_ = sub.SetPendingLimits(-1, -1)
	// The brokers' routed notices come on a subject of their own, the
	// attempt's mailbox the same.
	routed, err := g.nc.Subscribe(g.routedPfx+"*", g.disp.onMsg)
	if err != nil {
		_ = sub.Unsubscribe()
		return err
	}
	_ = routed.SetPendingLimits(-1, -1)
	if err := g.subscribeCold(ctx, wg); err != nil {
		return err
	}
	// Replies sent while the connection is down are lost, so a gap would
	// only show at the idle timeout: every request in flight fails now.
	// A reconnect is a server's answer on the new link: the link check's
	// misses on the old one no longer count.
	status := g.nc.StatusChanged(nats.DISCONNECTED, nats.RECONNECTING, nats.CLOSED, nats.CONNECTED)
	wg.Go(func() {
		defer g.nc.RemoveStatusListener(status)
		for {
			select {
			case <-ctx.Done():
				return
			case st := <-status:
				if st == nats.CONNECTED {
					g.probeMu.Lock()
					g.pongLocked()
					g.probeMu.Unlock()
					continue
				}
				if n := g.disp.disconnect(); n > 0 {
					g.log.Warn("NATS connection lost; requests in flight fail", "status", st.String(), "requests", n)
				}
			}
		}
	})
	g.probeWG, g.probeCtx = wg, ctx
	wg.Go(func() { g.checkLink(ctx) })
	kcfg := kv.Config{
		Bucket:     g.cfg.Bucket,
		Region:     g.cfg.Region,
		StateDir:   g.cfg.StateDir,
		Logger:     g.log,
		OnSnapshot: func(s *table.Snapshot) { g.table.Store(s) },
	}
	if g.dec != nil {
		kcfg.OnSnapshot = func(s *table.Snapshot) {
			g.dec.SetTable(s)
			g.table.Store(s)
		}
		kcfg.OnInvalid = g.dec.InvalidValue
		if err := g.dec.Start(ctx); err != nil {
			return err
		}
	}
	g.watcher = kv.New(js, kcfg)
	g.watcherRef.Store(g.watcher)
	if g.dec != nil {
		wg.Go(func() {
			defer g.dec.Stop()
			select {
			case <-g.watcher.Ready():
			case <-ctx.Done():
				return
			}
			if g.dec.WarmUp(ctx, g.cfg.WarmUp) {
				g.warm.Store(true)
				close(g.warmed)
			}
			<-ctx.Done()
		})
	}
	wg.Go(func() {
		defer func() { _, _ = sub.Unsubscribe(), routed.Unsubscribe() }()
		if err := g.watcher.Run(ctx); err != nil && ctx.Err() == nil {
			g.log.Error("table watcher stopped", "err", err)
		}
	})
	return nil
}

// checkLink pings the NATS server every LinkCheck until ctx ends and marks
// the link silent once two pings in a row got no pong within LinkCheck
// (PongsToMiss). The connection's own pings notice a cut link only after
// three are missed; this one stops new requests from being sent into it
// within seconds (about three LinkChecks), and one late pong, which a busy
// machine or a stalled server can cause, stops nothing. Requests in flight
// are left to their own bounds: a link that heals before the connection is
// given up delivers their replies late, not never.
func (g *Gateway) checkLink(ctx context.Context) {
	t := time.NewTimer(g.cfg.LinkCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// The next ping a LinkCheck after this one began: at once after
		// a miss.
		start := time.Now()
		g.awaitPong(ctx, g.cfg.LinkCheck)
		t.Reset(time.Until(start.Add(g.cfg.LinkCheck)))
	}
}

// PongsToMiss is how many pings in a row must get no pong in time before
// the link is marked silent.
const PongsToMiss = 2

// linkPing is one ping of the link check.
type linkPing struct {
	done   chan struct{} // closed when its pong came or it gave up
	missed bool          // counted as missed (probeMu)
}

// awaitPong pings the server (or joins the ping under way) and waits up to
// timeout for the pong; none by then is a miss, counted once however many
// waited for it. A ping already missed is not joined: the next waiter sends
// another. Each ping runs in a goroutine of its own: behind a write the cut
// link does not take, the connection itself can block for its write
// timeout (5 s), and the pings sent meanwhile with it; a pong however late
// says the link answers.
func (g *Gateway) awaitPong(ctx context.Context, timeout time.Duration) {
	g.probeMu.Lock()
	p := g.pingLocked(ctx, timeout)
	g.probeMu.Unlock()
	if p == nil {
		return
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
	case <-ctx.Done():
	case <-t.C:
		g.probeMu.Lock()
		if !p.missed {
			g.missLocked(p, fmt.Errorf("no pong within %v", timeout))
		}
		g.probeMu.Unlock()
	}
}

// pingLocked sends a ping, or returns the one under way (nil when ctx
// is over). probeMu must be held.
func (g *Gateway) pingLocked(ctx context.Context, timeout time.Duration) *linkPing {
	if (g.ping == nil || g.ping.missed) && ctx.Err() == nil {
		p := &linkPing{done: make(chan struct{})}
		g.ping = p
		g.probeWG.Go(func() {
			fctx, cancel := context.WithTimeout(ctx, timeout)
			err := g.nc.FlushWithContext(fctx)
			cancel()
			g.probeMu.Lock()
			if g.ping == p {
				g.ping = nil
			}
			switch {
			case ctx.Err() != nil:
			case err == nil:
				g.pongLocked()
			case errors.Is(err, nats.ErrConnectionClosed) && !g.nc.IsClosed():
				// The connection was given up under the ping and is
				// being replaced: the ping says nothing of the link the
				// next one will use (the reconnect says it answers).
			case !p.missed:
				g.missLocked(p, err)
			}
			g.probeMu.Unlock()
			close(p.done)
		})
	}
	return g.ping
}

// linkAnsweredSince reports whether the NATS link answered (a link-check
// pong, or a reconnect) at or after t. If it did not, a ping goes out
// now, unless one is under way, so that the link's next word comes
// within a link check.
func (g *Gateway) linkAnsweredSince(t time.Time) bool {
	if g.lastPong.Load() >= t.UnixNano() {
		return true
	}
	if g.probeCtx != nil {
		g.probeMu.Lock()
		g.pingLocked(g.probeCtx, g.cfg.LinkCheck)
		g.probeMu.Unlock()
	}
	return false
}

// missLocked counts a ping without a pong in time; the PongsToMiss-th in a
// row marks the link silent. probeMu must be held.
func (g *Gateway) missLocked(p *linkPing, err error) {
	p.missed = true
	g.misses++
	g.metrics.missedPongs.Inc()
	if g.misses >= PongsToMiss && !g.silent.Swap(true) {
		g.metrics.silences.Inc()
		g.log.Warn("NATS link silent: new requests fail until it answers", "err", err, "missed", g.misses)
	}
}

// pongLocked records a pong: the link answers. probeMu must be held.
func (g *Gateway) pongLocked() {
	g.lastPong.Store(time.Now().UnixNano())
	g.misses = 0
	if g.silent.Swap(false) {
		g.log.Info("NATS link answers again")
	}
}

// Run listens on cfg.Listen and serves until ctx is cancelled; then it stops
// accepting requests and lets in-flight ones finish within ShutdownGrace.
//
// On an inherited socket (fd:N) it accepts only once the routing table is
// loaded, waiting at most inheritedTableWait: the socket outlived the
// previous process, so the connections made while that one restarted are
// queued on it, and they are answered rather than failed with 503 the
// moment this one starts.
func (g *Gateway) Run(ctx context.Context) error {
	ln, err := listen.Listen(g.cfg.Listen)
	if err != nil {
		return err
	}
	return g.serve(ctx, ln, strings.HasPrefix(g.cfg.Listen, listen.FDPrefix))
}

// inheritedTableWait bounds how long a gateway on an inherited socket
// leaves its connections queued while it loads the routing table (from
// --state-dir, at once, or from the bucket) and, deciding itself, hears
// the replicas' heartbeats (WarmUp).
const inheritedTableWait = 10 * time.Second

// Serve is Run on a listener the caller opened. With AdminListen set it
// opens the admin listener too; both stop together.
func (g *Gateway) Serve(ctx context.Context, ln net.Listener) error {
	return g.serve(ctx, ln, false)
}

func (g *Gateway) serve(ctx context.Context, ln net.Listener, awaitTable bool) error {
	var admin net.Listener
	if g.adminMux != nil {
		var err error
		if admin, err = listen.Listen(g.cfg.AdminListen); err != nil {
			ln.Close()
			return fmt.Errorf("admin listener: %w", err)
		}
		g.adminAddr.Store(admin.Addr().String())
	}
	g.listenAddr.Store(ln.Addr().String())
	var wg sync.WaitGroup
	wctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); wg.Wait() }()
	if err := g.start(wctx, &wg); err != nil {
		ln.Close()
		if admin != nil {
			admin.Close()
		}
		return err
	}
	srv := g.server(g.mux)
	srv.TLSConfig = g.tls
	ln = newLimitListener(ln, g.cfg.MaxConns, g.tls == nil, g.metrics)
	if g.tls != nil {
		ln = tls.NewListener(ln, g.tls)
	}
	servers := []*http.Server{srv}
	errc := make(chan error, 2)
	// The admin listener first: /metrics, /ui and the probes answer while
	// the API waits for the table.
	if admin != nil {
		asrv := g.server(g.adminMux)
		servers = append(servers, asrv)
		go func() { errc <- asrv.Serve(admin) }()
		g.log.Info("admin listening", "addr", g.AdminAddr())
	}
	if awaitTable {
		g.awaitTable(ctx, inheritedTableWait)
	}
	go func() { errc <- srv.Serve(ln) }()
	g.log.Info("gateway listening", "addr", g.Addr(), "tls", g.tls != nil)
	var err error
	pending := len(servers)
	select {
	case err = <-errc:
		pending--
	case <-ctx.Done():
	}
	sctx, scancel := context.WithTimeout(context.Background(), g.cfg.ShutdownGrace)
	defer scancel()
	var serr error
	for _, s := range servers {
		if e := s.Shutdown(sctx); e != nil && serr == nil {
			serr = e
		}
	}
	for ; pending > 0; pending-- {
		if e := <-errc; err == nil && !errors.Is(e, http.ErrServerClosed) {
			err = e
		}
	}
	if errors.Is(serr, context.DeadlineExceeded) {
		for _, s := range servers {
			_ = s.Close()
		}
		return fmt.Errorf("gateway: requests still in flight after %s grace", g.cfg.ShutdownGrace)
	}
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func (g *Gateway) server(h http.Handler) *http.Server {
	return &http.Server{
		Handler: h,
		// No WriteTimeout: it would cut long SSE streams. Writes get
		// per-write deadlines through http.ResponseController instead,
		// and the body's read a deadline of its own (readBody).
		ReadHeaderTimeout: g.cfg.HeaderTimeout,
		IdleTimeout:       g.cfg.KeepAliveTimeout,
		ErrorLog:          slog.NewLogLogger(g.log.Handler(), slog.LevelWarn),
	}
}

// awaitTable returns once the routing table is loaded and, for a gateway
// that decides itself, the replicas its table has ready were heard (or
// WarmUp waited for them), after bound, or when ctx ends: the connections
// queued on an inherited socket are answered by a gateway that knows the
// replicas, not with no_replicas.
func (g *Gateway) awaitTable(ctx context.Context, bound time.Duration) {
	deadline := time.NewTimer(bound)
	defer deadline.Stop()
	select {
	case <-g.watcher.Ready():
	case <-ctx.Done():
		return
	case <-deadline.C:
		g.log.Warn("serving before the routing table is loaded", "waited", bound)
		return
	}
	if g.dec == nil {
		return
	}
	select {
	case <-g.warmed:
	case <-ctx.Done():
	case <-deadline.C:
		g.log.Warn("serving before the replicas' heartbeats were heard", "waited", bound)
	}
}
