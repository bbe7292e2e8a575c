package enginesim_test

import (
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/enginesim"
)

func TestTTFTGrowsWithQueue(t *testing.T) {
	e := enginesim.New(enginesim.Config{MaxBatch: 2, PrefillPerToken: -1})
	tr := newTrace()
	var ids []enginesim.ID
	for range 6 {
		ids = append(ids, submit(t, e, enginesim.Request{PromptTokens: 16, MaxTokens: 4}, t0))
	}
	tr.add(e.Advance(t0))
	if st := e.Stats(); st.Running != 2 || st.Waiting != 4 {
		t.Fatalf("running=%d waiting=%d, want 2 and 4", st.Running, st.Waiting)
	}
	runUntil(t, e, tr, time.Time{})
	for i := 2; i < len(ids); i += 2 {
		prev, cur := tr.first[ids[i-1]].Sub(t0), tr.first[ids[i]].Sub(t0)
		if cur <= prev {
			t.Errorf("TTFT of request %d = %v, not above request %d's %v", i, cur, i-1, prev)
		}
	}
	// First pair: one prefill step. Second pair: waits for the first pair's
	// prefill and three decode steps of a batch of two.
	if got, want := tr.first[ids[0]].Sub(t0), ms(30); got != want {
		t.Errorf("first TTFT = %v, want %v", got, want)
	}
	if got, want := tr.first[ids[2]].Sub(t0), ms(30+3*5.1+30); got != want {
		t.Errorf("queued TTFT = %v, want %v", got, want)
	}
}

func TestDecodeStepGrowsWithBatch(t *testing.T) {
	itl := func(n int) time.Duration {
		e := enginesim.New(enginesim.Config{ITLPerBatch: time.Millisecond})
		tr := newTrace()
		var id enginesim.ID
		for range n {
			id = submit(t, e, enginesim.Request{PromptTokens: 16, MaxTokens: 4}, t0)
		}
		runUntil(t, e, tr, time.Time{})
		return tr.tokens[id][2].Sub(tr.tokens[id][1])
	}
	if got := itl(1); got != ms(5) {
		t.Errorf("ITL alone = %v, want 5ms", got)
	}
	if got := itl(8); got != ms(12) {
		t.Errorf("ITL in a batch of 8 = %v, want 12ms", got)
	}
}

func TestKVUsageReflectsInFlight(t *testing.T) {
	e := enginesim.New(enginesim.Config{KVBlocks: 100})
	tr := newTrace()
	for range 3 {
		submit(t, e, enginesim.Request{PromptTokens: 160, MaxTokens: 40}, t0)
	}
	tr.add(e.Advance(t0))
	// Each holds its prompt and the token being produced: ceil(161/16) = 11.
	if st := e.Stats(); st.KVBlocksUsed != 33 || st.KVUsage != 0.33 {
		t.Errorf("KV used %d (%v), want 33 (0.33)", st.KVBlocksUsed, st.KVUsage)
	}
	runUntil(t, e, tr, t0.Add(ms(200))) // 78ms prefill, then 24 tokens at 5.2ms
	if st := e.Stats(); st.KVBlocksUsed != 36 {
		t.Errorf("KV used after 24 tokens = %d, want 36 (12 blocks each)", st.KVBlocksUsed)
	}
	runUntil(t, e, tr, time.Time{})
	if st := e.Stats(); st.KVUsage != 0 || st.Running != 0 || st.Finished != 3 {
		t.Errorf("after finishing: %+v", st)
	}
}

func TestKVFullMakesRequestsWait(t *testing.T) {
	e := enginesim.New(enginesim.Config{KVBlocks: 20})
	tr := newTrace()
	a := submit(t, e, enginesim.Request{PromptTokens: 160, MaxTokens: 10}, t0)
	b := submit(t, e, enginesim.Request{PromptTokens: 160, MaxTokens: 10}, t0)
	tr.add(e.Advance(t0))
	if st := e.Stats(); st.Running != 1 || st.Waiting != 1 || st.KVBlocksUsed != 11 {
		t.Errorf("running=%d waiting=%d used=%d, want 1, 1, 11", st.Running, st.Waiting, st.KVBlocksUsed)
	}
	runUntil(t, e, tr, time.Time{})
	if !tr.first[b].After(tr.finish[a]) {
		t.Errorf("b's first token at %v, want after a finished at %v", tr.first[b], tr.finish[a])
	}
}

