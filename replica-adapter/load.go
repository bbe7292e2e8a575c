package adapter

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Engine flavors (Config.Flavor).
const (
	FlavorAuto     = "auto"
	FlavorVLLM     = "vllm"
	FlavorSGLang   = "sglang"
	FlavorLlamaCpp = "llamacpp"
	FlavorTGI      = "tgi"
)

// ErrNoLoadMetrics is returned when an exposition holds none of the load
// metrics of the flavor (or, for "auto", of any known flavor).
var ErrNoLoadMetrics = errors.New("no engine load metrics")

// Metric names read from each engine (docs/protocol.md, "Messages").
const (
	vllmKVUsage    = "vllm:kv_cache_usage_perc"
	vllmGPUCache   = "vllm:gpu_cache_usage_perc" // before vLLM v0.10
	vllmRunning    = "vllm:num_requests_running"
	vllmWaiting    = "vllm:num_requests_waiting"
	vllmLoraInfo   = "vllm:lora_requests_info"
	vllmPrefixQ    = "vllm:prefix_cache_queries_total"
	vllmPrefixH    = "vllm:prefix_cache_hits_total"
	vllmTTFT       = "vllm:time_to_first_token_seconds"
	sglangTTFT     = "sglang:time_to_first_token_seconds"
	sglangUsage    = "sglang:token_usage"
	sglangRunning  = "sglang:num_running_reqs"
	sglangQueue    = "sglang:num_queue_reqs"
	sglangLoraUsed = "sglang:lora_pool_slots_used"
	sglangLoraMax  = "sglang:lora_pool_slots_total"
	llamaRunning   = "llamacpp:requests_processing"
	llamaDeferred  = "llamacpp:requests_deferred"
	tgiQueue       = "tgi_queue_size"
	tgiBatch       = "tgi_batch_current_size"
)

// LoadSample is one scrape of an engine's load.
type LoadSample struct {
	// KVUsage is the KV-cache fill, 0–1. Engines without a KV metric get an
	// estimate (llama.cpp: busy slots; TGI: batch fill); KVKnown says which.
	KVUsage float64
	KVKnown bool
	Running int
	Waiting int
	// LoraRunning and LoraWaiting are adapter names; MaxLora the engine's
	// adapter slots (0 when it does not say).
	LoraRunning []string
	LoraWaiting []string
	MaxLora     int
	// MaxBatch is the engine's own batch size where it exports one (vLLM's
	// max_num_seqs in a config-info series, llama.cpp's slot count); 0
	// when it does not say.
	MaxBatch int
	// KVBlocks and BlockSize are the engine's KV capacity in blocks and
	// tokens per block (vLLM's cache_config_info); 0 when not exported.
	KVBlocks, BlockSize int
	// PrefixQueries and PrefixHits are the engine's prefix-cache counters
	// (vLLM's prefix_cache_queries and prefix_cache_hits, in prompt
	// tokens); PrefixKnown says it exports them.
	PrefixQueries, PrefixHits float64
	PrefixKnown               bool
	// TTFTSeconds and TTFTCount are the engine's own time-to-first-token
	// histogram's sum and count (vLLM's and SGLang's
	// time_to_first_token_seconds, every request, streamed or not);
	// TTFTKnown says it exports one.
	TTFTSeconds, TTFTCount float64
	TTFTKnown              bool
}

// ParseMetrics reads a Prometheus text exposition from an engine of the given
// flavor ("auto" detects it from the metric names) and returns the load
// sample and the flavor it was read as.
func ParseMetrics(flavor string, r io.Reader) (LoadSample, string, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	// A parse error stops at the offending line; what was read before it is
	// still good, so it is used when it holds the load metrics.
	if err != nil && len(fams) == 0 {
		return LoadSample{}, flavor, fmt.Errorf("parse metrics: %w", err)
	}
	if flavor == FlavorAuto || flavor == "" {
		flavor = detectFlavor(fams)
		if flavor == "" {
			return LoadSample{}, FlavorAuto, ErrNoLoadMetrics
		}
	}
	var s LoadSample
	var found bool
	switch flavor {
	case FlavorVLLM:
		s, found = vllmSample(fams)
	case FlavorSGLang:
		s, found = sglangSample(fams)
	case FlavorLlamaCpp:
		s, found = llamaSample(fams)
	case FlavorTGI:
		s, found = tgiSample(fams)
	default:
		return LoadSample{}, flavor, fmt.Errorf("unknown flavor %q", flavor)
	}
	if !found {
		if err != nil {
			return s, flavor, fmt.Errorf("%w: %w", ErrNoLoadMetrics, err)
		}
		return s, flavor, fmt.Errorf("%w for %s", ErrNoLoadMetrics, flavor)
	}
	return s, flavor, nil
}

