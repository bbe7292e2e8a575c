// Package loader brings cold-tier models up and takes them down again. It
// answers llm.control.load (the brokers' request for a model that has no
// ready replica) in a queue group, claims the load in the llm-loads KV
// bucket so that one load runs however many brokers ask and however many
// loaders share the work, runs the model's load action (exec, webhook or a
// Kubernetes scale), and reports every step on llm.control.load.status. A
// load is ready when a replica of the model first heartbeats ready. A cold
// model with idle_unload_after is drained and unloaded after that long
// without a request.
package loader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-llm/switchyard/internal/check"
	"github.com/switchyard-llm/switchyard/internal/clip"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
	"github.com/switchyard-llm/switchyard/table/kv"
)

// ErrConfig wraps every configuration error.
var ErrConfig = errors.New("invalid loader configuration")

// Defaults of Config.
const (
	DefaultCooldown     = 30 * time.Second
	DefaultLoadTimeout  = 10 * time.Minute
	DefaultDrainTimeout = 2 * time.Minute
)

// Config configures a Loader. Zero values take the documented defaults;
// out-of-range values are an error (Validate).
type Config struct {
	// ID names this loader in status messages and claims (default NUID).
	ID string
	// Prefix is the subject prefix; Bucket the routing table's bucket.
	Prefix, Bucket string
	// Cooldown is how long a failed load blocks the next one (default 30s).
	Cooldown time.Duration
	// LoadTimeout is how long a load may take from its request to the first
	// ready heartbeat before it counts as failed (default 10m).
	LoadTimeout time.Duration
	// DrainTimeout bounds the wait for an unloading model's requests to
	// finish before its unload action runs (default 2m).
	DrainTimeout time.Duration
	// IdleCheck is how often idle models are looked for (default 1s).
	IdleCheck time.Duration
	// ClaimReplicas is the replica count of the llm-loads bucket when the
	// loader creates it (default 1; 3 on a 3-node cluster).
	ClaimReplicas int
	// Actions runs load and unload actions (default: the table's, through
	// Standard with the in-cluster Kubernetes credentials when present).
	Actions Actions
	Logger  *slog.Logger
	// Registerer receives the loader's metrics (nil: not registered).
	Registerer prometheus.Registerer
}

// Validate range-checks c. Zero values stand for their defaults; errors
// name the flag that sets the value.
func (c *Config) Validate() error {
	var idErr, prefixErr error
	if c.ID != "" {
		idErr = check.Wrap("id", c.ID, subjects.ValidToken(c.ID))
	}
	if c.Prefix != "" {
		prefixErr = check.Wrap("prefix", c.Prefix, subjects.ValidToken(c.Prefix))
	}
	return check.All(
		idErr, prefixErr,
		check.Duration("cooldown", c.Cooldown, 0, 24*time.Hour),
		check.Duration("load-timeout", c.LoadTimeout, 0, 24*time.Hour),
		check.Duration("drain-timeout", c.DrainTimeout, 0, 24*time.Hour),
		check.Duration("idle-check", c.IdleCheck, 0, time.Hour),
		check.Range("kv-replicas", c.ClaimReplicas, 0, 5),
	)
}

