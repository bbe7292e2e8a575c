package decider

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// metrics are the broker's Prometheus series. Label values are bounded:
// pools, reasons and codes come from the policy's fixed sets, replicas from
// the registered replicas.
type metrics struct {
	decisions      *prometheus.CounterVec
	panics         *prometheus.CounterVec
	spilled        *prometheus.CounterVec
	regionRTT      *prometheus.GaugeVec
	rejections     *prometheus.CounterVec
	duration       prometheus.Histogram
	tableRevision  prometheus.Gauge
	tableLoadedAt  prometheus.Gauge
	invalidValues  *prometheus.CounterVec
	heartbeatAge   *ageCollector
	replicaKV      *prometheus.GaugeVec
	replicaWaiting *prometheus.GaugeVec
	replicaRunning *prometheus.GaugeVec
	badMessages    *prometheus.CounterVec
	refused        *prometheus.CounterVec
	unhealthy      *prometheus.CounterVec
	ejections      *prometheus.CounterVec
	publishDropped prometheus.Counter
	liveBrokers    prometheus.Gauge
	kvRefused      *prometheus.CounterVec
	prefixIndex    *prometheus.GaugeVec
	loadViewAge    prometheus.Histogram
	ttftError      prometheus.Histogram
	observerLags   prometheus.Counter

	mu       sync.Mutex
	loadedAt time.Time
}

// ageCollector reports each replica's heartbeat age at scrape time.
type ageCollector struct {
	now  func() time.Time
	desc *prometheus.Desc
	mu   sync.Mutex
	last map[string]time.Time
}

func newAgeCollector(now func() time.Time) *ageCollector {
	return &ageCollector{
		now:  now,
		desc: prometheus.NewDesc("switchyard_broker_heartbeat_age_seconds", "Time since each replica's last heartbeat was received.", []string{"replica"}, nil),
		last: map[string]time.Time{},
	}
}

// forget drops the replicas not in keep and returns their ids.
func (c *ageCollector) forget(keep map[string]*table.Replica) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var gone []string
	for id := range c.last {
		if keep[id] == nil {
			delete(c.last, id)
			gone = append(gone, id)
		}
	}
	return gone
}