// detectFlavor names the engine whose load metrics the exposition holds.
func detectFlavor(fams map[string]*dto.MetricFamily) string {
	switch {
	case fams[vllmRunning] != nil || fams[vllmKVUsage] != nil || fams[vllmGPUCache] != nil:
		return FlavorVLLM
	case fams[sglangRunning] != nil || fams[sglangUsage] != nil:
		return FlavorSGLang
	case fams[llamaRunning] != nil:
		return FlavorLlamaCpp
	case fams[tgiQueue] != nil || fams[tgiBatch] != nil:
		return FlavorTGI
	}
	return ""
}

// sum adds every series of a family: a data-parallel engine exports one
// series per engine (vLLM's "engine" label, SGLang's dp_rank), and counts add
// up across them.
func sum(fams map[string]*dto.MetricFamily, name string) (float64, bool) {
	f := fams[name]
	if f == nil || len(f.Metric) == 0 {
		return 0, false
	}
	var t float64
	for _, m := range f.Metric {
		t += value(m)
	}
	return t, true
}

// mean averages a fraction over the series: two engines half full are a
// replica half full, not a full one.
func mean(fams map[string]*dto.MetricFamily, name string) (float64, bool) {
	t, ok := sum(fams, name)
	if !ok {
		return 0, false
	}
	return t / float64(len(fams[name].Metric)), true
}