func (c *Config) fill() error {
	if err := c.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if c.ID == "" {
		c.ID = nuid.Next()
	}
	if c.Bucket == "" {
		c.Bucket = subjects.DefaultBucket
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{
		{&c.Cooldown, DefaultCooldown},
		{&c.LoadTimeout, DefaultLoadTimeout},
		{&c.DrainTimeout, DefaultDrainTimeout},
		{&c.IdleCheck, time.Second},
	} {
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if c.ClaimReplicas == 0 {
		c.ClaimReplicas = 1
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Actions == nil {
		c.Actions = &Standard{HTTP: &http.Client{Timeout: 30 * time.Second}, Kubernetes: InCluster()}
	}
	return nil
}

// Loader runs loads and unloads. Run owns its goroutines.
type Loader struct {
	nc      *nats.Conn
	cfg     Config
	subj    subjects.Subjects
	log     *slog.Logger
	metrics *metrics
	watcher *kv.Watcher
	claims  jetstream.KeyValue
	routing jetstream.KeyValue
	serving atomic.Bool

	mu       sync.Mutex
	running  map[string]*job          // model/version key → the load or unload this loader runs
	replicas map[string]*seen         // replica id → its last heartbeat
	active   map[string]time.Time     // model → last request seen
	measured map[string]time.Duration // model → last measured time to ready
	started  time.Time                // when Run began: models up then are given a full idle period
	jobs     sync.WaitGroup           // running jobs; added to under mu, and only while !stopped
	stopped  bool                     // Run is waiting for its jobs: no new one starts
	ctx      context.Context          // Run's, for the jobs
	ready    map[string]chan struct{} // model/version key → closed at its first ready heartbeat
}

// seen is what a replica's last heartbeat said.
type seen struct {
	model, version, state string
	busy                  bool
	at                    time.Time
}

// job is one load or unload in flight on this loader.
type job struct {
	unload    bool
	requested time.Time
}

// New validates cfg and returns a loader bound to nc.
func New(nc *nats.Conn, cfg Config) (*Loader, error) {
	if nc == nil {
		return nil, fmt.Errorf("%w: nil NATS connection", ErrConfig)
	}
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	l := &Loader{
		nc: nc, cfg: cfg, subj: subjects.New(cfg.Prefix),
		log:      cfg.Logger.With("component", "loader", "loader", cfg.ID),
		running:  map[string]*job{},
		replicas: map[string]*seen{},
		active:   map[string]time.Time{},
		measured: map[string]time.Duration{},
		ready:    map[string]chan struct{}{},
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	l.metrics = m
	return l, nil
}

// Run serves until ctx ends, then waits for the loads and unloads it
// started (their actions are cancelled with ctx).
func (l *Loader) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	js, err := jetstream.New(l.nc)
	if err != nil {
		return err
	}
	// Without its buckets the loader can claim nothing: it waits for them,
	// as a restart would, rather than exit while JetStream is away.
	for wait := 250 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		if err = l.openBuckets(ctx, js); err == nil {
			break
		}
		l.log.Warn("KV buckets unavailable; retrying", "err", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	l.watcher = kv.New(js, kv.Config{Bucket: l.cfg.Bucket, Logger: l.log})
	wg.Go(func() {
		if err := l.watcher.Run(ctx); err != nil && ctx.Err() == nil {
			l.log.Error("table watcher stopped", "err", err)
		}
	})
	select {
	case <-l.watcher.Ready():
	case <-ctx.Done():
		return nil
	}
	l.mu.Lock()
	l.ctx, l.started = ctx, time.Now()
	l.mu.Unlock()
	defer func() {
		// A load request handled while Run returns may have claimed its
		// load already: under mu it sees stopped and starts nothing, or
		// its job is counted before the wait.
		cancel() // jobs end with ctx
		l.mu.Lock()
		l.stopped = true
		l.mu.Unlock()
		l.jobs.Wait()
	}()

	var subs []*nats.Subscription
	defer func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}()
	for _, s := range []struct {
		subject, queue string
		fn             nats.MsgHandler
	}{
		{l.subj.HeartbeatAll(), "", l.onHeartbeat},
		{l.subj.UsageAll(), "", l.onUsage},
		{l.subj.ControlLoad(), subjects.LoaderQueue, l.onLoad},
	} {
		sub, err := l.nc.QueueSubscribe(s.subject, s.queue, s.fn)
		if err != nil {
			return err
		}
		_ = sub.SetPendingLimits(-1, 64<<20)
		subs = append(subs, sub)
	}
	if err := l.nc.Flush(); err != nil {
		return err
	}
	l.serving.Store(true)
	defer l.serving.Store(false)
	l.log.Info("loader serving", "subject", l.subj.ControlLoad(), "queue", subjects.LoaderQueue)
	t := time.NewTicker(l.cfg.IdleCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			l.forget(now)
			l.unloadIdle(now)
		}
	}
}

// openBuckets opens the claims bucket (creating it when missing: an
// existing one is used as it is, since an operator may have made it with
// more replicas) and the routing table's.
func (l *Loader) openBuckets(ctx context.Context, js jetstream.JetStream) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	claims, err := js.KeyValue(ctx, subjects.LoadsBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		claims, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: subjects.LoadsBucket, Description: "Switchyard loader claims: one load or unload per model version",
			History: 1, Replicas: l.cfg.ClaimReplicas,
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			claims, err = js.KeyValue(ctx, subjects.LoadsBucket) // another loader made it first
		}
	}
	if err != nil {
		return fmt.Errorf("bucket %s: %w", subjects.LoadsBucket, err)
	}
	routing, err := js.KeyValue(ctx, l.cfg.Bucket)
	if err != nil {
		return fmt.Errorf("bucket %s: %w", l.cfg.Bucket, err)
	}
	l.claims, l.routing = claims, routing
	return nil
}

// Serving reports whether the loader has subscribed to load requests.
func (l *Loader) Serving() bool { return l.serving.Load() }

