package loader

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Outcomes of switchyard_loader_loads_total and _unloads_total.
const (
	outcomeReady    = "ready"
	outcomeFailed   = "failed"
	outcomeUnloaded = "unloaded"
)

type metrics struct {
	loads, unloads *prometheus.CounterVec
	deduplicated   *prometheus.CounterVec
	timeToReady    *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		loads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_loader_loads_total",
			Help: "Loads of cold models this loader ran, by outcome (ready or failed).",
		}, []string{"model", "outcome"}),
		unloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_loader_unloads_total",
			Help: "Unloads of idle cold models this loader ran, by outcome (unloaded or failed).",
		}, []string{"model", "outcome"}),
		deduplicated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_loader_load_requests_deduplicated_total",
			Help: "Load requests that started nothing: a load or unload of the model was already under way, or a failed one's cooldown had not passed.",
		}, []string{"model"}),
		timeToReady: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "switchyard_loader_time_to_ready_seconds",
			Help:    "From a cold model's load request to its first replica heartbeating ready.",
			Buckets: []float64{1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200},
		}, []string{"model"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.loads, m.unloads, m.deduplicated, m.timeToReady} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}
