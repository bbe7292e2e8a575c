package decider

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/switchyard-llm/switchyard/internal/kvevents"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// maxUnhealthyTracked bounds the set of replicas remembered as unhealthy
// (for logging transitions only); beyond it transitions are not logged.
const maxUnhealthyTracked = 4096

// maxHeartbeatBytes bounds a heartbeat: an honest one is well under a
// kilobyte plus its LoRA adapters' names.
const maxHeartbeatBytes = 64 << 10

// errHeartbeat is wrapped by every reason a heartbeat is refused.
var errHeartbeat = errors.New("bad heartbeat")

// DecodeHeartbeat decodes a heartbeat received on subject and validates it
// as every reader of the load view takes it (deciders, and batchers, which
// pace on it): the replica id is a valid token and the one the
// subject names (NATS permissions decide who may publish on
// llm.heartbeat.<id>, so the body may not speak for another replica), and
// the state is one of the four.
//
// A ready replica whose adapter cannot scrape its engine (scrape_ok false:
// /health or /metrics failing past the adapter's limit) is taken as
// draining: no new requests, the ones it has continue. The policy's
// candidate filter looks only at the state, so this is where scrape_ok is
// honoured. unhealthy reports that rewrite. A loading replica stays
// loading, so a model on its way is still answered as model_loading.
func DecodeHeartbeat(subject string, data []byte, hb *subjects.Heartbeat) (unhealthy bool, err error) {
	if len(data) > maxHeartbeatBytes {
		return false, fmt.Errorf("%w: %d bytes", errHeartbeat, len(data))
	}
	if err := json.Unmarshal(data, hb); err != nil {
		return false, fmt.Errorf("%w: %w", errHeartbeat, err)
	}
	if err := subjects.ValidToken(hb.Replica); err != nil {
		return false, fmt.Errorf("%w: replica: %w", errHeartbeat, err)
	}
	if i := strings.LastIndexByte(subject, '.'); i < 0 || subject[i+1:] != hb.Replica {
		return false, fmt.Errorf("%w: replica %q published on %q", errHeartbeat, hb.Replica, subject)
	}
	if !subjects.ValidState(hb.State) {
		return false, fmt.Errorf("%w: state %q", errHeartbeat, hb.State)
	}
	if hb.Region != "" {
		if err := subjects.ValidToken(hb.Region); err != nil {
			return false, fmt.Errorf("%w: region: %w", errHeartbeat, err)
		}
	}
	if err := inRange(hb); err != nil {
		return false, fmt.Errorf("%w: %w", errHeartbeat, err)
	}
	if !hb.ScrapeOK && hb.State == subjects.StateReady {
		hb.State = subjects.StateDraining
		return true, nil
	}
	return false, nil
}

