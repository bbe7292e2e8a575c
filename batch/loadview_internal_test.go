package batch

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/subjects"
)

// heartbeatMsg is a heartbeat as an adapter publishes it.
func heartbeatMsg(hb subjects.Heartbeat) *nats.Msg {
	hb.ScrapeOK = true
	if hb.State == "" {
		hb.State = subjects.StateReady
	}
	data := fmt.Appendf(nil, `{"replica":%q,"pool":%q,"state":%q,"scrape_ok":true,"running":%d,"waiting":%d,"max_batch":%d,"max_queue":%d,"inflight":%d,"scheduling":%q,"seq":%d}`,
		hb.Replica, hb.Pool, hb.State, hb.Running, hb.Waiting, hb.MaxBatch, hb.MaxQueue, hb.Inflight, hb.Scheduling, hb.Seq)
	return &nats.Msg{Subject: "llm.heartbeat." + hb.Replica, Data: data}
}

// TestTheRoomIsTheReplicasFreeBatchSlots: the room a batcher sees is the
// batch slots the broker's batch-room check leaves on the pool's ready
// replicas (¾ of the batch first come first served, the batch and a
// quarter-batch queue where the engine schedules by priority), less what
// interactive work is predicted to take back, shared by the batchers.
func TestTheRoomIsTheReplicasFreeBatchSlots(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	for _, c := range []struct {
		name     string
		replicas []subjects.Heartbeat
		mine     int // lines this batcher holds
		batchers int // other batchers announcing
		want     Room
	}{
		{"nothing heard: pace on refusals", nil, 0, 0, Room{Batchers: 1}},
		{"fcfs: ¾ of the batch", []subjects.Heartbeat{{Replica: "r1", Pool: "general", MaxBatch: 64}}, 0, 0,
			Room{Known: true, Free: 48, Batchers: 1, Share: 48}},
		{"fcfs: what it holds is not free", []subjects.Heartbeat{{Replica: "r1", Pool: "general", MaxBatch: 64, Running: 30, Waiting: 2}}, 20, 0,
			Room{Known: true, Free: 16, Interactive: 12, Batchers: 1, Share: 16}},
		{"the adapter's count when it is more", []subjects.Heartbeat{{Replica: "r1", Pool: "general", MaxBatch: 64, Running: 10, Inflight: 40}}, 0, 0,
			Room{Known: true, Free: 8, Interactive: 40, Batchers: 1, Share: 8}},
		{"priority: the batch and a quarter batch queued", []subjects.Heartbeat{{Replica: "r1", Pool: "general", MaxBatch: 64, MaxQueue: 256, Scheduling: "priority"}}, 0, 0,
			Room{Known: true, Free: 80, Batchers: 1, Share: 80}},
		{"two replicas add up; a full one gives none", []subjects.Heartbeat{
			{Replica: "r1", Pool: "general", MaxBatch: 64, Running: 60},
			{Replica: "r2", Pool: "general", MaxBatch: 32}}, 60, 0,
			Room{Known: true, Free: 24, Batchers: 1, Share: 24}},
		{"a draining replica has no room", []subjects.Heartbeat{
			{Replica: "r1", Pool: "general", MaxBatch: 64, State: subjects.StateDraining},
			{Replica: "r2", Pool: "general", MaxBatch: 32}}, 0, 0,
			Room{Known: true, Free: 24, Batchers: 1, Share: 24}},
		{"the batch pool when it has replicas", []subjects.Heartbeat{
			{Replica: "r1", Pool: "general", MaxBatch: 64},
			{Replica: "r2", Pool: "batch", MaxBatch: 32}}, 0, 0,
			Room{Known: true, Free: 24, Batchers: 1, Share: 24}},
		{"three batchers share it", []subjects.Heartbeat{{Replica: "r1", Pool: "general", MaxBatch: 64}}, 0, 2,
			Room{Known: true, Free: 48, Batchers: 3, Share: 16}},
		{"the remainder goes to the lowest ids: ours is below both others'", []subjects.Heartbeat{{Replica: "r1", Pool: "general", MaxBatch: 64, Running: 44}}, 0, 2,
			Room{Known: true, Free: 4, Interactive: 44, Batchers: 3, Share: 2}},
		{"one slot free among three: the lowest id takes it", []subjects.Heartbeat{{Replica: "r1", Pool: "general", MaxBatch: 64, Running: 47}}, 0, 2,
			Room{Known: true, Free: 1, Interactive: 47, Batchers: 3, Share: 1}},
		{"each holds its share of the batch lines", []subjects.Heartbeat{{Replica: "r1", Pool: "general", MaxBatch: 64, Running: 40}}, 15, 1,
			Room{Known: true, Free: 8, Interactive: 10, Batchers: 2, Share: 4}},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := newLoadView("me", make(chan struct{}, 1), func(kind string) { t.Errorf("refused a %s", kind) })
			for _, hb := range c.replicas {
				v.onHeartbeat(heartbeatMsg(hb), now)
			}
			for i := range c.batchers {
				v.onPresence(&nats.Msg{Data: fmt.Appendf(nil, "other-%d", i)}, now)
			}
			if got := v.room(now, c.mine); got != c.want {
				t.Errorf("room %+v, want %+v", got, c.want)
			}
		})
	}
}

