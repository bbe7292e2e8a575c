package ui_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
	"github.com/switchyard-llm/switchyard/ui"
)

// cachedView is what /ui/state says of one replica's cache.
type cachedView struct {
	KVEvents     bool `json:"kv_events"`
	CachedBlocks int  `json:"cached_blocks"`
}

// cachedOf reads /ui/state and returns what it says of replica id.
func cachedOf(t *testing.T, base, id string) (cachedView, error) {
	t.Helper()
	resp, err := http.Get(base + "/ui/state")
	if err != nil {
		return cachedView{}, err
	}
	defer resp.Body.Close()
	var s struct {
		Models []struct {
			Pools []struct {
				Replicas []struct {
					ID string `json:"id"`
					cachedView
				} `json:"replicas"`
			} `json:"pools"`
		} `json:"models"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		return cachedView{}, err
	}
	for _, m := range s.Models {
		for _, p := range m.Pools {
			for _, r := range p.Replicas {
				if r.ID == id {
					return r.cachedView, nil
				}
			}
		}
	}
	return cachedView{}, fmt.Errorf("%s not in /ui/state", id)
}

// waitCached polls /ui/state until replica id shows want.
func waitCached(t *testing.T, base, id string, want cachedView) {
	t.Helper()
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		got, err := cachedOf(t, base, id)
		if err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("%s shows %+v, want %+v", id, got, want)
		}
		return nil
	})
}

func TestCachedBlocksPerReplicaFromTheKVEventIndex(t *testing.T) {
	snap := devSnapshot(t)
	r, _ := newRig(t, ui.Config{Table: func() *table.Snapshot { return snap }})
	subj := subjects.New("")
	base := r.srv.URL
	hb := func(id string, live bool) {
		r.publish(t, subj.Heartbeat(id), subjects.Heartbeat{Replica: id, Model: "m-a", Version: "v1", Pool: "general",
			State: subjects.StateReady, ScrapeOK: true, KVEvents: live, KVBlocks: 1024, BlockSize: 16})
	}
	update := func(subject string, u subjects.KVUpdate) {
		u.Model, u.KVBlocks = "m-a", 1024
		r.publish(t, subject, u)
	}

	// A feed that reset and stored three keys, then evicted one.
	hb("r-gen-1", true)
	update(subj.KV("r-gen-1"), subjects.KVUpdate{Replica: "r-gen-1", Seq: 1, Reset: true, Stored: []uint64{11, 12, 13}})
	waitCached(t, base, "r-gen-1", cachedView{KVEvents: true, CachedBlocks: 3})
	update(subj.KV("r-gen-1"), subjects.KVUpdate{Replica: "r-gen-1", Seq: 2, Evicted: []uint64{12}})
	waitCached(t, base, "r-gen-1", cachedView{KVEvents: true, CachedBlocks: 2})

	// An update on r-gen-1's subject that speaks for r-can-0 is not
	// believed, nor one for a model its replica does not serve.
	update(subj.KV("r-gen-1"), subjects.KVUpdate{Replica: "r-can-0", Seq: 1, Reset: true, Stored: []uint64{1, 2, 3, 4}})
	r.publish(t, subj.KV("r-b-0"), subjects.KVUpdate{Replica: "r-b-0", Model: "m-a", KVBlocks: 1024, Seq: 1, Reset: true, Stored: []uint64{5}})
	// A replica cannot hold more keys than its declared capacity.
	big := make([]uint64, 40)
	for i := range big {
		big[i] = uint64(100 + i)
	}
	r.publish(t, subj.KV("r-gen-0"), subjects.KVUpdate{Replica: "r-gen-0", Model: "m-a", KVBlocks: 32, Seq: 1, Reset: true, Stored: big})
	hb("r-gen-0", true)
	waitCached(t, base, "r-gen-0", cachedView{KVEvents: true, CachedBlocks: 32})
	for _, id := range []string{"r-can-0", "r-b-0"} {
		if got, err := cachedOf(t, base, id); err != nil || got.CachedBlocks != 0 {
			t.Errorf("%s: %+v (%v), want no cached blocks from a forged update", id, got, err)
		}
	}

	// A missed update leaves the replica's count unknown, not wrong.
	update(subj.KV("r-gen-1"), subjects.KVUpdate{Replica: "r-gen-1", Seq: 4, Stored: []uint64{14}})
	waitCached(t, base, "r-gen-1", cachedView{KVEvents: false, CachedBlocks: 0})
	// The feed resynchronises with a reset.
	update(subj.KV("r-gen-1"), subjects.KVUpdate{Replica: "r-gen-1", Seq: 5, Reset: true, Stored: []uint64{11, 13, 14}})
	waitCached(t, base, "r-gen-1", cachedView{KVEvents: true, CachedBlocks: 3})

	// A heartbeat saying the feed is lost drops what was known.
	hb("r-gen-1", false)
	waitCached(t, base, "r-gen-1", cachedView{KVEvents: false, CachedBlocks: 0})
}
