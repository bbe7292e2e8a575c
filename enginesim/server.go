package enginesim

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-llm/switchyard/internal/check"
	"github.com/switchyard-llm/switchyard/internal/kvevents"
)

// ServerConfig configures the real-time HTTP shell around an Engine.
type ServerConfig struct {
	// Engine is the simulated engine; Engine.Model is the served model name.
	Engine Config
	// Speed scales time: 2 runs the engine twice as fast as its costs say
	// (default 1).
	Speed float64
	// Adapters are the LoRA adapters served, listed in /v1/models with the
	// model as parent. When set and Engine.MaxLoras is 0, one slot is used.
	Adapters []string
	// Fixed bypasses the engine model: every request gets Engine.TTFTBase
	// and Engine.ITL whatever the load, for benchmarks of what sits in front.
	Fixed bool
	// MaxModelLen bounds prompt plus max_tokens (default the KV capacity).
	MaxModelLen int
	// DefaultMaxTokens is used when a request sets no max_tokens (default
	// 16); such requests finish with "stop", the others with "length".
	DefaultMaxTokens int
	// DeterministicText makes every answer the same word sequence whatever
	// the prompt, and a prompt that ends with the first k words of it is
	// answered from word k on: a continuation of an interrupted answer
	// reads exactly like the answer that was not interrupted.
	DeterministicText bool
	// KVHold is how long a prefill's KV blocks wait for their decode leg
	// (default DefaultKVHold).
	KVHold time.Duration
	// Logger receives the shell's logs (default slog.Default()).
	Logger *slog.Logger
}

// Errors of the shell.
var (
	ErrAlreadyRunning = errors.New("enginesim: server already running")
	errStopped        = errors.New("enginesim: server stopped")
)

// Server is an OpenAI-compatible engine that speaks vLLM's API and metric
// names. One goroutine, started by Run, owns the Engine and drives it in real
// time; handlers talk to it over channels.
type Server struct {
	cfg   ServerConfig
	log   *slog.Logger
	words vocabulary
	reg   *prometheus.Registry
	m     *metrics

	eng      *Engine // owned by Run
	kvpub    *kvevents.Publisher
	kvbuf    []kvevents.Event // owned by Run
	submitCh chan submitMsg
	cancelCh chan ID
	started  atomic.Bool
	stopped  chan struct{} // closed when Run returns

	wallStart time.Time // when Run started (set and read by Run only)

	inflight atomic.Int64
	snap     atomic.Pointer[Stats]
	fixed    fixedCounts
	seq      atomic.Uint64
	idSeed   uint64

	adaptersMu sync.RWMutex
	adapters   map[string]string // name → path

	stored responseStore // /v1/responses kept for previous_response_id, per replica as vLLM's store

	tracesMu   sync.Mutex
	traces     []string // the traceparents received, the last maxTraces
	priorities []int64  // the priorities of the generations accepted, the last maxTraces

	kv       kvHold       // prefills' blocks held for their decode legs
	engineID string       // remote_engine_id of this engine's prefills
	kvClient *http.Client // pulls remote prefills' blocks
}

type submitMsg struct {
	req   Request
	st    *stream
	reply chan submitReply
}

type submitReply struct {
	id  ID
	err error
}

// flight is the owner's record of a request in the engine.
type flight struct {
	st        *stream
	submitted time.Time
	last      time.Time
	reason    string
	// cached is the prompt tokens the prefix cache served when the
	// request got its first token: what its usage reports, as vLLM's
	// num_cached_tokens is set once. A request preempted and recomputed
	// later finds its own blocks cached; that recompute is the engine's
	// cost (its prefix-cache counters count it), not the prompt's hits.
	cached int
}

// Validate range-checks cfg. Zero values stand for their defaults; errors
// name the flag that sets the value.
func (cfg ServerConfig) Validate() error {
	return check.All(
		cfg.Engine.Validate(),
		check.Range("speed", cfg.Speed, 0, 1e6),
		check.Range("max-model-len", cfg.MaxModelLen, 0, 1<<24),
		check.Range("default-max-tokens", cfg.DefaultMaxTokens, 0, 1<<20),
		check.Duration("kv-hold", cfg.KVHold, 0, time.Hour),
	)
}