// onLoad handles one llm.control.load.
func (l *Loader) onLoad(m *nats.Msg) {
	var req subjects.ControlLoad
	if err := json.Unmarshal(m.Data, &req); err != nil || !table.ValidName(req.Model) || (req.Version != "" && !table.ValidName(req.Version)) {
		l.log.Warn("ignoring a malformed load request", "data", clip.Text(m.Data, 200))
		return
	}
	now := time.Now()
	snap := l.watcher.Snapshot()
	var model *table.Model
	if snap != nil {
		model = snap.Models[req.Model]
	}
	if model == nil || model.Tier != table.TierCold {
		l.log.Warn("ignoring a load request for a model that is not cold-tier", "model", req.Model)
		return
	}
	l.mu.Lock()
	l.active[req.Model] = now
	_, busy := l.running[key(req.Model, req.Version)]
	ctx := l.ctx
	l.mu.Unlock()
	if busy {
		l.metrics.deduplicated.WithLabelValues(req.Model).Inc()
		return
	}
	if l.hasReady(req.Model, req.Version, now) {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ok, err := l.claim(cctx, req.Model, req.Version, phaseLoading, now)
	if err != nil {
		l.log.Warn("could not claim a load", "model", req.Model, "err", err)
		return
	}
	if !ok {
		l.metrics.deduplicated.WithLabelValues(req.Model).Inc()
		return
	}
	l.startLoad(ctx, req.Model, req.Version, model, now)
}

// hasReady reports whether a live replica of model (and version, if given)
// heartbeats ready.
func (l *Loader) hasReady(model, version string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.replicas {
		if r.model == model && (version == "" || r.version == version) && r.state == subjects.StateReady && now.Sub(r.at) < liveFor {
			return true
		}
	}
	return false
}

// maxReplicas bounds the replicas tracked.
const maxReplicas = 100_000

// known reports whether model is in the routing table: the loader keeps
// state only for those, so made-up names cannot grow its maps.
func (l *Loader) known(model string) bool {
	snap := l.watcher.Snapshot()
	return snap != nil && snap.Models[model] != nil
}

// liveFor is how long a replica counts as present after its last heartbeat.
const liveFor = 5 * time.Second

func (l *Loader) onHeartbeat(m *nats.Msg) {
	var hb subjects.Heartbeat
	if json.Unmarshal(m.Data, &hb) != nil || subjects.ValidToken(hb.Replica) != nil || !subjects.ValidState(hb.State) {
		return
	}
	now := time.Now()
	busy := hb.Running > 0 || hb.Waiting > 0 || hb.Inflight > 0
	known := l.known(hb.Model)
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.replicas[hb.Replica]; !ok && (!known || len(l.replicas) >= maxReplicas) {
		return // only replicas of the table's models, and a bounded number
	}
	l.replicas[hb.Replica] = &seen{model: hb.Model, version: hb.Version, state: hb.State, busy: busy, at: now}
	if busy {
		l.active[hb.Model] = now
	}
	if hb.State == subjects.StateReady {
		for _, k := range []string{key(hb.Model, hb.Version), key(hb.Model, "")} {
			if c := l.ready[k]; c != nil {
				close(c)
				delete(l.ready, k)
			}
		}
	}
}

// forget drops replicas silent for a minute.
func (l *Loader) forget(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, r := range l.replicas {
		if now.Sub(r.at) > time.Minute {
			delete(l.replicas, id)
		}
	}
}

func (l *Loader) onUsage(m *nats.Msg) {
	var u subjects.Usage
	if json.Unmarshal(m.Data, &u) != nil || !l.known(u.Model) {
		return
	}
	l.mu.Lock()
	l.active[u.Model] = time.Now()
	l.mu.Unlock()
}

// publish sends a status and counts it.
func (l *Loader) publish(st subjects.LoadStatus) {
	st.Loader, st.SentUnixMillis = l.cfg.ID, time.Now().UnixMilli()
	b, err := json.Marshal(st)
	if err == nil {
		err = l.nc.Publish(l.subj.ControlLoadStatus(), b)
	}
	if err != nil {
		l.log.Warn("load status not sent", "model", st.Model, "phase", st.Phase, "err", err)
	}
	l.log.Info("load status", "model", st.Model, "version", st.Version, "phase", st.Phase, "elapsed_ms", st.ElapsedMillis, "error", st.Error)
}

// key names a model version in maps and in the claims bucket.
func key(model, version string) string {
	if version == "" {
		version = "_"
	}
	return model + "/" + version
}
