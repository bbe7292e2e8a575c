package batch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-llm/switchyard/internal/check"
	"github.com/switchyard-llm/switchyard/subjects"
)

// Defaults of a batcher.
const (
	DefaultConcurrency    = 256
	DefaultAckWait        = 30 * time.Second
	DefaultRequestTimeout = 10 * time.Minute
	DefaultSuperviseEvery = 500 * time.Millisecond
	// ResultsTTL is how long a line's result outlives its batch's
	// finalizing when the finalizer could not remove it.
	ResultsTTL = 72 * time.Hour
	// claimStale is when another batcher may take over a transition whose
	// batcher went silent.
	claimStale = time.Minute
	// maxAttempts bounds the tries of a line whose replica failed (a 5xx
	// other than 503): after them it goes to the error file. Refusals
	// (429, 503) are never counted as failures.
	maxAttempts = 5
	// publishTimeout bounds the wait for an item's acknowledgement by the
	// stream.
	publishTimeout = 30 * time.Second
)

// Config configures a batcher. Zero values take the defaults.
type Config struct {
	// ID names the batcher in the claims it writes (default NUID).
	ID string
	// Prefix is the subject prefix (default "llm").
	Prefix string
	// Concurrency bounds the lines in flight (default 256). Below it the
	// batcher paces on the pool's free room in its load view, and on the
	// brokers' refusals where it has no view.
	Concurrency int
	// AckWait is how long an item delivered to a batcher that vanished
	// waits before it is delivered again (default 30s); a running line
	// tells JetStream it is still in progress well within it.
	AckWait time.Duration
	// RequestTimeout bounds one line's request (default 10m).
	RequestTimeout time.Duration
	// SuperviseEvery is how often the batcher looks over the batches
	// (default 500ms): expands new ones, finalizes finished, cancelled
	// and expired ones, and writes progress.
	SuperviseEvery time.Duration
	// Replicas of the stream and buckets the batcher creates (default 1).
	Replicas   int
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Validate range-checks c; errors name the flag that sets the value.
func (c *Config) Validate() error {
	var idErr error
	if c.ID != "" {
		idErr = check.Wrap("id", c.ID, subjects.ValidToken(c.ID))
	}
	return check.All(idErr,
		check.Range("concurrency", c.Concurrency, 0, 1<<16),
		check.Duration("ack-wait", c.AckWait, 0, time.Hour),
		check.Duration("request-timeout", c.RequestTimeout, 0, 24*time.Hour),
		check.Duration("supervise-every", c.SuperviseEvery, 0, time.Minute),
		check.Range("kv-replicas", c.Replicas, 0, 5),
	)
}

// Batcher takes batch items from the work-queue stream and sends each
// through the brokers. Any number run side by side.
type Batcher struct {
	nc      *nats.Conn
	cfg     Config
	subj    subjects.Subjects
	log     *slog.Logger
	metrics *metrics
	js      jetstream.JetStream
	store   *Store
	results jetstream.KeyValue
	items   jetstream.Stream

	adm     admission
	records recordCache
	counts  progress

	workMu  sync.Mutex
	working map[string]bool // batches with an expansion or finalizing running here
}

// New validates cfg and returns a batcher bound to nc.
func New(nc *nats.Conn, cfg Config) (*Batcher, error) {
	if nc == nil {
		return nil, errors.New("batcher: nil NATS connection")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.ID == "" {
		cfg.ID = nuid.Next()
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = DefaultConcurrency
	}
	if cfg.AckWait == 0 {
		cfg.AckWait = DefaultAckWait
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	if cfg.SuperviseEvery == 0 {
		cfg.SuperviseEvery = DefaultSuperviseEvery
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	b := &Batcher{nc: nc, cfg: cfg, subj: subjects.New(cfg.Prefix), working: map[string]bool{}}
	b.log = cfg.Logger.With("component", "batcher", "batcher", cfg.ID)
	b.metrics = newMetrics(cfg.Registerer)
	b.adm.init(cfg.Concurrency, b.metrics, cfg.Now)
	b.adm.view = newLoadView(cfg.ID, b.adm.wake, func(kind string) { b.metrics.bad.WithLabelValues(kind).Inc() })
	return b, nil
}

// open creates or opens what the batcher uses.
func (b *Batcher) open(ctx context.Context) error {
	js, err := jetstream.New(b.nc, jetstream.WithPublishAsyncTimeout(publishTimeout))
	if err != nil {
		return err
	}
	b.js = js
	if b.store, err = OpenStore(ctx, js, b.cfg.Replicas); err != nil {
		return err
	}
	b.store.now = b.cfg.Now
	if b.results, err = ensureKV(ctx, js, subjects.ResultsBucket, b.cfg.Replicas, ResultsTTL); err != nil {
		return err
	}
	cfg := jetstream.StreamConfig{
		Name: subjects.ItemsStream, Subjects: []string{b.subj.BatchItemsAll()},
		Retention: jetstream.WorkQueuePolicy, Replicas: max(b.cfg.Replicas, 1),
		Duplicates:  10 * time.Minute,
		Description: "Switchyard: the lines of running batches, one subject per batch",
	}
	b.items, err = js.Stream(ctx, subjects.ItemsStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		b.items, err = js.CreateStream(ctx, cfg)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			b.items, err = js.Stream(ctx, subjects.ItemsStream)
		}
	}
	if err != nil {
		return fmt.Errorf("stream %s: %w", subjects.ItemsStream, err)
	}
	return nil
}

// Run serves until ctx ends. Lines in flight then are not acknowledged:
// JetStream gives them to another batcher.
func (b *Batcher) Run(ctx context.Context) error {
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err := b.open(octx)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	b.log.Info("batcher running", "items", subjects.ItemsStream, "concurrency", b.cfg.Concurrency)
	var wg sync.WaitGroup
	defer wg.Wait()
	stopView, err := b.watchLoad(ctx, &wg)
	if err != nil {
		return err
	}
	defer stopView()
	pullers := newPullers(b, &wg)
	defer pullers.stop()
	tick := time.NewTicker(b.cfg.SuperviseEvery)
	defer tick.Stop()
	for {
		if active, ok := b.supervise(ctx, &wg); ok {
			pullers.set(ctx, active)
		}
		b.adm.observe()
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// watchLoad subscribes the load view to the replicas' heartbeats and load
// deltas and to the batchers' announcements, and announces this batcher
// every AnnounceEvery on a goroutine of wg; stop ends both.
func (b *Batcher) watchLoad(ctx context.Context, wg *sync.WaitGroup) (stop func(), err error) {
	v := b.adm.view
	var subs []*nats.Subscription
	unsubscribe := func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}
	for _, s := range []struct {
		subject string
		h       nats.MsgHandler
	}{
		{b.subj.HeartbeatAll(), func(m *nats.Msg) { v.onHeartbeat(m, b.cfg.Now()) }},
		{b.subj.LoadAll(), v.onLoad},
		{b.subj.BatcherPresence(), func(m *nats.Msg) { v.onPresence(m, b.cfg.Now()) }},
	} {
		sub, err := b.nc.Subscribe(s.subject, s.h)
		if err != nil {
			unsubscribe()
			return nil, fmt.Errorf("subscribe %s: %w", s.subject, err)
		}
		subs = append(subs, sub)
	}
	actx, cancel := context.WithCancel(ctx)
	wg.Go(func() {
		t := time.NewTicker(AnnounceEvery)
		defer t.Stop()
		for {
			_ = b.nc.Publish(b.subj.BatcherPresence(), []byte(b.cfg.ID))
			select {
			case <-actx.Done():
				return
			case <-t.C:
			}
		}
	})
	return func() { cancel(); unsubscribe() }, nil
}

// claim takes rec's transition for this batcher unless another holds a
// fresh claim; it returns the record as claimed, or nil.
func (b *Batcher) claim(ctx context.Context, rec *Record, fn func(*Record) error) *Record {
	now := b.cfg.Now()
	var taken bool
	out, err := updateRecord(ctx, b.store.batches, rec.Tenant, rec.ID, func(r *Record) error {
		taken = false
		if r.Status != rec.Status {
			return ErrUnchanged
		}
		if r.Owner != "" && r.Owner != b.cfg.ID && now.Sub(time.UnixMilli(r.OwnedUnixMs)) < claimStale {
			return ErrUnchanged
		}
		r.Owner, r.OwnedUnixMs = b.cfg.ID, now.UnixMilli()
		if fn != nil {
			if err := fn(r); err != nil {
				return err
			}
		}
		taken = true
		return nil
	})
	if err != nil {
		if ctx.Err() == nil {
			b.log.Warn("claim", "batch", rec.ID, "err", err)
		}
		return nil
	}
	if !taken {
		return nil
	}
	return out
}

// work runs fn for batch id on a goroutine of wg, unless one runs already.
func (b *Batcher) work(wg *sync.WaitGroup, id string, fn func()) {
	b.workMu.Lock()
	defer b.workMu.Unlock()
	if b.working[id] {
		return
	}
	b.working[id] = true
	wg.Go(func() {
		defer func() {
			b.workMu.Lock()
			delete(b.working, id)
			b.workMu.Unlock()
		}()
		fn()
	})
}
