package decider

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/switchyard-llm/switchyard/subjects"
)

// An adapter speaks only for its own replica, only up to the capacity it
// declares; what does not decode is counted and dropped.
func TestKVUpdatesTrust(t *testing.T) {
	b := newTestBroker(t, 2, time.Unix(1_800_000_000, 0))
	send := func(subject string, u subjects.KVUpdate) {
		data, _ := json.Marshal(u)
		b.onKV(&nats.Msg{Subject: subject, Data: data})
	}
	const model = "llama-3-70b-instruct"
	keys := func(n int) []uint64 {
		k := make([]uint64, n)
		for i := range k {
			k[i] = uint64(i + 1)
		}
		return k
	}

	t.Run("an update naming another replica than its subject is refused", func(t *testing.T) {
		send("llm.kv.r-0", subjects.KVUpdate{Replica: "r-1", Model: model, Seq: 1, Reset: true, KVBlocks: 100, Stored: keys(5)})
		if n := b.router.KVKeys("r-1"); n != 0 {
			t.Fatalf("r-0's subject put %d keys on r-1", n)
		}
		if got := testutil.ToFloat64(b.metrics.refused.WithLabelValues(refusedKVReplica)); got != 1 {
			t.Errorf("refused %v, want 1", got)
		}
	})
	t.Run("a replica not in the table is refused", func(t *testing.T) {
		send("llm.kv.ghost", subjects.KVUpdate{Replica: "ghost", Model: model, Seq: 1, Reset: true, KVBlocks: 100, Stored: keys(5)})
		if n := b.router.KVKeys("ghost"); n != 0 {
			t.Fatalf("an unregistered replica got %d keys", n)
		}
	})
	t.Run("a model the replica does not serve is refused", func(t *testing.T) {
		before := testutil.ToFloat64(b.metrics.refused.WithLabelValues(refusedReplica))
		for i := range 3 {
			send("llm.kv.r-1", subjects.KVUpdate{Replica: "r-1", Model: fmt.Sprintf("invented-%d", i), Seq: 1, Reset: true, KVBlocks: 100, Stored: keys(5)})
		}
		if n := b.router.KVKeys("r-1"); n != 0 {
			t.Fatalf("r-1 got %d keys for models it does not serve", n)
		}
		if got := testutil.ToFloat64(b.metrics.refused.WithLabelValues(refusedReplica)) - before; got != 3 {
			t.Errorf("refused %v, want 3", got)
		}
		if n := testutil.CollectAndCount(b.metrics.prefixIndex); n > 1 {
			t.Errorf("%d prefix-index series: invented model names became labels", n)
		}
	})
	t.Run("a flood stops at the declared capacity", func(t *testing.T) {
		send("llm.kv.r-0", subjects.KVUpdate{Replica: "r-0", Model: model, Seq: 1, Reset: true, KVBlocks: 50, Stored: keys(subjects.MaxKVUpdateKeys)})
		for seq := uint64(2); seq < 6; seq++ {
			send("llm.kv.r-0", subjects.KVUpdate{Replica: "r-0", Model: model, Seq: seq, KVBlocks: 50, Stored: keys(subjects.MaxKVUpdateKeys)})
		}
		if n := b.router.KVKeys("r-0"); n != 50 {
			t.Fatalf("r-0 holds %d keys, declared 50", n)
		}
		if got := testutil.ToFloat64(b.metrics.kvRefused.WithLabelValues("bounds")); got < 1 {
			t.Errorf("bounds refusals %v", got)
		}
		if got := testutil.ToFloat64(b.metrics.prefixIndex.WithLabelValues(model)); got != 50 {
			t.Errorf("switchyard_broker_prefix_index_entries = %v, want 50", got)
		}
	})
	t.Run("malformed and oversized updates are counted and dropped", func(t *testing.T) {
		before := testutil.ToFloat64(b.metrics.badMessages.WithLabelValues("kv"))
		b.onKV(&nats.Msg{Subject: "llm.kv.r-1", Data: []byte(`{"replica":`)})
		b.onKV(&nats.Msg{Subject: "llm.kv.r-1", Data: []byte(`{"replica":"r-1","stored":[` + strings.Repeat("1,", subjects.MaxKVUpdateBytes/2) + `1]}`)})
		if got := testutil.ToFloat64(b.metrics.badMessages.WithLabelValues("kv")) - before; got != 2 {
			t.Errorf("bad kv messages counted %v, want 2", got)
		}
		if n := b.router.KVKeys("r-1"); n != 0 {
			t.Fatalf("r-1 holds %d keys", n)
		}
	})
}
