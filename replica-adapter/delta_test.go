package adapter_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/subjects"
)

// loadDeltas subscribes to replica's load deltas.
func loadDeltas(t *testing.T, e *env, replica string) <-chan subjects.LoadDelta {
	t.Helper()
	ch := make(chan subjects.LoadDelta, 1024)
	sub, err := e.nc.Subscribe(subjects.New("").Load(replica), func(m *nats.Msg) {
		var d subjects.LoadDelta
		if err := json.Unmarshal(m.Data, &d); err != nil {
			t.Errorf("load delta %s: %v", m.Data, err)
			return
		}
		ch <- d
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return ch
}

func TestLoadDeltasFollowRequestsCoalesced(t *testing.T) {
	e := newEnv(t)
	release := make(chan struct{})
	e.eng.handle(func(w http.ResponseWriter, r *http.Request) {
		if !wait(r, release) {
			return
		}
		streamSSE(t)(w, r)
	})
	cfg := e.config()
	cfg.HeartbeatEvery = 30 * time.Minute // deltas alone tell the change
	e.start(cfg)
	deltas := loadDeltas(t, e, "r-1")

	// A burst of 20 requests within a few milliseconds: far fewer than
	// 20 deltas, the last of them holding all 20.
	const n = 20
	begun := time.Now()
	var replies []<-chan *nats.Msg
	for i := range n {
		h := chatHeaders("burst-" + strconv.Itoa(i))
		h.Set(subjects.HdrPromptTokens, "100")
		h.Set(subjects.HdrBroker, "broker-a")
		h.Set(subjects.HdrPredictedTTFT, "40")
		replies = append(replies, e.request("r-1", h, `{"model":"sim-model","stream":true,"messages":[]}`))
	}
	var got []subjects.LoadDelta
	for len(got) == 0 || got[len(got)-1].Inflight < n || got[len(got)-1].QueuedPrefillTokens < n*100 {
		select {
		case d := <-deltas:
			got = append(got, d)
		case <-time.After(5 * time.Second):
			t.Fatalf("no delta with %d requests in flight and their prompts queued: %+v", n, got)
		}
	}
	last := got[len(got)-1]
	if last.Replica != "r-1" || last.QueuedPrefillTokens != n*100 || last.Heartbeat == 0 {
		t.Errorf("delta %+v, want r-1 with %d queued prefill tokens after a heartbeat", last, n*100)
	}
	// At most one delta every LoadDeltaEvery, the first at once.
	if most := int(time.Since(begun)/subjects.LoadDeltaEvery) + 1; len(got) > most {
		t.Errorf("%d deltas in %v, want at most %d", len(got), time.Since(begun), most)
	}
	for i := 1; i < len(got); i++ {
		if got[i].Seq <= got[i-1].Seq {
			t.Errorf("delta seq %d after %d", got[i].Seq, got[i-1].Seq)
		}
	}

	// The first tokens come back with the predictions, for broker-a, and
	// the last delta says nothing is in flight.
	close(release)
	for _, r := range replies {
		untilEnd(t, r)
	}
	samples := 0
	for last.Inflight != 0 {
		select {
		case d := <-deltas:
			last = d
			for _, s := range d.TTFT {
				if s.Broker != "broker-a" || s.Predicted != 40 || s.Observed <= 0 {
					t.Errorf("ttft sample %+v, want broker-a's prediction of 40 ms and an observed time", s)
				}
			}
			samples += len(d.TTFT)
		case <-time.After(5 * time.Second):
			t.Fatalf("deltas stopped with %d in flight and %d ttft samples", last.Inflight, samples)
		}
	}
	if last.QueuedPrefillTokens != 0 {
		t.Errorf("nothing in flight, %d prefill tokens queued", last.QueuedPrefillTokens)
	}
	// One delta carries at most MaxLoadDeltaTTFT samples; the rest of a
	// period's are dropped.
	if samples < subjects.MaxLoadDeltaTTFT || samples > n {
		t.Errorf("%d ttft samples of %d first tokens, want %d to %d", samples, n, subjects.MaxLoadDeltaTTFT, n)
	}
}
