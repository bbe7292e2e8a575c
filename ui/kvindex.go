package ui

import (
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/broker/policy/kvindex"
	"github.com/switchyard-llm/switchyard/subjects"
)

// The dashboard's cached blocks per replica come from an exact prefix
// index of its own (broker/policy/kvindex, the one every decider keeps), fed
// by the adapters' KV-cache key updates on llm.kv.<replica> and believed
// as a broker believes them: only for the replica the subject names, only
// for the model its registration serves, and only up to the capacity it
// declares.

// kvSyncEvery bounds how often the dashboard asks the adapters to resend
// (llm.kvsync): when it starts, and when it finds it missed an update.
const kvSyncEvery = time.Second

func (u *UI) onKV(m *nats.Msg) {
	var up subjects.KVUpdate
	if len(m.Data) > subjects.MaxKVUpdateBytes || json.Unmarshal(m.Data, &up) != nil {
		u.log.Debug("bad KV-cache update", "subject", m.Subject)
		return
	}
	if i := strings.LastIndexByte(m.Subject, '.'); i < 0 || m.Subject[i+1:] != up.Replica {
		u.log.Debug("KV-cache update speaking for another replica ignored", "subject", m.Subject)
		return
	}
	t := u.tableSnapshot()
	if t == nil || t.Replicas[up.Replica] == nil || t.Replicas[up.Replica].Model != up.Model {
		// Unregistered replicas and foreign models would grow the index
		// without bound.
		return
	}
	u.mu.Lock()
	err := u.kv.Apply(&up)
	u.dirty = true
	u.mu.Unlock()
	if errors.Is(err, kvindex.ErrSeq) {
		u.requestKVSync()
	}
}

// requestKVSync asks every adapter with a KV-event feed to resend what its
// engine holds, at most once per kvSyncEvery.
func (u *UI) requestKVSync() {
	now := time.Now().UnixNano()
	last := u.kvSyncAt.Load()
	if now-last < int64(kvSyncEvery) || !u.kvSyncAt.CompareAndSwap(last, now) {
		return
	}
	if err := u.nc.Publish(u.subj.KVSync(), nil); err != nil {
		u.log.Debug("KV sync request not sent", "err", err)
	}
}
