package batch

import "github.com/prometheus/client_golang/prometheus"

// metrics are a batcher's Prometheus series.
type metrics struct {
	items    *prometheus.CounterVec
	inflight prometheus.Gauge
	window   prometheus.Gauge
	batches  *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		items: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_batch_items_total",
			Help: "Batch lines handled, by tenant and outcome: completed, failed (to the error file), paced (refused by a broker, tried again), retried (a replica failed), duplicate (answered already), skipped (its batch stopped).",
		}, []string{"tenant", "outcome"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_batch_inflight",
			Help: "Batch lines this batcher has in flight.",
		}),
		window: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_batch_window",
			Help: "Lines this batcher may have in flight now: grows with answers, halves on a broker's refusal.",
		}),
		batches: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_batches",
			Help: "Batches by status, as this batcher last saw them.",
		}, []string{"status"}),
	}
	if reg != nil {
		reg.MustRegister(m.items, m.inflight, m.window, m.batches)
	}
	return m
}

func (m *metrics) item(tenant, outcome string) { m.items.WithLabelValues(tenant, outcome).Inc() }

func (m *metrics) setBatches(by map[string]int) {
	for _, s := range Statuses() {
		m.batches.WithLabelValues(s).Set(float64(by[s]))
	}
}
