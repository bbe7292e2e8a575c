package adapter

import (
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"

	"github.com/switchyard-llm/switchyard/internal/kvevents"
	"github.com/switchyard-llm/switchyard/subjects"
)

// Where a replica's batch and queue limits came from (Heartbeat
// max_batch_from / max_queue_from). Brokers divide load by them, so a guess
// is worth knowing as one.
const (
	LimitConfigured = "config"  // --max-batch / --max-queue
	LimitEngine     = "engine"  // read from the engine
	LimitDefault    = "default" // neither: DefaultMaxBatch / DefaultMaxQueue
)

// limits is the adapter's view of its engine's batch and queue sizes.
type limits struct {
	batch, queue         int
	batchFrom, queueFrom string
}

// configuredLimits records what the operator set before defaults fill the
// rest. Lock: none (set once in New).
func configuredLimits(c *Config) limits {
	l := limits{batch: c.MaxBatch, queue: c.MaxQueue, batchFrom: LimitConfigured, queueFrom: LimitConfigured}
	if c.MaxBatch <= 0 {
		l.batch, l.batchFrom = DefaultMaxBatch, LimitDefault
	}
	if c.MaxQueue <= 0 {
		l.queue, l.queueFrom = DefaultMaxQueue, LimitDefault
	}
	return l
}

// withEngine takes the engine's own batch size over a default (never over
// what the operator configured). No engine exports a queue limit (vLLM,
// SGLang and TGI queue without one; llama.cpp defers), so the queue stays
// configured or default.
func (l limits) withEngine(s LoadSample) limits {
	if s.MaxBatch > 0 && l.batchFrom != LimitConfigured {
		l.batch, l.batchFrom = s.MaxBatch, LimitEngine
	}
	return l
}

// engineLimits is the adapter's limits with its engine's batch size as
// last scraped (withEngine).
func (a *Adapter) engineLimits() limits {
	a.load.mu.Lock()
	defer a.load.mu.Unlock()
	return a.limits.withEngine(a.load.sample)
}

// vllmMaxSeqs reads max_num_seqs from vLLM's *_config_info series, whose
// labels carry the engine's configuration (cache_config_info carries the
// cache's; a scheduler config series carries max_num_seqs). 0 when none
// says.
func vllmMaxSeqs(fams map[string]*dto.MetricFamily) int {
	n := 0
	for name, f := range fams {
		if !strings.HasPrefix(name, "vllm:") || !strings.HasSuffix(name, "_config_info") {
			continue
		}
		for _, m := range f.Metric {
			if v, err := strconv.Atoi(label(m, "max_num_seqs")); err == nil && v > 0 && v <= 1<<20 {
				n += v // one series per data-parallel engine: their batches add up
			}
		}
	}
	return n
}

// vllmCacheConfig reads num_gpu_blocks and block_size from vLLM's
// cache_config_info, range-checked; 0 when it does not say.
func vllmCacheConfig(fams map[string]*dto.MetricFamily) (blocks, size int) {
	f := fams["vllm:cache_config_info"]
	if f == nil {
		return 0, 0
	}
	for _, m := range f.Metric {
		if v, err := strconv.Atoi(label(m, "num_gpu_blocks")); err == nil && v > 0 && v <= subjects.MaxKVBlocks {
			blocks += v // one series per data-parallel engine
		}
		if v, err := strconv.Atoi(label(m, "block_size")); err == nil && v > 0 && v <= kvevents.MaxBlockSize {
			size = v
		}
	}
	return min(blocks, subjects.MaxKVBlocks), size
}
