package enginesim

import (
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the vLLM series the shell exports. Latency histograms are
// observed as events happen; the engine's state and counters are read from
// its latest Stats when scraped, so /metrics reflects the load in flight.
type metrics struct {
	ttft, itl, e2e *prometheus.HistogramVec
	success        *prometheus.CounterVec
}

func newMetrics(s *Server) *metrics {
	// Bucket bounds as vLLM sets them (testdata/metrics-idle.txt).
	ttftBuckets := []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560}
	itlBuckets := []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}
	e2eBuckets := []float64{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680}
	m := &metrics{
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "vllm:time_to_first_token_seconds", Help: "Histogram of time to first token in seconds.", Buckets: ttftBuckets,
		}, []string{"model_name"}),
		itl: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "vllm:inter_token_latency_seconds", Help: "Histogram of inter-token latency in seconds.", Buckets: itlBuckets,
		}, []string{"model_name"}),
		e2e: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "vllm:e2e_request_latency_seconds", Help: "Histogram of end to end request latency in seconds.", Buckets: e2eBuckets,
		}, []string{"model_name"}),
		success: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vllm:request_success_total", Help: "Count of successfully processed requests.",
		}, []string{"finish_reason", "model_name"}),
	}
	s.reg.MustRegister(m.ttft, m.itl, m.e2e, m.success, newStateCollector(s))
	return m
}

// stateCollector reads the engine's state at scrape time.
type stateCollector struct {
	s                                  *Server
	kv, running, waiting, lora, config *prometheus.Desc
	prompt, gen, prefixQ, prefixH      *prometheus.Desc
}

func newStateCollector(s *Server) *stateCollector {
	model := []string{"model_name"}
	return &stateCollector{
		s: s,
		kv: prometheus.NewDesc("vllm:kv_cache_usage_perc",
			"Prometheus metric for the fraction of KV-cache blocks currently in use (from 0 to 1).", model, nil),
		running: prometheus.NewDesc("vllm:num_requests_running", "Number of requests currently running on GPU.", model, nil),
		waiting: prometheus.NewDesc("vllm:num_requests_waiting", "Prometheus metric for the number of queued requests.", model, nil),
		lora: prometheus.NewDesc("vllm:lora_requests_info", "Running stats on lora requests.",
			[]string{"max_lora", "running_lora_adapters", "waiting_lora_adapters"}, nil),
		config: prometheus.NewDesc("vllm:cache_config_info", "Information of the LLMEngine CacheConfig.",
			[]string{"block_size", "num_gpu_blocks"}, nil),
		prompt:  prometheus.NewDesc("vllm:prompt_tokens_total", "Total number of prompt tokens processed.", model, nil),
		gen:     prometheus.NewDesc("vllm:generation_tokens_total", "Total number of generated tokens.", model, nil),
		prefixQ: prometheus.NewDesc("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.", model, nil),
		prefixH: prometheus.NewDesc("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", model, nil),
	}
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.kv, c.running, c.waiting, c.lora, c.config, c.prompt, c.gen, c.prefixQ, c.prefixH} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	st := *s.snap.Load()
	cfg := &s.cfg.Engine
	if s.cfg.Fixed {
		f := &s.fixed
		st.Running = int(f.running.Load())
		st.KVUsage = min(1, float64(f.blocks.Load())/float64(cfg.KVBlocks))
		st.PromptTokens = f.promptTokens.Load()
		st.GenerationTokens = f.genTokens.Load()
	}
	model := cfg.Model
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), model)
	}
	gauge(c.kv, st.KVUsage, model)
	gauge(c.running, float64(st.Running), model)
	gauge(c.waiting, float64(st.Waiting), model)
	gauge(c.config, 1, strconv.Itoa(cfg.BlockTokens), strconv.Itoa(cfg.KVBlocks))
	if cfg.MaxLoras > 0 {
		// vLLM's value is the time the state was sampled; consumers take
		// the newest series.
		now := float64(time.Now().UnixNano()) / 1e9
		gauge(c.lora, now, strconv.Itoa(cfg.MaxLoras), strings.Join(st.RunningLoras, ","), strings.Join(st.WaitingLoras, ","))
	}
	counter(c.prompt, st.PromptTokens)
	counter(c.gen, st.GenerationTokens)
	counter(c.prefixQ, st.PrefixQueryTokens)
	counter(c.prefixH, st.PrefixHitTokens)
}