// NewServer returns a server; Run must be running for it to answer.
func NewServer(cfg ServerConfig) *Server {
	if cfg.Speed <= 0 || math.IsNaN(cfg.Speed) || math.IsInf(cfg.Speed, 0) {
		cfg.Speed = 1
	}
	if len(cfg.Adapters) > 0 && cfg.Engine.MaxLoras == 0 {
		cfg.Engine.MaxLoras = 1
	}
	if cfg.Engine.Model == "" {
		cfg.Engine.Model = "sim-model"
	}
	cfg.Engine = cfg.Engine.WithDefaults()
	if cfg.MaxModelLen <= 0 {
		cfg.MaxModelLen = cfg.Engine.KVBlocks * cfg.Engine.BlockTokens
	}
	if cfg.DefaultMaxTokens <= 0 {
		cfg.DefaultMaxTokens = 16
	}
	if cfg.KVHold <= 0 {
		cfg.KVHold = DefaultKVHold
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{
		cfg:      cfg,
		log:      cfg.Logger,
		words:    newVocabulary(),
		reg:      prometheus.NewRegistry(),
		eng:      New(cfg.Engine),
		submitCh: make(chan submitMsg),
		cancelCh: make(chan ID),
		stopped:  make(chan struct{}),
		idSeed:   uint64(time.Now().UnixNano()),
		adapters: make(map[string]string),
		stored:   responseStore{byID: map[string]*storedResponse{}, limit: maxStored},
	}
	for _, a := range cfg.Adapters {
		s.adapters[a] = "/adapters/" + a
	}
	s.engineID = s.newID()
	s.kvClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16, IdleConnTimeout: 30 * time.Second}}
	st := s.eng.Stats()
	s.snap.Store(&st)
	s.m = newMetrics(s)
	return s
}

// InFlight is the number of requests the server is working on.
func (s *Server) InFlight() int { return int(s.inflight.Load()) }

// Registry is the server's own Prometheus registry, served on /metrics.
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// Run drives the engine until ctx ends. Requests still in the engine then
// fail. Run may be called once.
func (s *Server) Run(ctx context.Context) error {
	if !s.started.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer close(s.stopped)
	defer s.kvClient.CloseIdleConnections()
	s.wallStart = time.Now()

	flights := make(map[ID]*flight)
	defer func() {
		for _, f := range flights {
			f.st.fail(errStopped)
		}
		s.inflight.Add(-int64(len(flights)))
	}()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	if s.kvpub != nil {
		defer s.kvpub.Close()
	}
	for {
		now := s.clock()
		s.dispatch(s.eng.Advance(now), flights)
		s.publishKV()
		st := s.eng.Stats()
		s.snap.Store(&st)

		var wake <-chan time.Time
		if next, ok := s.eng.NextEvent(); ok {
			timer.Reset(s.wallDelay(next.Sub(now)))
			wake = timer.C
		}
		select {
		case <-ctx.Done():
			return nil
		case m := <-s.submitCh:
			id, err := s.eng.Submit(m.req, s.clock())
			s.publishKV()
			if err == nil {
				flights[id] = &flight{st: m.st, submitted: s.eng.Now(), reason: m.st.reason}
				s.inflight.Add(1)
			}
			m.reply <- submitReply{id: id, err: err}
		case id := <-s.cancelCh:
			if _, ok := flights[id]; ok {
				s.eng.Cancel(id, s.clock())
				delete(flights, id)
				s.inflight.Add(-1)
			}
		case <-wake:
		}
	}
}