func (c *ageCollector) seen(replica string, at time.Time) {
	c.mu.Lock()
	c.last[replica] = at
	c.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (c *ageCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector. Replicas silent for an hour are
// forgotten, so the series count stays bounded by the live fleet.
func (c *ageCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for r, t := range c.last {
		age := now.Sub(t)
		if age > time.Hour {
			delete(c.last, r)
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, age.Seconds(), r)
	}
}

func newMetrics(reg prometheus.Registerer, dec *Decider) *metrics {
	m := &metrics{
		panics: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_broker_panic_decisions_total", Help: "Decisions made in panic, by pool: fewer than the pool's panic_below of its ready replicas looked alive, and the choice was over all of them.",
		}, []string{"pool"}),
		spilled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_broker_spilled_total", Help: "Decisions sent out of the decider's region, by its region and the replica's: every candidate of its own was saturated or none was live (policy.regions.<from>.spill).",
		}, []string{"from", "to"}),
		regionRTT: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_broker_region_rtt_seconds", Help: "Round trip measured from the decider's region to each other region the table names, by region: the spill penalty of a region whose policy.regions.<from>.penalty is unset.",
		}, []string{"to"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_broker_decisions_total", Help: "Routing decisions that chose a replica, by pool and reason.",
		}, []string{"pool", "reason"}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_broker_rejections_total", Help: "Requests the broker rejected, by error code.",
		}, []string{"code"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "switchyard_broker_decision_duration_seconds", Help: "Time spent deciding one request.",
			Buckets: []float64{1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 5e-4, 1e-3},
		}),
		tableRevision: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_broker_table_revision", Help: "KV revision of the routing table in force.",
		}),
		tableLoadedAt: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_broker_table_loaded_timestamp_seconds", Help: "When the routing table in force was loaded (its age is time() minus this).",
		}),
		invalidValues: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_broker_table_invalid_values_total", Help: "Routing-table values rejected as invalid; the last good value stays in force.",
		}, []string{"kind"}),
		heartbeatAge: newAgeCollector(dec.cfg.Now),
		replicaKV: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_broker_replica_kv_usage_ratio", Help: "KV-cache usage reported by each replica (0–1).",
		}, []string{"replica"}),
		replicaWaiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_broker_replica_waiting_requests", Help: "Requests waiting in each replica's engine queue.",
		}, []string{"replica"}),
		replicaRunning: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_broker_replica_running_requests", Help: "Requests running in each replica's batch.",
		}, []string{"replica"}),
		badMessages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_broker_bad_messages_total", Help: "Messages that could not be decoded, by kind.",
		}, []string{"kind"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_broker_refused_messages_total",
			Help: "Messages refused for what they claim, by kind: a reply subject outside the reply space, a heartbeat of an unregistered replica, usage without a reservation, a bad presence.",
		}, []string{"kind"}),
		unhealthy: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_broker_unhealthy_heartbeats_total", Help: "Heartbeats of ready replicas whose engine fails health checks (scrape_ok=false); each excludes the replica until the next.",
		}, []string{"replica"}),
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_broker_ejections_total", Help: "Replicas ejected for a streak of engine failures (outlier ejection).",
		}, []string{"replica"}),
		publishDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_broker_publish_dropped_total", Help: "Decision or placement messages dropped because the publish queue was full.",
		}),
		liveBrokers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_broker_live_brokers", Help: "Brokers seen alive; each enforces its share of tenant quotas.",
		}),
		kvRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_broker_kv_updates_refused_total",
			Help: "KV-cache key updates refused in whole or part: past the replica's declared capacity or the message bounds (bounds), or after a missed update (sequence).",
		}, []string{"reason"}),
		prefixIndex: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_broker_prefix_index_entries", Help: "(key, replica) entries of the exact prefix index, fed by the engines' KV-cache events, per model.",
		}, []string{"model"}),
		loadViewAge: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "switchyard_broker_load_view_age_seconds",
			Help:    "Age of the load view a decision used: the time since the chosen replica's heartbeat, or the load delta on top of it, was measured.",
			Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2, 5},
		}),
		observerLags: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_broker_observer_lags_total",
			Help: "Times this decider found itself lagging behind the bus (its own presence not back within three presence periods, or 5,000 heartbeats waiting) and took the replicas' silence as its own (switchyard_broker_observer_lag_seconds).",
		}),
		ttftError: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "switchyard_broker_predicted_ttft_error_seconds",
			Help:    "Observed less predicted time to first token of the requests this decider routed, as their replicas observed it (negative: the prediction was too high).",
			Buckets: []float64{-10, -5, -2, -1, -0.5, -0.25, -0.1, -0.05, -0.025, 0, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10},
		}),
	}
	// Known label values are exported from the start, so alerts and rate()
	// work before the first event.
	for _, code := range []string{subjects.CodeInvalidRequest, subjects.CodeContextLength, subjects.CodeModelNotAllowed,
		subjects.CodeModelNotFound, subjects.CodeRateLimit, subjects.CodeFairShareExceeded, subjects.CodeAllReplicasBusy, subjects.CodeDeadlineUnmeetable,
		subjects.CodeTTFTObjectiveUnreachable, subjects.CodeModelLoading, subjects.CodeNoReplicas, subjects.CodeRouterUnavailable,
		subjects.CodeEndpointNotSupported, subjects.CodePreviousResponseNotFound} {
		m.rejections.WithLabelValues(code)
	}
	for _, k := range []string{"bounds", "sequence"} {
		m.kvRefused.WithLabelValues(k)
	}
	for _, k := range []string{refusedReply, refusedReplica, refusedUsage, refusedPresence, refusedKVReplica, refusedLoadReplica} {
		m.refused.WithLabelValues(k)
	}
	for k := table.KindPolicy; k <= table.KindBilling; k++ {
		m.invalidValues.WithLabelValues(kindName(k))
	}
	tableAge := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "switchyard_broker_table_age_seconds", Help: "Time since the routing table in force was loaded.",
	}, func() float64 {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.loadedAt.IsZero() {
			return 0
		}
		return dec.cfg.Now().Sub(m.loadedAt).Seconds()
	})
	observerLag := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "switchyard_broker_observer_lag_seconds",
		Help: "How long this decider, lagging behind the bus (its own presence late, or heartbeats waiting), has heard no heartbeat from any replica: taken as its own silence, so its replicas are kept (0: it does not lag).",
	}, func() float64 { return dec.router.Deafness(dec.cfg.Now()).Seconds() })
	pending := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "switchyard_broker_heartbeats_pending",
		Help: "Heartbeats received by this decider's connection and not yet handled: a backlog is the decider's own lag.",
	}, func() float64 { return float64(dec.heartbeatsPending()) })
	ejected := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "switchyard_broker_ejected_replicas", Help: "Replicas out of rotation now for their engine failures (before the panic threshold).",
	}, func() float64 { return float64(len(dec.router.Ejected(dec.cfg.Now()))) })
	if reg != nil {
		reg = prometheus.WrapRegistererWith(prometheus.Labels{"broker": dec.cfg.ID}, reg)
		reg.MustRegister(tableAge, ejected, observerLag, pending)
		reg.MustRegister(m.decisions, m.panics, m.spilled, m.regionRTT, m.rejections, m.duration, m.tableRevision, m.tableLoadedAt, m.invalidValues,
			m.heartbeatAge, m.replicaKV, m.replicaWaiting, m.replicaRunning, m.badMessages, m.refused, m.unhealthy, m.ejections, m.publishDropped, m.liveBrokers, m.kvRefused, m.prefixIndex,
			m.loadViewAge, m.ttftError, m.observerLags)
	}
	return m
}

