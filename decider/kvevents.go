package decider

import (
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/broker/policy/kvindex"
	"github.com/switchyard-llm/switchyard/internal/clip"
	"github.com/switchyard-llm/switchyard/subjects"
)

// onKV applies an adapter's KV-cache key update to the exact prefix index.
// It is believed only for the replica its subject names (NATS permissions
// let adapter-<replica> publish on llm.kv.<replica> alone), only for a
// replica registered in the table, and only up to the capacity it declares
// (docs/security.md, "Bounds").
func (dec *Decider) onKV(m *nats.Msg) {
	var u subjects.KVUpdate
	if len(m.Data) > subjects.MaxKVUpdateBytes || json.Unmarshal(m.Data, &u) != nil {
		dec.metrics.badMessages.WithLabelValues("kv").Inc()
		return
	}
	if i := strings.LastIndexByte(m.Subject, '.'); i < 0 || m.Subject[i+1:] != u.Replica {
		dec.refuse(refusedKVReplica, "KV-cache update speaking for another replica ignored", "subject", m.Subject, "replica", clip.Text(u.Replica, 128))
		return
	}
	t := dec.router.Table()
	if t == nil || t.Replicas[u.Replica] == nil {
		dec.refuseUnregistered("KV-cache update", u.Replica)
		return
	}
	if r := t.Replicas[u.Replica]; u.Model != r.Model {
		// The model is the index's key and a metric's label: a replica
		// speaks only for the model it registered, or names would grow
		// without bound.
		dec.refuse(refusedReplica, "KV-cache update for a model its replica does not serve ignored", "replica", u.Replica, "model", clip.Text(u.Model, 128))
		return
	}
	err := dec.router.ObserveKV(&u)
	switch {
	case errors.Is(err, kvindex.ErrSeq):
		// Updates were missed: ask the adapters to resend (at most once a
		// second; each answers with a reset of its own replica).
		dec.metrics.kvRefused.WithLabelValues("sequence").Inc()
		dec.requestKVSync()
	case err != nil:
		dec.metrics.kvRefused.WithLabelValues("bounds").Inc()
	}
	dec.router.PrefixIndexEntries(func(model string, n int) {
		if model == u.Model {
			dec.metrics.prefixIndex.WithLabelValues(model).Set(float64(n))
		}
	})
}

// requestKVSync asks every adapter with a feed to resend what its engine
// holds, at most once a second: a decider that starts late, or missed
// updates, has the full index from the answers.
func (dec *Decider) requestKVSync() {
	now := dec.clock.Nanos(time.Now())
	last := dec.kvSyncAt.Load()
	if now-last < int64(time.Second) || !dec.kvSyncAt.CompareAndSwap(last, now) {
		return
	}
	_ = dec.nc.Publish(dec.subj.KVSync(), nil)
}
