package adapter

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-llm/switchyard/internal/kvevents"
)

// metrics are the adapter's Prometheus series, labelled with the replica.
// They exist even without a Registerer, so the code that counts never checks.
type metrics struct {
	requests       *prometheus.CounterVec
	engineErrors   prometheus.Counter
	scrapeFailures prometheus.Counter
	inflight       prometheus.Gauge
	heartbeatSeq   prometheus.Gauge
	engineFailures *prometheus.CounterVec
	authFailures   prometheus.Counter
	prefillLegs    *prometheus.CounterVec
	prefillWhole   *prometheus.CounterVec
	kvEvents       *prometheus.CounterVec
	kvGaps         prometheus.Counter
	kvLearnDropped prometheus.Counter
	kvSyncs        *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, replica string) (*metrics, error) {
	cl := prometheus.Labels{"replica": replica}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_adapter_engine_requests_total", ConstLabels: cl,
			Help: "Engine calls by HTTP status (\"error\" when the engine gave none).",
		}, []string{"status"}),
		engineErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_adapter_engine_errors_total", ConstLabels: cl,
			Help: "Engine calls that failed before a status or broke mid-stream.",
		}),
		scrapeFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_adapter_scrape_failures_total", ConstLabels: cl,
			Help: "Engine scrapes (/metrics or /health) that failed.",
		}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_adapter_inflight", ConstLabels: cl,
			Help: "Requests taken by the adapter and not yet finished.",
		}),
		heartbeatSeq: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_adapter_heartbeat_seq", ConstLabels: cl,
			Help: "Sequence number of the last heartbeat sent.",
		}),
		engineFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_adapter_engine_failures_total", ConstLabels: cl,
			Help: "Engine answers that count toward outlier ejection, by kind (5xx, 429, auth, connection, model: a 404 for the model or endpoint the replica registered).",
		}, []string{"kind"}),
		authFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_adapter_engine_auth_failures_total", ConstLabels: cl,
			Help: "Times the engine began refusing the adapter's API key (401/403); each marks the replica unhealthy until it takes the key again.",
		}),
		prefillLegs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_adapter_prefill_legs_total", ConstLabels: cl,
			Help: "Prefill legs this replica served for decode replicas, by outcome (ok, refused, error, cancelled).",
		}, []string{"outcome"}),
		prefillWhole: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_adapter_prefill_fallbacks_total", ConstLabels: cl,
			Help: "Split requests this decode replica prefilled itself, by cause (refused, failed, bad_answer, decode_rejected).",
		}, []string{"cause"}),
		kvEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_adapter_kv_events_total", ConstLabels: cl,
			Help: "KV-cache events read from the engine's feed, by type (BlockStored, BlockRemoved, AllBlocksCleared; unknown: a type this adapter does not know; malformed: a message refused undecoded, by reason: token_id, block_size, token_count, range, too_large, shape). A BlockStored left out because its parent is a block the adapter has not seen has reason unknown_parent.",
		}, []string{"type", "reason"}),
		kvGaps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_adapter_kv_event_gaps_total", ConstLabels: cl,
			Help: "Sequence gaps in the engine's KV-event feed, replayed or not.",
		}),
		kvLearnDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_adapter_kv_learn_dropped_total", ConstLabels: cl,
			Help: "Requests the KV-event feed did not learn the engine blocks of because its learn queue was full (in count or bytes).",
		}),
		kvSyncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_adapter_kv_sync_requests_total", ConstLabels: cl,
			Help: "Asks to resend the engine's cached keys (llm.kvsync), by outcome (resent: the ask made a full resend, at once or at the end of the interval; coalesced: a resend already due answers it). At most one resend a second.",
		}, []string{"outcome"}),
	}
	for _, k := range []string{kvSyncResent, kvSyncCoalesced} {
		m.kvSyncs.WithLabelValues(k)
	}
	for _, k := range []string{"BlockStored", "BlockRemoved", "AllBlocksCleared", "unknown"} {
		m.kvEvents.WithLabelValues(k, "")
	}
	m.kvEvents.WithLabelValues("BlockStored", kvUnknownParent)
	for _, r := range kvevents.Refusals() {
		m.kvEvents.WithLabelValues("malformed", r)
	}
	for _, k := range []string{"5xx", "429", "auth", "connection", "model"} {
		m.engineFailures.WithLabelValues(k)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.requests, m.engineErrors, m.scrapeFailures, m.inflight, m.heartbeatSeq, m.engineFailures, m.authFailures, m.prefillLegs, m.prefillWhole, m.kvEvents, m.kvGaps, m.kvLearnDropped, m.kvSyncs} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("adapter: register metrics: %w", err)
		}
	}
	return m, nil
}