func (m *metrics) decided(d *policy.Decision) {
	m.duration.Observe(d.Duration.Seconds())
	if d.Err != nil {
		m.rejected(d.Err.Code)
		return
	}
	m.decisions.WithLabelValues(d.Pool, d.Reason).Inc()
	if d.Panic {
		m.panics.WithLabelValues(d.Pool).Inc()
	}
	if d.Spilled {
		// Both regions are the table's: a spill goes only to a region
		// of the decider's spill list.
		m.spilled.WithLabelValues(d.Region, d.ReplicaRegion).Inc()
	}
	m.loadViewAge.Observe(d.LoadViewAge.Seconds())
}

// regionsMeasured sets the region round trips to rtt's: a region no
// longer measured has no series.
func (m *metrics) regionsMeasured(rtt map[string]time.Duration) {
	m.regionRTT.Reset()
	for to, d := range rtt {
		m.regionRTT.WithLabelValues(to).Set(d.Seconds())
	}
}

func (m *metrics) rejected(code string) { m.rejections.WithLabelValues(code).Inc() }

func (m *metrics) tableLoaded(s *table.Snapshot, now time.Time) {
	// Per-replica series exist only for registered replicas: a replica
	// deleted from the table takes its series with it.
	for _, id := range m.heartbeatAge.forget(s.Replicas) {
		m.replicaKV.DeleteLabelValues(id)
		m.replicaWaiting.DeleteLabelValues(id)
		m.replicaRunning.DeleteLabelValues(id)
		m.unhealthy.DeleteLabelValues(id)
		m.ejections.DeleteLabelValues(id)
	}
	m.tableRevision.Set(float64(s.Revision))
	m.tableLoadedAt.Set(float64(now.UnixNano()) / 1e9)
	m.mu.Lock()
	m.loadedAt = now
	m.mu.Unlock()
}

func (m *metrics) invalidValue(key string, _ error) {
	kind, _ := table.Split(key)
	m.invalidValues.WithLabelValues(kindName(kind)).Inc()
}

func kindName(k table.Kind) string {
	switch k {
	case table.KindPolicy:
		return "policy"
	case table.KindAlias:
		return "alias"
	case table.KindModel:
		return "model"
	case table.KindPool:
		return "pool"
	case table.KindTenant:
		return "tenant"
	case table.KindKey:
		return "key"
	case table.KindReplica:
		return "replica"
	case table.KindBilling:
		return "billing"
	}
	return "unknown"
}

func (m *metrics) heartbeat(hb *subjects.Heartbeat, now time.Time) {
	m.heartbeatAge.seen(hb.Replica, now)
	m.replicaKV.WithLabelValues(hb.Replica).Set(hb.KVUsage)
	m.replicaWaiting.WithLabelValues(hb.Replica).Set(float64(hb.Waiting))
	m.replicaRunning.WithLabelValues(hb.Replica).Set(float64(hb.Running))
}

// Kinds of refused messages (switchyard_broker_refused_messages_total).
const (
	refusedReply    = "reply_subject"
	refusedReplica  = "unknown_replica"
	refusedUsage    = "usage_unreserved"
	refusedPresence = "presence"
	// refusedKVReplica: a KV-cache update naming another replica than its
	// subject.
	refusedKVReplica = "kv_replica"
	// refusedLoadReplica: a load delta naming another replica than its
	// subject.
	refusedLoadReplica = "load_replica"
)
