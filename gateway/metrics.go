package gateway

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// maxModelLabels caps the distinct model label values; the rest fold into
// "other" so a client inventing model names cannot blow up the series count.
const maxModelLabels = 64

type metrics struct {
	requests       *prometheus.CounterVec
	ttfb           *prometheus.HistogramVec
	duration       *prometheus.HistogramVec
	retries        prometheus.Counter
	resends        prometheus.Counter
	lateRoutes     prometheus.Counter
	refusedNotices prometheus.Counter
	missedPongs    prometheus.Counter
	silences       prometheus.Counter
	acceptTimeouts prometheus.Counter
	acceptWaits    prometheus.Counter
	routeWaits     prometheus.Counter
	streamErrors   *prometheus.CounterVec
	clientGone     prometheus.Counter
	openConns      prometheus.Gauge
	refusedConns   prometheus.Counter
	resumes        *prometheus.CounterVec
	overloaded     *prometheus.CounterVec
	offlineWaits   prometheus.Counter
	replicaWaits   prometheus.Counter
	acceptResends  prometheus.Counter

	mu     sync.Mutex
	models map[string]struct{}
}

func newMetrics(reg prometheus.Registerer) *metrics {
	buckets := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_gateway_requests_total", Help: "HTTP inference requests by route, status and requested model.",
		}, []string{"route", "status", "model"}),
		ttfb: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "switchyard_gateway_time_to_first_byte_seconds", Help: "Time from request to the first response byte.", Buckets: buckets,
		}, []string{"route"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "switchyard_gateway_request_duration_seconds", Help: "Time from request to the end of the response.", Buckets: buckets,
		}, []string{"route"}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_gateway_retries_total", Help: "Attempts retried on another replica before the first byte.",
		}),
		resends: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_gateway_resends_total", Help: "Copies of a request sent again to the broker queue group because no broker said within --routed-timeout where it routed the copies before (a broker cut off or stalled).",
		}),
		lateRoutes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_gateway_late_routes_cancelled_total", Help: "Copies a broker routed after another copy of their request was taken or the attempt had ended: the routed replica was told to cancel them.",
		}),
		refusedNotices: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_gateway_refused_routed_notices_total", Help: "Routed notices dropped because they came on a reply subject, where adapters publish too, not on the gateway's routed subject, where only brokers may: a forgery, or a broker older than the routed subject.",
		}),
		missedPongs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_gateway_nats_link_missed_pongs_total", Help: "Pings of the gateway's NATS link check that got no pong within the link check's period.",
		}),
		silences: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_gateway_nats_link_silences_total", Help: "Times the NATS link was marked silent (two pings in a row without a pong in time): /readyz failed and new requests got 503 until a pong came.",
		}),
		acceptTimeouts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_gateway_accept_timeouts_total", Help: "Attempts whose routed replica did not accept within the accept timeouts waited; the retry tries it again only when no other replica is left.",
		}),
		routeWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_gateway_route_waits_total", Help: "Accept timeouts an attempt no broker had routed waited out, sending copies on (copies' budget, not a retry).",
		}),
		acceptWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_gateway_accept_waits_total", Help: "Accept timeouts the gateway waited out because the routed replica looked alive (slow is not dead).",
		}),
		streamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_gateway_stream_errors_total", Help: "Responses ended with an explicit error, by cause.",
		}, []string{"cause"}),
		clientGone: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_gateway_client_disconnects_total", Help: "Requests whose client went away before the response ended; what was started for them was cancelled, and one not yet published never was.",
		}),
		openConns: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_gateway_open_connections", Help: "Client connections open on the public listener (at most --max-conns).",
		}),
		refusedConns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_gateway_connections_refused_total", Help: "Client connections refused at once because --max-conns were open.",
		}),
		resumes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_gateway_resumes_total",
			Help: "Answers whose replica failed mid-answer, by cause and outcome: completed or failed on another replica, or impossible (the request or the budget did not allow a continuation).",
		}, []string{"cause", "outcome"}),
		overloaded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_gateway_overloaded_total",
			Help: "Inference requests refused 503 gateway_overloaded before their body was read, by priority: the open requests were at the adaptive concurrency limit (switchyard_gateway_inflight_limit) or --max-inflight.",
		}, []string{"priority"}),
		acceptResends: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_gateway_accept_resends_total",
			Help: "Requests this gateway decided sent to their replica once more, under the same id, while waiting for an accept that was late (the first may have been lost on the way; the adapter drops a request it already has).",
		}),
		offlineWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_gateway_offline_waits_total",
			Help: "Attempts that found the gateway's NATS link down (disconnected or silent) and waited up to --offline-wait for it to carry again.",
		}),
		replicaWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_gateway_replica_waits_total",
			Help: "Requests that found their replicas gone from the bus (nothing listening on their subjects) and waited for them to reconnect, up to --offline-wait after the first.",
		}),
		models: map[string]struct{}{},
	}
	m.overloaded.WithLabelValues("interactive")
	m.overloaded.WithLabelValues("batch")
	// Every cause is exported from the start, so a rate() over it works
	// before the first error.
	for _, cause := range []string{"engine", "idle_timeout", "sequence_gap", "slow_client", "nats_disconnect"} {
		m.streamErrors.WithLabelValues(cause)
	}
	for _, cause := range []string{"engine", "idle_timeout", "sequence_gap", "handover"} {
		for _, outcome := range []string{"completed", "failed", "impossible"} {
			m.resumes.WithLabelValues(cause, outcome)
		}
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.ttfb, m.duration, m.retries, m.resends, m.lateRoutes, m.refusedNotices, m.missedPongs, m.silences, m.acceptTimeouts, m.acceptWaits, m.routeWaits, m.streamErrors, m.clientGone, m.openConns, m.refusedConns, m.resumes, m.overloaded, m.offlineWaits, m.replicaWaits, m.acceptResends)
	}
	return m
}

func (m *metrics) model(name string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.models[name]; ok {
		return name
	}
	if len(m.models) >= maxModelLabels {
		return "other"
	}
	m.models[name] = struct{}{}
	return name
}

func (m *metrics) firstByte(u *upstream, d time.Duration) {
	m.ttfb.WithLabelValues(u.endpoint).Observe(d.Seconds())
}

func (m *metrics) done(u *upstream, status int) {
	if u == nil {
		return
	}
	m.requests.WithLabelValues(u.endpoint, strconv.Itoa(status), m.model(u.model)).Inc()
	m.duration.WithLabelValues(u.endpoint).Observe(time.Since(u.started).Seconds())
}

func (m *metrics) rejected(route string, status int) {
	m.requests.WithLabelValues(route, strconv.Itoa(status), "").Inc()
}