func TestPreemptionWhenDecodeOutgrowsKV(t *testing.T) {
	e := enginesim.New(enginesim.Config{KVBlocks: 12})
	tr := newTrace()
	a := submit(t, e, enginesim.Request{PromptTokens: 16, MaxTokens: 160}, t0)
	b := submit(t, e, enginesim.Request{PromptTokens: 16, MaxTokens: 160}, t0)
	runUntil(t, e, tr, time.Time{})
	if e.Stats().Preemptions == 0 {
		t.Error("no preemption, want at least one")
	}
	for _, id := range []enginesim.ID{a, b} {
		if n := len(tr.tokens[id]); n != 160 {
			t.Errorf("request %d produced %d tokens, want 160", id, n)
		}
		if _, ok := tr.finish[id]; !ok {
			t.Errorf("request %d never finished", id)
		}
	}
	if !tr.finish[a].Before(tr.finish[b]) {
		t.Errorf("the older request should finish first: a=%v b=%v", tr.finish[a], tr.finish[b])
	}
}

func TestLoraLoadCost(t *testing.T) {
	cfg := enginesim.Config{MaxLoras: 1, PrefillPerToken: -1, LoraLoad: ms(50), LoraPerAdapterStep: ms(1)}
	e := enginesim.New(cfg)
	tr := newTrace()
	cold := submit(t, e, enginesim.Request{PromptTokens: 16, MaxTokens: 1, Lora: "a"}, t0)
	now := runUntil(t, e, tr, time.Time{})
	warm := submit(t, e, enginesim.Request{PromptTokens: 16, MaxTokens: 1, Lora: "a"}, now)
	now2 := runUntil(t, e, tr, time.Time{})
	if got, want := tr.first[cold].Sub(t0), ms(30+50+1); got != want {
		t.Errorf("cold adapter TTFT = %v, want %v", got, want)
	}
	if got, want := tr.first[warm].Sub(now), ms(30+1); got != want {
		t.Errorf("resident adapter TTFT = %v, want %v", got, want)
	}

	// With the only slot busy, an adapter request waits while a base
	// request behind it runs.
	busy := submit(t, e, enginesim.Request{PromptTokens: 16, MaxTokens: 10, Lora: "a"}, now2)
	other := submit(t, e, enginesim.Request{PromptTokens: 16, MaxTokens: 1, Lora: "b"}, now2)
	base := submit(t, e, enginesim.Request{PromptTokens: 16, MaxTokens: 1}, now2)
	tr.add(e.Advance(now2))
	st := e.Stats()
	if !slices.Equal(st.RunningLoras, []string{"a"}) || !slices.Equal(st.WaitingLoras, []string{"b"}) {
		t.Errorf("running loras %v waiting %v, want [a] [b]", st.RunningLoras, st.WaitingLoras)
	}
	if st.Running != 2 || st.Waiting != 1 {
		t.Errorf("running=%d waiting=%d, want 2 and 1 (the base request passes the blocked one)", st.Running, st.Waiting)
	}
	runUntil(t, e, tr, time.Time{})
	if !tr.first[other].After(tr.finish[busy]) {
		t.Errorf("adapter b started at %v before a's last request finished at %v", tr.first[other], tr.finish[busy])
	}
	if !tr.first[base].Before(tr.first[other]) {
		t.Error("base request should not wait behind the adapter request")
	}
	st = e.Stats()
	if !slices.Equal(st.ResidentLoras, []string{"b"}) || st.LoraLoads != 2 {
		t.Errorf("resident %v loads %d, want [b] and 2", st.ResidentLoras, st.LoraLoads)
	}
}

func TestDistinctAdaptersSlowTheStep(t *testing.T) {
	itl := func(loras ...string) (time.Duration, int) {
		e := enginesim.New(enginesim.Config{MaxLoras: 4, LoraPerAdapterStep: ms(1), LoraLoad: -1, ITLPerBatch: -1})
		tr := newTrace()
		var id enginesim.ID
		for _, l := range loras {
			id = submit(t, e, enginesim.Request{PromptTokens: 16, MaxTokens: 4, Lora: l}, t0)
		}
		tr.add(e.Advance(t0))
		distinct := e.Stats().BatchLoras
		runUntil(t, e, tr, time.Time{})
		return tr.tokens[id][2].Sub(tr.tokens[id][1]), distinct
	}
	same, n1 := itl("a", "a", "a", "a")
	mixed, n4 := itl("a", "b", "c", "d")
	if n1 != 1 || n4 != 4 {
		t.Errorf("distinct adapters in batch = %d and %d, want 1 and 4", n1, n4)
	}
	if same != ms(6) || mixed != ms(9) {
		t.Errorf("step with one adapter %v, with four %v; want 6ms and 9ms", same, mixed)
	}
}