// PublishKVEvents turns on the engine's KV-cache event feed, as vLLM's
// --kv-events-config does: every block the prefix cache stores or evicts
// is published on cfg's PUB socket (batches of what one engine call
// changed), held for its replay socket. Call it before Run, which closes
// the publisher when it returns. The returned publisher tells the
// sockets' addresses.
func (s *Server) PublishKVEvents(cfg kvevents.PublisherConfig) (*kvevents.Publisher, error) {
	if s.started.Load() {
		return nil, ErrAlreadyRunning
	}
	p, err := kvevents.NewPublisher(cfg)
	if err != nil {
		return nil, err
	}
	s.kvpub = p
	s.eng.kv.events = true
	s.cfg.Engine.KVEvents = true
	return p, nil
}

// publishKV publishes the KV-cache events of the last engine call as one
// batch.
func (s *Server) publishKV() {
	if s.kvpub == nil {
		return
	}
	s.kvbuf = s.eng.TakeKVEvents(s.kvbuf[:0])
	if len(s.kvbuf) == 0 {
		return
	}
	b := kvevents.Batch{TS: float64(time.Now().UnixNano()) / 1e9, Events: s.kvbuf, DPRank: 0}
	s.kvpub.Publish(&b)
}

// clock is the engine's virtual time: wall time since Run started, scaled by
// Speed, on a monotonic reading.
func (s *Server) clock() time.Time {
	elapsed := float64(time.Since(s.wallStart)) * s.cfg.Speed
	return time.Unix(0, 0).Add(time.Duration(elapsed))
}

// wallDelay converts a virtual duration to wall time, rounding up so a timer
// never fires before the engine's next event.
func (s *Server) wallDelay(d time.Duration) time.Duration {
	return max(0, time.Duration(math.Ceil(float64(d)/s.cfg.Speed)))
}

// wall converts a virtual duration to seconds of wall time, as clients see
// them, for the latency histograms.
func (s *Server) wall(d time.Duration) float64 { return d.Seconds() / s.cfg.Speed }

func (s *Server) dispatch(evs []Event, flights map[ID]*flight) {
	model := s.cfg.Engine.Model
	for _, ev := range evs {
		f, ok := flights[ev.ID]
		if !ok {
			continue
		}
		switch ev.Kind {
		case EventFirstToken:
			s.m.ttft.WithLabelValues(model).Observe(s.wall(ev.At.Sub(f.submitted)))
			f.last, f.cached = ev.At, ev.CachedTokens
		case EventToken:
			s.m.itl.WithLabelValues(model).Observe(s.wall(ev.At.Sub(f.last)))
			f.last = ev.At
		case EventFinish:
			s.m.e2e.WithLabelValues(model).Observe(s.wall(ev.At.Sub(f.submitted)))
			s.m.success.WithLabelValues(f.reason, model).Inc()
			delete(flights, ev.ID)
			s.inflight.Add(-1)
		}
		f.st.update(ev.Tokens, f.cached, ev.Kind == EventFinish)
	}
}

// submit hands a request to the owner goroutine.
func (s *Server) submit(ctx context.Context, req Request, st *stream) (ID, error) {
	reply := make(chan submitReply, 1)
	select {
	case s.submitCh <- submitMsg{req: req, st: st, reply: reply}:
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-s.stopped:
		return 0, errStopped
	}
	r := <-reply
	return r.id, r.err
}

// cancel removes a request whose client went away.
func (s *Server) cancel(id ID) {
	select {
	case s.cancelCh <- id:
	case <-s.stopped:
	}
}

// Serve runs the engine and serves HTTP on ln until ctx ends.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	hs := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)}
	runDone := make(chan error, 1)
	go func() { runDone <- s.Run(ctx) }()
	serveDone := make(chan error, 1)
	go func() { serveDone <- hs.Serve(ln) }()

	var err error
	select {
	case <-ctx.Done():
	case err = <-serveDone:
	}
	stop() // ends Run, which fails the open streams so their handlers return
	runErr := <-runDone
	shutCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if serr := hs.Shutdown(shutCtx); serr != nil {
		_ = hs.Close()
	}
	if err == nil {
		err = <-serveDone
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return errors.Join(err, runErr)
}

// adapterNamesLocked lists the served adapters, sorted.
// adaptersMu should be held.
func (s *Server) adapterNamesLocked() []string {
	names := make([]string, 0, len(s.adapters))
	for n := range s.adapters {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
