package adapter_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/enginesim"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	adapter "github.com/switchyard-llm/switchyard/replica-adapter"
	"github.com/switchyard-llm/switchyard/subjects"
)

// An adapter that floods a prefill replica with legs in its own name gets
// every leg past its bound (the replica's max batch) refused at once, 503
// all_replicas_busy with Retry-After, while its legs in flight hold the
// engine; another decode replica's split request still has its prefill
// leg served there. Past the replica's batch and queue the legs of every
// sender are refused.
func TestOneSendersPrefillLegsAreBounded(t *testing.T) {
	// Each flooding leg prefills a prompt of its own (no cached prefix)
	// at 2 ms a token, about 2 s: the first legs are in flight while the
	// rest arrive, and while d-1's leg does.
	const maxBatch, maxQueue, over = 2, 1, 4
	pd := newPDPairWith(t, enginesim.ServerConfig{Speed: 1, Engine: enginesim.Config{PrefillPerToken: 2 * time.Millisecond}},
		func(c *adapter.Config) { c.MaxBatch, c.MaxQueue = maxBatch, maxQueue }, nil)
	subj := subjects.New("")
	answers, err := pd.e.nc.SubscribeSync(nats.NewInbox())
	if err != nil {
		t.Fatal(err)
	}
	for i := range maxBatch + over {
		body := `{"model": "pd-model", "messages": [{"role": "user", "content": "` +
			strings.Repeat(fmt.Sprintf("flood%d ", i), 600) + `"}], "max_tokens": 5}`
		m := &nats.Msg{Subject: subj.Prefill("p-1", "d-2"), Reply: answers.Subject, Header: splitHeaders(fmt.Sprint("flood-", i), ""), Data: []byte(body)}
		if err := pd.e.nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}

	// What the flooding sender sees first: a refusal for each leg past
	// its bound, in the reply protocol's shape.
	for refused := 0; refused < over; refused++ {
		m, err := answers.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("%d of the %d legs past the bound refused: %v", refused, over, err)
		}
		var e subjects.ErrorBody
		if err := json.Unmarshal(m.Data, &e); err != nil {
			t.Fatalf("answer %q: %v", m.Data, err)
		}
		if st := m.Header.Get(subjects.HdrStatus); st != "503" {
			t.Fatalf("a leg past the bound of %d in flight was answered %s (%v), want 503", maxBatch, st, e.Error.Code)
		}
		if e.Error.Code != subjects.CodeAllReplicasBusy || e.Error.Type != "server_error" ||
			m.Header.Get(subjects.HdrRetryAfter) != "1" || m.Header.Get(subjects.HdrRetryAfterMS) != "1000" || m.Header.Get(subjects.HdrEOS) != "1" {
			t.Errorf("refusal %v: %s", m.Header, m.Data)
		}
	}

	// d-1's split request, while d-2's legs fill their share: its leg
	// reaches the engine beside them and is served.
	ch := pd.e.request("d-1", splitHeaders("req-other", "p-1"),
		`{"model": "pd-model", "messages": [{"role": "user", "content": "a short question of d-1's own"}], "max_tokens": 5}`)
	testkit.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if n := pd.prefill.InFlight(); n != maxBatch+1 {
			return fmt.Errorf("%d legs in the prefill engine, want d-2's %d and d-1's", n, maxBatch)
		}
		return nil
	})

	// The replica's batch and queue are full of legs: a third sender's
	// is refused too.
	m, err := pd.e.nc.RequestMsg(&nats.Msg{Subject: subj.Prefill("p-1", "d-3"), Header: splitHeaders("req-third", ""), Data: []byte(longBody("5"))}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if m.Header.Get(subjects.HdrStatus) != "503" || m.Header.Get(subjects.HdrRetryAfter) != "1" || !strings.Contains(string(m.Data), subjects.CodeAllReplicasBusy) {
		t.Errorf("a leg past %d in flight: %v %.300s", maxBatch+maxQueue, m.Header, m.Data)
	}

	var head nats.Header
	for end := false; !end; {
		select {
		case m := <-ch:
			if head == nil && m.Header.Get(subjects.HdrStatus) != "" {
				head = m.Header
			}
			end = m.Header.Get(subjects.HdrEOS) == "1"
		case <-time.After(30 * time.Second):
			t.Fatal("d-1's request not answered within 30 s")
		}
	}
	if head.Get(subjects.HdrStatus) != "200" || head.Get(subjects.HdrRoutePrefill) != "p-1" || head.Get(subjects.HdrRouteReason) != "power-of-two" {
		t.Errorf("d-1's request was not served with its prefill leg: %v", head)
	}
	if ds := pd.decode.KVTransfers(); len(ds) != 1 || !ds[0].DoRemotePrefill || ds[0].RemoteEngineID == nil || *ds[0].RemoteEngineID != pd.prefill.EngineID() {
		t.Errorf("decode engine saw %+v", ds)
	}

	// The legs within the bound are served.
	for range maxBatch {
		m, err := answers.NextMsg(30 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var a chatAnswer
		if st := m.Header.Get(subjects.HdrStatus); st != "200" || json.Unmarshal(m.Data, &a) != nil || a.KV == nil {
			t.Errorf("a leg within the bound: %s %.300s", st, m.Data)
		}
	}

	// Served legs leave the bound: the flooding sender's next leg, once
	// its others are done, is served, not refused.
	testkit.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if n := pd.prefill.InFlight(); n != 0 {
			return fmt.Errorf("%d legs still in the prefill engine", n)
		}
		return nil
	})
	m, err = pd.e.nc.RequestMsg(&nats.Msg{Subject: subj.Prefill("p-1", "d-2"), Header: splitHeaders("flood-after", ""), Data: []byte(longBody("5"))}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if st := m.Header.Get(subjects.HdrStatus); st != "200" {
		t.Errorf("d-2's leg after its flood was done: %s %.300s, want 200", st, m.Data)
	}
}