// histogram adds the sums and counts of every series of a histogram
// family (one per engine, model or label set).
func histogram(fams map[string]*dto.MetricFamily, name string) (sum, count float64, ok bool) {
	f := fams[name]
	if f == nil {
		return 0, 0, false
	}
	for _, m := range f.Metric {
		if h := m.Histogram; h != nil {
			sum += h.GetSampleSum()
			count += float64(h.GetSampleCount())
			ok = true
		}
	}
	return sum, count, ok
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	return 0
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.Label {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func vllmSample(fams map[string]*dto.MetricFamily) (LoadSample, bool) {
	var s LoadSample
	kv, okKV := mean(fams, vllmKVUsage)
	if !okKV {
		kv, okKV = mean(fams, vllmGPUCache)
	}
	s.KVUsage, s.KVKnown = kv, okKV
	run, okRun := sum(fams, vllmRunning)
	wait, okWait := sum(fams, vllmWaiting)
	s.Running, s.Waiting = int(run), int(wait)
	// Without a count, the adapters are taken as they are listed.
	runCap, waitCap := int(run), int(wait)
	if !okRun {
		runCap = math.MaxInt
	}
	if !okWait {
		waitCap = math.MaxInt
	}
	s.LoraRunning, s.LoraWaiting, s.MaxLora = vllmLora(fams[vllmLoraInfo], runCap, waitCap)
	s.MaxBatch = vllmMaxSeqs(fams)
	s.KVBlocks, s.BlockSize = vllmCacheConfig(fams)
	q, okQ := sum(fams, vllmPrefixQ)
	h, okH := sum(fams, vllmPrefixH)
	s.PrefixQueries, s.PrefixHits, s.PrefixKnown = q, h, okQ && okH
	s.TTFTSeconds, s.TTFTCount, s.TTFTKnown = histogram(fams, vllmTTFT)
	return s, okKV || okRun || okWait
}

// vllmLora reads vllm:lora_requests_info. Its value is the time the series was
// last set, and old label sets linger, so the current state is the series with
// the newest value. Several can share it: the timestamp has one-second
// resolution, so the sets an engine went through within a second tie (and
// data-parallel engines write at once). The engine's request counts decide
// between them: a set naming more running (or waiting) adapters than there
// are running (waiting) requests is not the present one, so an idle engine
// runs no adapter however its last second went. The union of the sets the
// counts allow is the state; when the counts allow none, nothing runs and
// nothing waits.
func vllmLora(f *dto.MetricFamily, running, waiting int) (run, wait []string, maxLora int) {
	run, wait = []string{}, []string{}
	if f == nil || len(f.Metric) == 0 {
		return run, wait, 0
	}
	newest := value(f.Metric[0])
	for _, m := range f.Metric[1:] {
		newest = max(newest, value(m))
	}
	for _, m := range f.Metric {
		if n, err := strconv.Atoi(label(m, "max_lora")); err == nil && value(m) == newest {
			maxLora = max(maxLora, n)
		}
		r, w := label(m, "running_lora_adapters"), label(m, "waiting_lora_adapters")
		if value(m) != newest || countNames(r) > running || countNames(w) > waiting {
			continue
		}
		run = appendNames(run, r)
		wait = appendNames(wait, w)
	}
	slices.Sort(run)
	slices.Sort(wait)
	return run, wait, maxLora
}

// countNames counts the distinct comma-separated names of v.
func countNames(v string) int {
	var buf [8]string
	return len(appendNames(buf[:0], v))
}

// appendNames adds the comma-separated names of v to dst, once each.
func appendNames(dst []string, v string) []string {
	for name := range strings.SplitSeq(v, ",") {
		name = strings.TrimSpace(name)
		if name != "" && !slices.Contains(dst, name) {
			dst = append(dst, name)
		}
	}
	return dst
}

func sglangSample(fams map[string]*dto.MetricFamily) (LoadSample, bool) {
	var s LoadSample
	kv, okKV := mean(fams, sglangUsage)
	run, okRun := sum(fams, sglangRunning)
	wait, okWait := sum(fams, sglangQueue)
	s.KVUsage, s.KVKnown = kv, okKV
	s.Running, s.Waiting = int(run), int(wait)
	// SGLang exports the LoRA pool's size, not the adapters' names.
	if n, ok := sum(fams, sglangLoraMax); ok {
		s.MaxLora = int(n)
	}
	s.LoraRunning, s.LoraWaiting = []string{}, []string{}
	s.TTFTSeconds, s.TTFTCount, s.TTFTKnown = histogram(fams, sglangTTFT)
	return s, okKV || okRun || okWait
}

// llamaSample reads llama.cpp's counts. It has no KV metric; the adapter
// fills KVUsage from /slots (see slotUsage).
func llamaSample(fams map[string]*dto.MetricFamily) (LoadSample, bool) {
	var s LoadSample
	run, okRun := sum(fams, llamaRunning)
	wait, okWait := sum(fams, llamaDeferred)
	s.Running, s.Waiting = int(run), int(wait)
	s.LoraRunning, s.LoraWaiting = []string{}, []string{}
	return s, okRun || okWait
}

// tgiSample reads TGI's queue and batch size. TGI has no KV metric; the
// adapter estimates it from the batch fill (see estimateKV).
func tgiSample(fams map[string]*dto.MetricFamily) (LoadSample, bool) {
	var s LoadSample
	run, okRun := sum(fams, tgiBatch)
	wait, okWait := sum(fams, tgiQueue)
	s.Running, s.Waiting = int(run), int(wait)
	s.LoraRunning, s.LoraWaiting = []string{}, []string{}
	return s, okRun || okWait
}

// estimateKV fills an unknown KV usage from the batch fill, so brokers that
// weigh kv_usage still see a loaded engine as loaded.
func estimateKV(s *LoadSample, maxBatch int) {
	if s.KVKnown || maxBatch <= 0 {
		return
	}
	s.KVUsage = min(1, float64(s.Running)/float64(maxBatch))
}

// slotUsage reads llama.cpp's GET /slots: the share of slots processing,
// and the number of slots (its batch size, --parallel).
func slotUsage(r io.Reader) (float64, int, error) {
	var slots []struct {
		IsProcessing bool `json:"is_processing"`
	}
	if err := json.NewDecoder(r).Decode(&slots); err != nil {
		return 0, 0, fmt.Errorf("decode /slots: %w", err)
	}
	if len(slots) == 0 {
		return 0, 0, errors.New("decode /slots: no slots")
	}
	busy := 0
	for _, s := range slots {
		if s.IsProcessing {
			busy++
		}
	}
	return float64(busy) / float64(len(slots)), len(slots), nil
}
