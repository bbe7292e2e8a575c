package batch

import (
	"encoding/json"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-llm/switchyard/subjects"
)

// metrics are a batcher's Prometheus series.
type metrics struct {
	items    *prometheus.CounterVec
	inflight prometheus.Gauge
	window   prometheus.Gauge
	refusals *prometheus.CounterVec
	batches  *prometheus.GaugeVec
	room     *prometheus.GaugeVec
	batchers prometheus.Gauge
	bad      *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		items: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_batch_items_total",
			Help: "Batch lines handled, by tenant and outcome: completed, failed (to the error file), paced (refused for room by a broker, an adapter or an engine, or no broker listening; tried again), retried (a replica failed), duplicate (answered already), skipped (its batch stopped).",
		}, []string{"tenant", "outcome"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_batch_inflight",
			Help: "Batch lines this batcher has in flight.",
		}),
		window: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_batch_window",
			Help: "Lines this batcher may have in flight now: the lines it holds plus its share of the pool's free batch room (switchyard_batch_room), at most what a 503 within the last second left (it shrinks to the other lines in flight); without a load view, an answer grows it by one line, or by one line a window of answers within a second of a refusal.",
		}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_batch_refusals_total",
			Help: "Batch lines refused (429 or 503; each is tried again, never failed), by status, error code and where the refusal came from: broker, adapter (the replica's hold for batch work is full, or it drains), engine (its own answer) or bus (no broker listened).",
		}, []string{"status", "code", "from"}),
		batches: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_batches",
			Help: "Batches by status, as this batcher last saw them.",
		}, []string{"status"}),
		room: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_batch_room",
			Help: "The pool's batch room as this batcher's load view shows it, in lines, by kind: free (the batch slots the replicas' batch-room limits leave), interactive (the interactive requests the pool holds), reserve (interactive work's mean over the last 5 s less what it holds, when more: left to it), share (this batcher's part of free less reserve).",
		}, []string{"kind"}),
		batchers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_batchers",
			Help: "Batchers sharing the batch room, this one included, from their announcements on llm.batcher.presence.",
		}),
		bad: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_batch_view_refused_total",
			Help: "Messages of the load view this batcher refused, by kind (heartbeat, load_delta, presence): out of range, malformed, speaking for another replica, or beyond the view's bounds.",
		}, []string{"kind"}),
	}
	if reg != nil {
		reg.MustRegister(m.items, m.inflight, m.window, m.refusals, m.batches, m.room, m.batchers, m.bad)
	}
	return m
}

func (m *metrics) setRoom(r Room) {
	m.room.WithLabelValues("free").Set(float64(r.Free))
	m.room.WithLabelValues("interactive").Set(float64(r.Interactive))
	m.room.WithLabelValues("reserve").Set(float64(r.Reserve))
	m.room.WithLabelValues("share").Set(float64(r.Share))
	m.batchers.Set(float64(r.Batchers))
}

func (m *metrics) item(tenant, outcome string) { m.items.WithLabelValues(tenant, outcome).Inc() }

func (m *metrics) refusal(a answer, code string) {
	m.refusals.WithLabelValues(strconv.Itoa(a.status), code, a.from).Inc()
}

func (m *metrics) setBatches(by map[string]int) {
	for _, s := range Statuses() {
		m.batches.WithLabelValues(s).Set(float64(by[s]))
	}
}

// errorCode is the code of an OpenAI-shape error body, as refusals are
// counted by: one a refusal carries, or "other", so that what an answer
// says cannot grow the series without bound.
func errorCode(body []byte) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil {
		return "other"
	}
	switch c := e.Error.Code; c {
	case subjects.CodeAllReplicasBusy, subjects.CodeRateLimit, subjects.CodeNoReplicas, subjects.CodeModelLoading,
		subjects.CodeFairShareExceeded, subjects.CodeRouterUnavailable, subjects.CodeTTFTObjectiveUnreachable,
		subjects.CodeDeadlineUnmeetable, subjects.CodeBudgetExceeded:
		return c
	}
	return "other"
}