// inRange range-checks a heartbeat's numbers and sizes: a kv_usage of
// -1e300 would draw every request to one replica, an absurd failure count
// eject it (docs/security.md, "Bounds"). A heartbeat out of range is
// refused whole: its replica keeps its last good one until dead_after.
func inRange(hb *subjects.Heartbeat) error {
	const maxCount = subjects.MaxHeartbeatCount
	switch {
	case !(hb.KVUsage >= 0 && hb.KVUsage <= 1):
		return fmt.Errorf("kv_usage %v not in [0, 1]", hb.KVUsage)
	case !count(hb.Running) || !count(hb.Waiting) || !count(hb.MaxBatch) || !count(hb.MaxQueue) || !count(hb.Inflight) || !count(hb.EngineFailures) || !count(hb.BatchWaiting):
		return fmt.Errorf("a count (running, waiting, max_batch, max_queue, inflight, engine_failures, batch_waiting) not in [0, %d]", maxCount)
	case !millis(hb.TTFTEWMAMillis) || !millis(hb.QueueWaitMillis) || !millis(hb.DecodeMillis):
		return fmt.Errorf("ttft_ewma_ms, queue_wait_ewma_ms or decode_ms not in [0, %d]", subjects.MaxHeartbeatMillis)
	case !(hb.PrefillTokensPerSec >= 0 && hb.PrefillTokensPerSec <= subjects.MaxPrefillTokensPerSec):
		return fmt.Errorf("prefill_tps %v not in [0, %g]", hb.PrefillTokensPerSec, subjects.MaxPrefillTokensPerSec)
	case hb.QueuedPrefillTokens < 0 || hb.QueuedPrefillTokens > subjects.MaxQueuedPrefillTokens:
		return fmt.Errorf("queued_prefill_tokens %d not in [0, %d]", hb.QueuedPrefillTokens, subjects.MaxQueuedPrefillTokens)
	case len(hb.Lora.Running)+len(hb.Lora.Waiting) > subjects.MaxLoraAdapters || hb.Lora.Max < 0 || hb.Lora.Max > subjects.MaxLoraAdapters:
		return fmt.Errorf("lora lists or max beyond %d", subjects.MaxLoraAdapters)
	case hb.KVBlocks < 0 || hb.KVBlocks > subjects.MaxKVBlocks || hb.BlockSize < 0 || hb.BlockSize > 1024:
		return fmt.Errorf("kv_blocks not in [0, %d] or block_size not in [0, 1024]", subjects.MaxKVBlocks)
	case len(hb.Model) > subjects.MaxModelChars || len(hb.Version) > subjects.MaxModelChars || len(hb.Pool) > subjects.MaxModelChars:
		return fmt.Errorf("model, version or pool longer than %d", subjects.MaxModelChars)
	case hb.KVEventsRefused != "" && !kvevents.IsRefusal(hb.KVEventsRefused):
		return fmt.Errorf("kv_events_refused %.64q is not a refusal reason", hb.KVEventsRefused)
	}
	for _, l := range [2][]string{hb.Lora.Running, hb.Lora.Waiting} {
		for _, a := range l {
			if len(a) > subjects.MaxModelChars {
				return fmt.Errorf("lora adapter name longer than %d", subjects.MaxModelChars)
			}
		}
	}
	return nil
}

func count(n int) bool { return n >= 0 && n <= subjects.MaxHeartbeatCount }

// millis also refuses NaN, which fails every comparison.
func millis(v float64) bool { return v >= 0 && v <= subjects.MaxHeartbeatMillis }

// health remembers which replicas are excluded for failing scrapes, so the
// broker logs each exclusion and recovery once rather than every second.
type health struct {
	mu        sync.Mutex
	unhealthy map[string]struct{}
}

// changed records replica's health and reports whether it changed.
func (h *health) changed(replica string, unhealthy bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, was := h.unhealthy[replica]
	switch {
	case unhealthy && !was:
		if h.unhealthy == nil {
			h.unhealthy = map[string]struct{}{}
		}
		if len(h.unhealthy) >= maxUnhealthyTracked {
			return false
		}
		h.unhealthy[replica] = struct{}{}
		return true
	case !unhealthy && was:
		delete(h.unhealthy, replica)
		return true
	}
	return false
}

// heard remembers which registered replicas a starting broker has heard
// from, until it is warm.
type heard struct {
	mu   sync.Mutex
	ids  map[string]struct{}
	warm bool
}

func (h *heard) add(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.warm {
		return
	}
	if h.ids == nil {
		h.ids = map[string]struct{}{}
	}
	h.ids[id] = struct{}{}
}

// all reports whether every replica ready in t was heard from.
func (h *heard) all(t *table.Snapshot) bool {
	if t == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for id, r := range t.Replicas {
		if _, ok := h.ids[id]; !ok && r.State == subjects.StateReady {
			return false
		}
	}
	return true
}

func (h *heard) done() {
	h.mu.Lock()
	h.warm, h.ids = true, nil
	h.mu.Unlock()
}

// WarmUp waits until the decider has heard a heartbeat from every replica
// its table has ready, at most wait (negative: no wait). A broker that
// joined the queue group cold, or a gateway that decided cold, would answer
// no_replicas to its requests until the first heartbeats came in (a rolling
// restart would show them). It reports false when ctx ended.
func (dec *Decider) WarmUp(ctx context.Context, wait time.Duration) bool {
	defer dec.heard.done()
	if wait < 0 {
		return true
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if dec.heard.all(dec.router.Table()) {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-deadline.C:
			dec.log.Warn("joining the queue group without a heartbeat from every ready replica", "waited", wait)
			return true
		case <-tick.C:
		}
	}
}