// TestOneSlotFreeGoesToOneBatcher: with one slot free among three
// batchers only the one of the lowest id takes it; the others take none.
func TestOneSlotFreeGoesToOneBatcher(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	ids := []string{"b1", "b2", "b3"}
	taken := 0
	for _, self := range ids {
		v := newLoadView(self, make(chan struct{}, 1), func(kind string) { t.Errorf("refused a %s", kind) })
		v.onHeartbeat(heartbeatMsg(subjects.Heartbeat{Replica: "r1", Pool: "general", MaxBatch: 64, Running: 47, Inflight: 47}), now)
		for _, other := range ids {
			v.onPresence(&nats.Msg{Data: []byte(other)}, now)
		}
		r := v.room(now, 0)
		if r.Batchers != 3 {
			t.Fatalf("%s counts %d batchers, want 3", self, r.Batchers)
		}
		if want := map[bool]int{true: 1, false: 0}[self == "b1"]; r.Share != want {
			t.Errorf("%s takes %d of the one slot free, want %d", self, r.Share, want)
		}
		taken += r.Share
	}
	if taken != 1 {
		t.Errorf("the three batchers take %d lines for one free slot", taken)
	}
}

// TestInteractiveWorkKeepsRoomForItsMean: when interactive work dips
// below what it held over the last seconds (its rate times its time in
// the engine), the room down to that mean is kept for it, so batch lines
// do not take the slots it is about to take back; the reserve ends once
// the dip is older than the reserve's seconds. A load delta on top of the
// heartbeat brings the count up to date; one of another heartbeat is
// dropped.
func TestInteractiveWorkKeepsRoomForItsMean(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	v := newLoadView("me", make(chan struct{}, 1), func(kind string) { t.Errorf("refused a %s", kind) })
	hb := subjects.Heartbeat{Replica: "r1", Pool: "general", MaxBatch: 64, Running: 30, Inflight: 30, Seq: 7}
	v.onHeartbeat(heartbeatMsg(hb), now)
	if r := v.room(now, 0); r.Share != 18 || r.Reserve != 0 {
		t.Fatalf("30 interactive of a ¾ batch of 48: %+v, want a share of 18", r)
	}
	delta := func(hbSeq, seq uint64, inflight int) {
		v.onLoad(&nats.Msg{Subject: "llm.load.r1", Data: fmt.Appendf(nil, `{"replica":"r1","hb_seq":%d,"seq":%d,"inflight":%d}`, hbSeq, seq, inflight)})
	}
	delta(7, 1, 10) // 20 interactive requests ended
	now = now.Add(time.Second)
	if r := v.room(now, 0); r.Interactive != 10 || r.Reserve != 10 || r.Free != 38 || r.Share != 28 {
		t.Errorf("interactive fell from 30 to 10: %+v, want 10 of the 38 free kept for it (its mean, 20, less 10)", r)
	}
	delta(6, 2, 0) // another heartbeat's: dropped
	delta(7, 1, 0) // older: dropped
	if r := v.room(now, 0); r.Interactive != 10 {
		t.Errorf("a stale delta was applied: %+v", r)
	}
	delta(7, 2, 40) // a burst above the mean keeps nothing more
	if r := v.room(now, 0); r.Interactive != 40 || r.Reserve != 0 || r.Share != 8 {
		t.Errorf("interactive rose to 40: %+v, want no reserve and the 8 slots left", r)
	}
	now = now.Add(reserveSlots * time.Second)
	hb.Running, hb.Inflight, hb.Seq = 10, 10, 8
	v.onHeartbeat(heartbeatMsg(hb), now)
	if r := v.room(now, 0); r.Reserve != 0 || r.Share != 38 {
		t.Errorf("the dip is %d s old: %+v, want no reserve", reserveSlots, r)
	}
	now = now.Add(viewStale + time.Second)
	if r := v.room(now, 0); r.Known {
		t.Errorf("a replica silent for %v still in the view: %+v", viewStale+time.Second, r)
	}
}

// TestTheViewRefusesWhatASenderCouldLieAbout: a heartbeat out of range,
// one for another replica than its subject and a delta for another
// replica are counted as refused and change nothing.
func TestTheViewRefusesWhatASenderCouldLieAbout(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	refused := map[string]int{}
	v := newLoadView("me", make(chan struct{}, 1), func(kind string) { refused[kind]++ })
	v.onHeartbeat(heartbeatMsg(subjects.Heartbeat{Replica: "r1", Pool: "general", MaxBatch: 64, Seq: 1}), now)
	bad := heartbeatMsg(subjects.Heartbeat{Replica: "r1", Pool: "general", MaxBatch: 1 << 40})
	v.onHeartbeat(bad, now)
	other := heartbeatMsg(subjects.Heartbeat{Replica: "r2", Pool: "general", MaxBatch: 64})
	other.Subject = "llm.heartbeat.r1"
	v.onHeartbeat(other, now)
	v.onLoad(&nats.Msg{Subject: "llm.load.r1", Data: []byte(`{"replica":"r2","hb_seq":1,"seq":1,"inflight":60}`)})
	v.onLoad(&nats.Msg{Subject: "llm.load.r1", Data: []byte(`{"replica":"r1","hb_seq":1,"seq":1,"inflight":-5}`)})
	v.onPresence(&nats.Msg{Data: []byte("not a token")}, now)
	if want := map[string]int{"heartbeat": 2, "load_delta": 2, "presence": 1}; fmt.Sprint(refused) != fmt.Sprint(want) {
		t.Errorf("refused %v, want %v", refused, want)
	}
	if r := v.room(now, 0); r.Free != 48 || r.Batchers != 1 {
		t.Errorf("after the lies: %+v, want the honest heartbeat's 48 free and one batcher", r)
	}
}
