package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-llm/switchyard/subjects"
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

// holdable reports whether the rejection m is model_loading for a model
// the table says to wait for.
func (g *Gateway) holdable(u *upstream, m *nats.Msg) bool {
	model := m.Header.Get(subjects.HdrRouteModel)
	if model == "" || m.Header.Get(subjects.HdrStatus) != "503" {
		return false
	}
	t := g.table.Load()
	if t == nil {
		return false
	}
	mod := t.Models[model]
	if mod == nil || mod.OnCold != table.OnColdWait {
		return false
	}
	u.cold = m
	return true
}

// tryCold is try, holding the request while its cold model loads and
// trying again once a replica is ready. A held stream's writer becomes
// out.w (heldStream).
func (g *Gateway) tryCold(ctx context.Context, out *response) result {
	for {
		res := g.try(ctx, out)
		m := out.u.cold
		if m == nil {
			return res
		}
		out.u.cold = nil
		if !g.hold(ctx, out, m.Header.Get(subjects.HdrRouteModel)) {
			return out.rejected(m) // the 503 it would have got
		}
	}
}

// hold waits until a replica of model is ready (true), or the load failed,
// the deadline passed, the client left or no slot was free (false).
func (g *Gateway) hold(ctx context.Context, out *response, model string) bool {
	c := g.cold
	select {
	case c.slots <- struct{}{}:
	default:
		c.ends.WithLabelValues("full").Inc()
		return false
	}
	defer func() { <-c.slots }()
	c.waiting.Inc()
	defer c.waiting.Dec()
	u := out.u
	// Its request quota was charged when the broker answered model_loading.
	u.hdr[subjects.HdrColdWaited] = []string{"1"}

	var keep <-chan time.Time
	if u.stream {
		if _, ok := out.w.(*heldStream); !ok {
			hs := startHeldStream(out.w, g.cfg.WriteTimeout, u.dialect)
			out.w = hs
			if hs.comment(": waiting for "+model+" to load") != nil {
				return false
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
			c.ends.WithLabelValues("deadline").Inc()
			return false
		case <-keep:
			// An SSE comment: proxies see traffic, clients ignore it.
			if out.w.(*heldStream).comment(": waiting for "+model+" to load") != nil {
				return false
			}
		case <-poll.C:
			switch c.phaseSince(model, since) {
			case subjects.LoadFailed:
				c.ends.WithLabelValues("failed").Inc()
				return false
			case subjects.LoadReady, subjects.LoadUnloaded:
				// Ready: route it. Unloaded meanwhile: the next attempt
				// asks for a new load.
				c.ends.WithLabelValues("ready").Inc()
				return true
			}
			if g.replicaReady(model) {
				c.ends.WithLabelValues("ready").Inc()
				return true
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

// heldStream is the response of a streamed request that was held: its 200
// and SSE headers went out with the first keepalive, so what the relay
// writes next must fit in that stream. Header changes and WriteHeader are
// absorbed; a body written under an error status becomes an SSE error
// event, as an error after the first byte always is.
type heldStream struct {
	http.ResponseWriter
	hdr     http.Header
	status  int
	timeout time.Duration
	rc      *http.ResponseController
	dialect dialect // the shape of the error event
}

func startHeldStream(w http.ResponseWriter, timeout time.Duration, d dialect) *heldStream {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	return &heldStream{ResponseWriter: w, hdr: http.Header{}, timeout: timeout, rc: http.NewResponseController(w), dialect: d}
}

func (h *heldStream) comment(s string) error {
	_ = h.rc.SetWriteDeadline(time.Now().Add(h.timeout))
	if _, err := h.ResponseWriter.Write([]byte(s + "\n\n")); err != nil {
		return err
	}
	return h.rc.Flush()
}

func (h *heldStream) Header() http.Header { return h.hdr }

func (h *heldStream) WriteHeader(status int) { h.status = status }

func (h *heldStream) Write(b []byte) (int, error) {
	if h.status == 0 || h.status == http.StatusOK {
		return h.ResponseWriter.Write(b)
	}
	body := make([]byte, 0, len(b))
	for _, c := range b {
		if c != '\n' && c != '\r' {
			body = append(body, c)
		}
	}
	// The error as the stream's API ends a stream: one data line on chat
	// and completions, an error event on the Responses and Messages APIs.
	event := "error"
	if h.dialect == dialectOpenAI {
		event = ""
	}
	if _, err := h.ResponseWriter.Write(sseEvent(event, body)); err != nil {
		return 0, err
	}
	return len(b), h.rc.Flush()
}

// Unwrap lets http.ResponseController reach the connection (Flush and
// write deadlines).
func (h *heldStream) Unwrap() http.ResponseWriter { return h.ResponseWriter }
