package adapter_test

import (
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/internal/testkit"
	adapter "github.com/switchyard-llm/switchyard/replica-adapter"
	"github.com/switchyard-llm/switchyard/subjects"
)

// TestLimitsSayWhereTheyCameFrom: the batch size is the operator's when
// configured, else the engine's where it exports one (llama.cpp's slots),
// else a default; the heartbeat and replicas.<id> carry the number, the
// heartbeat where it came from.
func TestLimitsSayWhereTheyCameFrom(t *testing.T) {
	tests := []struct {
		name                 string
		metrics, slots       string
		maxBatch, maxQueue   int
		batch, queue         int
		batchFrom, queueFrom string
	}{
		{"llama.cpp slots, nothing configured", "llamacpp/metrics-from-source.txt", "llamacpp/slots-docs-example.json", 0, 0,
			2, adapter.DefaultMaxQueue, adapter.LimitEngine, adapter.LimitDefault},
		{"configured wins over the engine", "llamacpp/metrics-from-source.txt", "llamacpp/slots-docs-example.json", 8, 16,
			8, 16, adapter.LimitConfigured, adapter.LimitConfigured},
		{"vLLM without the number: a default", "vllm/metrics-idle.txt", "", 0, 0,
			adapter.DefaultMaxBatch, adapter.DefaultMaxQueue, adapter.LimitDefault, adapter.LimitDefault},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			e.eng.metrics.Store(tt.metrics)
			e.eng.slots.Store(tt.slots)
			cfg := e.config()
			cfg.MaxBatch, cfg.MaxQueue = tt.maxBatch, tt.maxQueue
			nextHB := heartbeats(t, e.nc, cfg.Replica)
			e.start(cfg)
			hb := waitHeartbeat(t, nextHB, func(hb subjects.Heartbeat) error {
				if !hb.ScrapeOK {
					return errNotYet
				}
				return nil
			})
			if hb.MaxBatch != tt.batch || hb.MaxQueue != tt.queue || hb.MaxBatchFrom != tt.batchFrom || hb.MaxQueueFrom != tt.queueFrom {
				t.Fatalf("heartbeat batch %d (%s) queue %d (%s), want %d (%s) %d (%s)",
					hb.MaxBatch, hb.MaxBatchFrom, hb.MaxQueue, hb.MaxQueueFrom, tt.batch, tt.batchFrom, tt.queue, tt.queueFrom)
			}
			e.waitReady(cfg.Replica)
			testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
				r, err := e.replica(cfg.Replica)
				if err != nil {
					return err
				}
				if r.MaxBatch != tt.batch || r.MaxQueue != tt.queue {
					return errNotYet
				}
				return nil
			})

		})
	}
}