func TestQueueFullRejects(t *testing.T) {
	e := enginesim.New(enginesim.Config{MaxBatch: 1, MaxQueue: 2})
	req := enginesim.Request{PromptTokens: 16, MaxTokens: 4}
	for range 3 { // one for the batch slot, two for the queue
		submit(t, e, req, t0)
	}
	if _, err := e.Submit(req, t0); !errors.Is(err, enginesim.ErrQueueFull) {
		t.Fatalf("4th submit: err = %v, want ErrQueueFull", err)
	}
	tr := newTrace()
	tr.add(e.Advance(t0))
	if st := e.Stats(); st.Running != 1 || st.Waiting != 2 {
		t.Fatalf("running=%d waiting=%d, want 1 and 2", st.Running, st.Waiting)
	}
	if _, err := e.Submit(req, t0); !errors.Is(err, enginesim.ErrQueueFull) {
		t.Fatalf("submit with a full queue: err = %v, want ErrQueueFull", err)
	}
	next, _ := e.NextEvent()
	now := runUntil(t, e, tr, next.Add(ms(20))) // the first request has finished
	if _, err := e.Submit(req, now); err != nil {
		t.Fatalf("submit after a slot freed: %v", err)
	}
}

func TestSubmitRejectsInvalid(t *testing.T) {
	e := enginesim.New(enginesim.Config{KVBlocks: 10})
	cases := []struct {
		req  enginesim.Request
		want error
	}{
		{enginesim.Request{PromptTokens: 0, MaxTokens: 1}, enginesim.ErrInvalid},
		{enginesim.Request{PromptTokens: 1, MaxTokens: 0}, enginesim.ErrInvalid},
		{enginesim.Request{PromptTokens: 150, MaxTokens: 11}, enginesim.ErrTooLarge},
		{enginesim.Request{PromptTokens: 1, MaxTokens: 1, Lora: "x"}, enginesim.ErrLoraDisabled},
	}
	for _, c := range cases {
		if _, err := e.Submit(c.req, t0); !errors.Is(err, c.want) {
			t.Errorf("Submit(%+v) = %v, want %v", c.req, err, c.want)
		}
	}
	if _, err := e.Submit(enginesim.Request{PromptTokens: 150, MaxTokens: 10}, t0); err != nil {
		t.Errorf("a request that exactly fits: %v", err)
	}
	if _, err := e.Submit(enginesim.Request{PromptTokens: 1, MaxTokens: 1}, t0.Add(-1)); !errors.Is(err, enginesim.ErrTimeBackwards) {
		t.Errorf("submit in the past: %v, want ErrTimeBackwards", err)
	}
}

func TestCancel(t *testing.T) {
	e := enginesim.New(enginesim.Config{MaxBatch: 1})
	tr := newTrace()
	run := submit(t, e, enginesim.Request{PromptTokens: 160, MaxTokens: 100}, t0)
	wait := submit(t, e, enginesim.Request{PromptTokens: 16, MaxTokens: 100}, t0)
	now := runUntil(t, e, tr, t0.Add(ms(100)))
	if !e.Cancel(wait, now) || !e.Cancel(run, now) {
		t.Fatal("cancel of a waiting and a running request reported not found")
	}
	if e.Cancel(run, now) {
		t.Error("second cancel reported found")
	}
	if st := e.Stats(); st.Running != 0 || st.Waiting != 0 || st.KVUsage != 0 {
		t.Errorf("after cancel: running=%d waiting=%d kv=%v", st.Running, st.Waiting, st.KVUsage)
	}
	n := len(tr.events)
	runUntil(t, e, tr, time.Time{})
	if len(tr.events) != n {
		t.Errorf("cancelled requests emitted %v", tr.events[n:])
	}
	if _, ok := e.NextEvent(); ok {
		t.Error("engine not idle after cancelling everything")
	}
}

// script drives an engine through a mix of everything it models.
func script(t *testing.T) ([]enginesim.Event, enginesim.Stats) {
	e := enginesim.New(enginesim.Config{KVBlocks: 64, MaxBatch: 4, MaxQueue: 8, MaxLoras: 2, PrefixCacheBlocks: 16})
	tr := newTrace()
	now := t0
	loras := []string{"", "a", "b", "c"}
	for i := range 40 {
		req := enginesim.Request{
			PromptTokens: 16 + (i*37)%200,
			MaxTokens:    1 + (i*13)%40,
			Prefix:       chain(uint64(i%3), 1+(i*7)%12),
			Lora:         loras[i%4],
		}
		if id, err := e.Submit(req, now); err == nil && i%7 == 0 {
			e.Cancel(id, now.Add(ms(3)))
		}
		now = runUntil(t, e, tr, now.Add(ms(float64(3+(i*11)%25))))
	}
	runUntil(t, e, tr, time.Time{})
	return tr.events, e.Stats()
}

func TestDeterministic(t *testing.T) {
	ev1, st1 := script(t)
	ev2, st2 := script(t)
	if len(ev1) < 100 {
		t.Fatalf("script produced only %d events", len(ev1))
	}
	if !reflect.DeepEqual(ev1, ev2) || !reflect.DeepEqual(st1, st2) {
		t.Error("two runs of the same script differ")
	}
	if st1.LoraLoads == 0 || st1.PrefixHitTokens == 0 {
		t.Errorf("script did not exercise LoRA and the prefix cache: %+v", st1)
	}
}
