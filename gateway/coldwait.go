package gateway

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/subjects/reply"
	"github.com/switchyard-llm/switchyard/table"
)

// A request for a cold model whose on_cold is "wait" is held here, at the
// gateway, instead of answered 503 model_loading: the router never queues,
// but a gateway already holds every request's connection, and holding one
// until a replica is ready costs it a goroutine and a timer. The wait ends
// when a replica of the model is ready (the request is routed as usual),
// when the load fails or the request's deadline passes (it gets the 503 it
// would have got), and at most MaxColdWaits requests wait per gateway.

// Defaults of the cold wait.
const (
	DefaultMaxColdWaits  = 256
	DefaultColdKeepalive = 10 * time.Second
	coldPoll             = 250 * time.Millisecond
)

// coldWaits is the gateway's side of cold loads: the slots of held requests
// and the last load status heard per model.
type coldWaits struct {
	slots chan struct{}
	mu    sync.Mutex
	last  map[string]coldPhase // model → last load status

	waiting prometheus.Gauge
	ends    *prometheus.CounterVec
}

type coldPhase struct {
	phase string
	at    time.Time
}

// maxColdModels bounds the statuses remembered.
const maxColdModels = 4096

func newColdWaits(max int, reg prometheus.Registerer) *coldWaits {
	c := &coldWaits{
		slots: make(chan struct{}, max),
		last:  map[string]coldPhase{},
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_gateway_cold_waiting_requests",
			Help: "Requests held at this gateway while their cold model loads (on_cold: wait).",
		}),
		ends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_gateway_cold_waits_total",
			Help: "Held requests by how the wait ended: ready (routed), failed (the load failed), deadline, full (no slot: answered 503 at once).",
		}, []string{"outcome"}),
	}
	if reg != nil {
		reg.MustRegister(c.waiting, c.ends)
	}
	return c
}

// onStatus records a loader's status.
func (c *coldWaits) onStatus(m *nats.Msg) {
	var st subjects.LoadStatus
	if json.Unmarshal(m.Data, &st) != nil || !table.ValidName(st.Model) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.last[st.Model]; ok || len(c.last) < maxColdModels {
		c.last[st.Model] = coldPhase{phase: st.Phase, at: time.Now()}
	}
}

// phaseSince is the model's last status if it came after since.
func (c *coldWaits) phaseSince(model string, since time.Time) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.last[model]; p.at.After(since) {
		return p.phase
	}
	return ""
}

// subscribeCold listens to load statuses until ctx ends.
func (g *Gateway) subscribeCold(ctx context.Context, wg *sync.WaitGroup) error {
	sub, err := g.nc.Subscribe(g.subj.ControlLoadStatus(), g.cold.onStatus)
	if err != nil {
		return err
	}
	wg.Go(func() {
		<-ctx.Done()
		_ = sub.Unsubscribe()
	})
	return nil
}

// holdable reports whether the rejection f is model_loading for a model
// the table says to wait for.
func (g *Gateway) holdable(f reply.Frame) bool {
	model := f.Header.Get(subjects.HdrRouteModel)
	if model == "" || f.Status != 503 {
		return false
	}
	t := g.table.Load()
	if t == nil {
		return false
	}
	mod := t.Models[model]
	return mod != nil && mod.OnCold == table.OnColdWait
}

// hold holds a request whose attempt ended cold (failCold: model_loading
// for a model the table says to wait for) until a replica of the model is
// ready (ready: the relay tries again). A hold that ends otherwise returns
// its result for judge: the client gone (a keepalive could not be written,
// or it left), else the rejection it would have got, as a stream's error
// event once the hold began it (the load failed, the deadline passed, no
// slot was free).
func (g *Gateway) hold(ctx context.Context, out *response, cold result) (r result, ready bool) {
	model := cold.rejection.Header.Get(subjects.HdrRouteModel)
	refused := func(outcome string) (result, bool) {
		c := cold
		c.kind, c.wrote = failRejected, out.wrote
		g.cold.ends.WithLabelValues(outcome).Inc()
		return c, false
	}
	gone := result{kind: failClientGone, wrote: out.wrote}
	c := g.cold
	select {
	case c.slots <- struct{}{}:
	default:
		return refused("full")
	}
	defer func() { <-c.slots }()
	c.waiting.Inc()
	defer c.waiting.Dec()
	u := out.u
	// Its request quota was charged when the broker answered model_loading.
	u.route.ColdWaited = true

	var keep <-chan time.Time
	if u.stream {
		if !out.wrote {
			out.startHold()
			if out.comment(": waiting for "+model+" to load") != nil {
				return gone, false
			}
		}
		t := time.NewTicker(g.cfg.ColdKeepalive)
		defer t.Stop()
		keep = t.C
	}
	since := time.Now()
	poll := time.NewTicker(coldPoll)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			if ctx.Err() == context.Canceled {
				c.ends.WithLabelValues("deadline").Inc() // the request's context ended, by its client
				return gone, false
			}
			return refused("deadline")
		case <-keep:
			// An SSE comment: proxies see traffic, clients ignore it.
			if out.comment(": waiting for "+model+" to load") != nil {
				return gone, false
			}
		case <-poll.C:
			switch c.phaseSince(model, since) {
			case subjects.LoadFailed:
				return refused("failed")
			case subjects.LoadReady, subjects.LoadUnloaded:
				// Ready: route it. Unloaded meanwhile: the next attempt
				// asks for a new load.
				c.ends.WithLabelValues("ready").Inc()
				return r, true
			}
			if g.replicaReady(model) {
				c.ends.WithLabelValues("ready").Inc()
				return r, true
			}
		}
	}
}

// replicaReady reports whether the table has a ready replica of model.
func (g *Gateway) replicaReady(model string) bool {
	t := g.table.Load()
	if t == nil {
		return false
	}
	for _, r := range t.Replicas {
		if r.Model == model && r.State == subjects.StateReady {
			return true
		}
	}
	return false
}
