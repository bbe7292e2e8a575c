package enginesim_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/enginesim"
)

// TestPriorityServesTheBestWaitingFirst: under priority scheduling the queue
// is served by (priority, arrival), so a later request of a better priority
// is admitted before every worse one that waits; a full batch preempts
// nothing, so the one running finishes first. FCFS serves the same arrivals
// in their order.
func TestPriorityServesTheBestWaitingFirst(t *testing.T) {
	order := func(policy enginesim.Scheduling, prio [4]int64) []enginesim.ID {
		t.Helper()
		e := enginesim.New(enginesim.Config{MaxBatch: 1, Scheduling: policy})
		tr := newTrace()
		running := submit(t, e, enginesim.Request{PromptTokens: 16, MaxTokens: 4, Priority: prio[0]}, t0)
		tr.add(e.Advance(t0))
		later := t0.Add(time.Millisecond)
		var ids []enginesim.ID
		for _, p := range prio[1:] {
			ids = append(ids, submit(t, e, enginesim.Request{PromptTokens: 16, MaxTokens: 4, Priority: p}, later))
		}
		runUntil(t, e, tr, time.Time{})
		if got := tr.first[ids[0]]; !got.After(tr.finish[running]) {
			t.Errorf("%s: a queued request's first token at %v, before the running one finished at %v: a full batch preempted",
				policy, got, tr.finish[running])
		}
		slices.SortFunc(ids, func(a, b enginesim.ID) int { return tr.first[a].Compare(tr.first[b]) })
		return ids
	}
	// Arrivals 2, 3, 4 while 1 runs: batch, batch, interactive.
	if got, want := order(enginesim.SchedulingPriority, [4]int64{1, 1, 1, 0}), []enginesim.ID{4, 2, 3}; !slices.Equal(got, want) {
		t.Errorf("priority: admitted %v, want %v (the interactive one first, then the batch in arrival order)", got, want)
	}
	if got, want := order(enginesim.SchedulingFCFS, [4]int64{}), []enginesim.ID{2, 3, 4}; !slices.Equal(got, want) {
		t.Errorf("fcfs: admitted %v, want %v", got, want)
	}
}

// TestPriorityPreemptsTheWorstWhenKVRunsShort: when decoding outgrows the
// KV cache, FCFS preempts the request admitted last; priority scheduling
// preempts the one of the worst priority, though it arrived first, and it
// recomputes what it had generated when it is admitted again.
func TestPriorityPreemptsTheWorstWhenKVRunsShort(t *testing.T) {
	run := func(policy enginesim.Scheduling, first, second int64) (a, b enginesim.ID, tr *trace, e *enginesim.Engine) {
		e = enginesim.New(enginesim.Config{KVBlocks: 12, Scheduling: policy})
		tr = newTrace()
		a = submit(t, e, enginesim.Request{PromptTokens: 16, MaxTokens: 160, Priority: first}, t0)
		b = submit(t, e, enginesim.Request{PromptTokens: 16, MaxTokens: 160, Priority: second}, t0)
		runUntil(t, e, tr, time.Time{})
		for _, id := range []enginesim.ID{a, b} {
			if n := len(tr.tokens[id]); n != 160 {
				t.Errorf("%s: request %d produced %d tokens, want 160", policy, id, n)
			}
		}
		if e.Stats().Preemptions == 0 {
			t.Errorf("%s: no preemption, want at least one", policy)
		}
		return a, b, tr, e
	}
	a, b, tr, _ := run(enginesim.SchedulingFCFS, 0, 0)
	if !tr.finish[a].Before(tr.finish[b]) {
		t.Errorf("fcfs: the older request should finish first: a=%v b=%v", tr.finish[a], tr.finish[b])
	}
	a, b, tr, _ = run(enginesim.SchedulingPriority, 1, 0)
	if !tr.finish[b].Before(tr.finish[a]) {
		t.Errorf("priority: the better request should finish first though it arrived second: a=%v b=%v", tr.finish[a], tr.finish[b])
	}
	// The preempted one stopped and started over: a gap in its tokens
	// longer than the other's whole remaining run, then a recomputing step.
	gap := time.Duration(0)
	for i := 1; i < len(tr.tokens[a]); i++ {
		gap = max(gap, tr.tokens[a][i].Sub(tr.tokens[a][i-1]))
	}
	if gap < 100*time.Millisecond {
		t.Errorf("priority: the worse request's longest gap between tokens is %v: it was not preempted", gap)
	}
}

// TestPriorityNeedsPriorityScheduling: as vLLM, an FCFS engine refuses a
// priority other than 0.
func TestPriorityNeedsPriorityScheduling(t *testing.T) {
	e := enginesim.New(enginesim.Config{})
	if _, err := e.Submit(enginesim.Request{PromptTokens: 16, MaxTokens: 4, Priority: 1}, t0); !errors.Is(err, enginesim.ErrPriorityDisabled) {
		t.Errorf("priority 1 on an FCFS engine: %v, want ErrPriorityDisabled", err)
	}
	submit(t, e, enginesim.Request{PromptTokens: 16, MaxTokens: 4, Priority: 0}, t0)
	if err := (enginesim.Config{Scheduling: "lottery"}).Validate(); err == nil || !strings.Contains(err.Error(), "scheduling-policy") {
		t.Errorf("an unknown policy: %v, want an error naming --scheduling-policy", err)
	}
}

// TestPriorityFieldOverHTTP: the priority field of a request body, refused
// with vLLM's message by an FCFS engine and served by a priority one.
func TestPriorityFieldOverHTTP(t *testing.T) {
	body := `{"model":"sim-model","max_tokens":2,"priority":%s,"messages":[{"role":"user","content":"x"}]}`
	_, fcfs := start(t, enginesim.ServerConfig{Engine: enginesim.Config{Model: "sim-model"}, Speed: 100})
	resp := post(t, fcfs, "/v1/chat/completions", strings.Replace(body, "%s", "3", 1))
	if resp.StatusCode != 400 {
		t.Fatalf("priority 3 on an FCFS engine: %d, want 400", resp.StatusCode)
	}
	if e := readJSON(t, resp.Body)["error"].(map[string]any); e["message"] != "Got priority 3 but Priority scheduling is not enabled." {
		t.Errorf("error %v, want vLLM's message", e)
	}
	if resp := post(t, fcfs, "/v1/completions", `{"model":"sim-model","max_tokens":2,"priority":0,"prompt":"x"}`); resp.StatusCode != 200 {
		t.Errorf("priority 0 on an FCFS engine: %d, want 200", resp.StatusCode)
	}
	_, prio := start(t, enginesim.ServerConfig{Engine: enginesim.Config{Model: "sim-model", Scheduling: enginesim.SchedulingPriority}, Speed: 100})
	for _, path := range []string{"/v1/chat/completions", "/v1/completions", "/v1/responses"} {
		b := strings.Replace(body, "%s", "3", 1)
		switch path {
		case "/v1/completions":
			b = `{"model":"sim-model","max_tokens":2,"priority":3,"prompt":"x"}`
		case "/v1/responses":
			b = `{"model":"sim-model","max_output_tokens":2,"priority":3,"input":"x"}`
		}
		if resp := post(t, prio, path, b); resp.StatusCode != 200 {
			t.Errorf("%s with priority 3 on a priority engine: %d, want 200", path, resp.StatusCode)
		}
	}
}
