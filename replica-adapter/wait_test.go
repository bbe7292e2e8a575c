package adapter_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects"
)

// TestIdleReplicaRecoversItsWaitEstimate replays what a real engine showed:
// a burst pushes the time to first token to seconds, the engine goes idle,
// and no further request arrives (brokers reject deadline-carrying requests
// on the estimate). The heartbeat must come back to the bare time to first
// token on its own.
func TestIdleReplicaRecoversItsWaitEstimate(t *testing.T) {
	e := newEnv(t)
	var slow atomic.Bool
	e.eng.handle(func(w http.ResponseWriter, r *http.Request) {
		if slow.Load() {
			select {
			case <-time.After(400 * time.Millisecond):
			case <-r.Context().Done():
				return
			}
		}
		streamSSE(t)(w, r)
	})
	cfg := e.config()
	e.start(cfg)
	e.waitReady(cfg.Replica)
	run := func(n int) {
		for i := range n {
			untilEnd(t, e.request(cfg.Replica, chatHeaders(fmt.Sprintf("q-%v-%d", slow.Load(), i)), `{"model":"sim-model","stream":true}`))
		}
	}
	run(1)
	slow.Store(true)
	run(6)

	hbs, err := e.nc.SubscribeSync(subjects.New("").Heartbeat(cfg.Replica))
	if err != nil {
		t.Fatal(err)
	}
	defer hbs.Unsubscribe()
	beat := func() subjects.Heartbeat {
		m, err := hbs.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var hb subjects.Heartbeat
		if err := json.Unmarshal(m.Data, &hb); err != nil {
			t.Fatal(err)
		}
		return hb
	}
	// Under load (the engine's metrics say 12 running) the estimate stands.
	if hb := beat(); hb.TTFTEWMAMillis < 200 || hb.QueueWaitMillis < 150 {
		t.Fatalf("after the burst: ttft %v queue %v, want the burst's", hb.TTFTEWMAMillis, hb.QueueWaitMillis)
	}
	e.eng.metrics.Store("vllm/metrics-idle.txt")
	start := time.Now()
	// Every sample of the burst took at least the engine's 400 ms; the bare
	// time to first token is the fast first request's, far below it even on
	// a loaded machine under -race.
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if hb := beat(); hb.TTFTEWMAMillis >= 400 || hb.QueueWaitMillis != 0 {
			return fmt.Errorf("idle engine: ttft %v queue %v", hb.TTFTEWMAMillis, hb.QueueWaitMillis)
		}
		return nil
	})

	t.Logf("wait estimate back to the bare time to first token %v after the engine went idle", time.Since(start).Round(time.Millisecond))
}

// TestHeartbeatCarriesTheDecodeTime streams answers whose engine takes
// 200 ms from the first chunk to the last: the heartbeat's decode_ms says
// how long a request holds its batch slot after its first token.
func TestHeartbeatCarriesTheDecodeTime(t *testing.T) {
	const decode = 200 * time.Millisecond
	e := newEnv(t)
	e.eng.handle(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i, c := range sseChunks(golden(t, "vllm/chat-stream-lora.sse")) {
			if i == 1 {
				select {
				case <-time.After(decode):
				case <-r.Context().Done():
					return
				}
			}
			_, _ = w.Write(c)
			w.(http.Flusher).Flush()
		}
	})
	cfg := e.config()
	e.start(cfg)
	e.waitReady(cfg.Replica)
	hbs, err := e.nc.SubscribeSync(subjects.New("").Heartbeat(cfg.Replica))
	if err != nil {
		t.Fatal(err)
	}
	defer hbs.Unsubscribe()
	if m, err := hbs.NextMsg(5 * time.Second); err != nil {
		t.Fatal(err)
	} else if hb := decodeHB(t, m.Data); hb.DecodeMillis != 0 {
		t.Fatalf("decode_ms %v before any stream ended", hb.DecodeMillis)
	}
	for i := range 3 {
		untilEnd(t, e.request(cfg.Replica, chatHeaders(fmt.Sprintf("d-%d", i)), `{"model":"sim-model","stream":true}`))
	}
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		m, err := hbs.NextMsg(5 * time.Second)
		if err != nil {
			return err
		}
		// At least the engine's pause; well under a second more even on a
		// loaded machine under -race.
		if hb := decodeHB(t, m.Data); hb.DecodeMillis < float64(decode/time.Millisecond) || hb.DecodeMillis > 1500 {
			return fmt.Errorf("decode_ms %v, want about %v", hb.DecodeMillis, decode)
		}
		return nil
	})
}

func decodeHB(t *testing.T, data []byte) subjects.Heartbeat {
	t.Helper()
	var hb subjects.Heartbeat
	if err := json.Unmarshal(data, &hb); err != nil {
		t.Fatal(err)
	}
	return hb
}
