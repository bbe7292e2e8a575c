package loadgen_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/enginesim"
	"github.com/switchyard-llm/switchyard/loadgen"
)

// seen is one request as the local engine received it.
type seen struct {
	at     time.Time
	header http.Header
	body   map[string]any
	raw    []byte
}

// engine is a local simulated engine (fixed timings, vLLM's API) behind a
// recorder of what it was sent.
type engine struct {
	*httptest.Server
	mu       sync.Mutex
	reqs     []seen
	inflight atomic.Int64
	peak     atomic.Int64
}

func newEngine(t *testing.T, ttft, itl time.Duration) *engine {
	t.Helper()
	srv := enginesim.NewServer(enginesim.ServerConfig{Fixed: true,
		Engine: enginesim.Config{Model: "llama-3-8b-instruct", TTFTBase: ttft, ITL: itl}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	e := &engine{}
	h := srv.Handler()
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := e.inflight.Add(1)
		defer e.inflight.Add(-1)
		for p := e.peak.Load(); n > p && !e.peak.CompareAndSwap(p, n); p = e.peak.Load() {
		}
		raw, _ := io.ReadAll(r.Body)
		s := seen{at: time.Now(), header: r.Header.Clone(), raw: raw}
		_ = json.Unmarshal(raw, &s.body)
		e.mu.Lock()
		e.reqs = append(e.reqs, s)
		e.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(raw))
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		e.Close()
		cancel()
		<-done
	})
	return e
}

func (e *engine) seen() []seen {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.reqs)
}

// messages returns the content of each message of a chat body by role.
func messages(t *testing.T, body map[string]any) (roles, contents []string) {
	t.Helper()
	msgs, _ := body["messages"].([]any)
	for _, m := range msgs {
		mm, _ := m.(map[string]any)
		r, _ := mm["role"].(string)
		c, _ := mm["content"].(string)
		roles, contents = append(roles, r), append(contents, c)
	}
	return roles, contents
}

func TestPromptBytesSizesTheUserMessage(t *testing.T) {
	e := newEngine(t, time.Millisecond, time.Millisecond)
	z, err := loadgen.ParseSizes("200-400")
	if err != nil {
		t.Fatal(err)
	}
	rep := run(t, loadgen.Config{Targets: []string{e.URL}, Rate: 200, Requests: 40, PromptBytes: z})
	if tr := rep.Targets[0]; tr.OK != 40 {
		t.Fatalf("ok %d, errors %v %v; want 40", tr.OK, tr.ErrorsBy, tr.ErrorSamples)
	}
	sizes := map[int]bool{}
	prompts := map[string]bool{}
	for _, s := range e.seen() {
		roles, contents := messages(t, s.body)
		if len(roles) != 1 || roles[0] != "user" {
			t.Fatalf("roles %v, want one user message", roles)
		}
		if n := len(contents[0]); n < 200 || n > 400 {
			t.Errorf("user message of %d bytes, want 200 to 400", n)
		}
		sizes[len(contents[0])] = true
		prompts[contents[0]] = true
	}
	if len(sizes) < 10 || len(prompts) != 40 {
		t.Errorf("%d distinct sizes and %d distinct prompts in 40 requests: not drawn per request", len(sizes), len(prompts))
	}
	if rep.Workload == "" {
		t.Error("the report does not say how the requests were shaped")
	}
	for _, bad := range []string{"0", "10-5", "x", "1-99999999"} {
		if _, err := loadgen.ParseSizes(bad); err == nil {
			t.Errorf("ParseSizes(%q) accepted", bad)
		}
	}
}

func TestSharedPrefixesHaveZipfPopularity(t *testing.T) {
	e := newEngine(t, time.Millisecond, time.Millisecond)
	p, err := loadgen.ParseSharedPrefix("4:300")
	if err != nil {
		t.Fatal(err)
	}
	rep := run(t, loadgen.Config{Targets: []string{e.URL}, Rate: 500, Requests: 200, SharedPrefix: p})
	if tr := rep.Targets[0]; tr.OK != 200 {
		t.Fatalf("ok %d, errors %v; want 200", tr.OK, tr.ErrorsBy)
	}
	count := map[string]int{}
	for _, s := range e.seen() {
		roles, contents := messages(t, s.body)
		if len(roles) != 2 || roles[0] != "system" || roles[1] != "user" {
			t.Fatalf("roles %v, want system then user", roles)
		}
		if len(contents[0]) != 300 {
			t.Errorf("system prompt of %d bytes, want 300", len(contents[0]))
		}
		count[contents[0]]++
	}
	shares := slices.Sorted(func(yield func(int) bool) {
		for _, n := range count {
			if !yield(n) {
				return
			}
		}
	})
	// Zipf(1.2) over 4: about 53%, 23%, 14%, 10%.
	if len(shares) != 4 || shares[3] < 80 || shares[0] > 40 {
		t.Errorf("requests per system prompt %v of 200, want 4 prompts, the most popular about half", shares)
	}
	for _, bad := range []string{"4", "0:10", "4:0", "a:b"} {
		if _, err := loadgen.ParseSharedPrefix(bad); err == nil {
			t.Errorf("ParseSharedPrefix(%q) accepted", bad)
		}
	}
}

func TestConversationsCarryTheirHistory(t *testing.T) {
	e := newEngine(t, time.Millisecond, time.Millisecond)
	rep := run(t, loadgen.Config{Targets: []string{e.URL}, Rate: 100, Requests: 9, Conversations: 3, MaxTokens: 4})
	if tr := rep.Targets[0]; tr.OK != 9 {
		t.Fatalf("ok %d, errors %v %v; want 9", tr.OK, tr.ErrorsBy, tr.ErrorSamples)
	}
	turns := map[string][]int{}
	for _, s := range e.seen() {
		id := s.header.Get("X-Conversation-Id")
		roles, _ := messages(t, s.body)
		turns[id] = append(turns[id], len(roles))
	}
	if len(turns) != 3 {
		t.Fatalf("conversation ids %v, want 3", turns)
	}
	for id, n := range turns {
		slices.Sort(n)
		if !slices.Equal(n, []int{1, 3, 5}) {
			t.Errorf("conversation %s: messages per request %v, want 1, 3, 5 (history grows a turn each time)", id, n)
		}
	}
}

func TestWorkloadFileIsReplayed(t *testing.T) {
	file := `{"timestamp": 0, "model": "llama-3-8b-instruct", "messages": [{"role": "user", "content": "one"}], "max_tokens": 2}

{"timestamp": 0.3, "model": "llama-3-8b-instruct", "messages": [{"role": "user", "content": "three"}], "max_tokens": 2, "stream": true}
{"timestamp": 0.15, "model": "llama-3-8b-instruct", "prompt": "two", "max_tokens": 2}
`
	w, err := loadgen.ReadWorkload(strings.NewReader(file))
	if err != nil || len(w) != 3 {
		t.Fatalf("ReadWorkload: %d entries, %v", len(w), err)
	}
	e := newEngine(t, time.Millisecond, time.Millisecond)
	rep := run(t, loadgen.Config{Targets: []string{e.URL + "/v1/completions"}, Workload: w, Replay: true})
	// The completions endpoint refuses chat bodies: what matters here is
	// what was sent and when.
	_ = rep
	got := e.seen()
	if len(got) != 3 {
		t.Fatalf("engine saw %d requests, want 3", len(got))
	}
	var order []string
	for _, s := range got {
		if _, ok := s.body["timestamp"]; ok {
			t.Errorf("the timestamp was sent: %s", s.raw)
		}
		if _, c := messages(t, s.body); len(c) > 0 {
			order = append(order, c[0])
		} else {
			order = append(order, s.body["prompt"].(string))
		}
	}
	if !slices.Equal(order, []string{"one", "two", "three"}) {
		t.Errorf("sent in order %v, want the timestamps' order one, two, three", order)
	}
	if d := got[1].at.Sub(got[0].at); d < 120*time.Millisecond {
		t.Errorf("second request %v after the first, want about 150ms", d)
	}
	if d := got[2].at.Sub(got[0].at); d < 270*time.Millisecond {
		t.Errorf("third request %v after the first, want about 300ms", d)
	}

	// At a rate instead, in file order, again from the start.
	e2 := newEngine(t, time.Millisecond, time.Millisecond)
	rep = run(t, loadgen.Config{Targets: []string{e2.URL}, Workload: w, Rate: 200, Requests: 4})
	if n := len(e2.seen()); n != 4 || rep.Targets[0].Scheduled != 4 {
		t.Errorf("engine saw %d requests, want 4", n)
	}

	for _, bad := range []string{
		`{"model": "m"}`,
		`not json`,
		`{"timestamp": -1, "messages": []}`,
		`{"timestamp": "soon", "messages": []}`,
		``,
	} {
		if _, err := loadgen.ReadWorkload(strings.NewReader(bad)); err == nil {
			t.Errorf("ReadWorkload(%q) accepted", bad)
		}
	}
	if w, err := loadgen.ReadWorkload(strings.NewReader(`{"model": "m", "input": "hi", "max_output_tokens": 8}`)); err != nil || len(w) != 1 {
		t.Errorf("a Responses body: %d entries, %v", len(w), err)
	}
	untimed, _ := loadgen.ReadWorkload(strings.NewReader(`{"messages": []}`))
	if err := (&loadgen.Config{Targets: []string{e.URL}, Workload: untimed, Replay: true}).Validate(); err == nil {
		t.Error("replay of a line without a timestamp accepted")
	}
}

func TestAPIKeyIsSent(t *testing.T) {
	e := newEngine(t, time.Millisecond, time.Millisecond)
	run(t, loadgen.Config{Targets: []string{e.URL}, Rate: 100, Requests: 2, APIKey: "sk-bench"})
	for _, s := range e.seen() {
		if got := s.header.Get("Authorization"); got != "Bearer sk-bench" {
			t.Errorf("Authorization %q, want Bearer sk-bench", got)
		}
	}
	if err := (&loadgen.Config{Targets: []string{e.URL}, Rate: 1, Requests: 1, APIKey: "a\nb"}).Validate(); err == nil {
		t.Error("an API key with a newline accepted")
	}
}

// A closed loop keeps exactly N requests in flight: the engine never sees
// more, and with 20ms answers, sees N most of the time.
func TestClosedLoopKeepsNInFlight(t *testing.T) {
	e := newEngine(t, 20*time.Millisecond, time.Millisecond)
	rep := run(t, loadgen.Config{Targets: []string{e.URL}, Concurrency: 3, Requests: 30, Stream: true, MaxTokens: 4})
	tr := rep.Targets[0]
	if tr.OK != 30 || len(e.seen()) != 30 {
		t.Fatalf("ok %d of %d sent, errors %v; want 30", tr.OK, len(e.seen()), tr.ErrorsBy)
	}
	if p := e.peak.Load(); p != 3 {
		t.Errorf("engine saw %d in flight at most, want 3", p)
	}
	if rep.Concurrency != 3 || !strings.HasPrefix(rep.Schedule, "closed loop") {
		t.Errorf("report: concurrency %d, schedule %q", rep.Concurrency, rep.Schedule)
	}
	// TTFT, ITL and throughput of the streams.
	if tr.TTFT == nil || tr.TTFT.P50.D() < 20*time.Millisecond {
		t.Errorf("ttft %+v, want at least the engine's 20ms", tr.TTFT)
	}
	if tr.ChunkRate <= 0 || tr.Gaps == nil || tr.Gaps.N == 0 {
		t.Errorf("chunks/s %v, gaps %+v: stream throughput and ITL not measured", tr.ChunkRate, tr.Gaps)
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil || !strings.Contains(text.String(), "ttft p99") {
		t.Errorf("text report (%v):\n%s", err, text.String())
	}

	// Bounded by time alone.
	e2 := newEngine(t, 10*time.Millisecond, time.Millisecond)
	rep = run(t, loadgen.Config{Targets: []string{e2.URL}, Concurrency: 2, Duration: 300 * time.Millisecond})
	if ok := rep.Targets[0].OK; ok < 10 || ok > 80 {
		t.Errorf("%d requests in 300ms at 2 in flight of ~10ms each, want about 60", ok)
	}
}

// A shared-prefix run through the whole stack (two replicas of one model):
// the report counts requests per replica and per decision reason from the
// gateway's X-Switchyard-* headers, and the prefixes are routed by affinity.
func TestReportSharesPerReplicaAndReason(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a stack")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var reps []devstack.Replica
	for _, r := range devstack.Replicas() {
		if r.ID == "l8-gen-0" || r.ID == "l8-gen-1" {
			reps = append(reps, r)
		}
	}
	st, err := devstack.Start(ctx, devstack.Config{
		Listen: "127.0.0.1:0", NATSListen: "127.0.0.1:-1", DataDir: t.TempDir(), Speed: 20,
		Replicas: reps, HeartbeatEvery: 100 * time.Millisecond, ScrapeEvery: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	p, _ := loadgen.ParseSharedPrefix("4:4000")
	rep := run(t, loadgen.Config{Targets: []string{st.GatewayURL()}, Rate: 40, Requests: 60, SharedPrefix: p, MaxTokens: 4})
	tr := rep.Targets[0]
	if tr.OK != 60 {
		t.Fatalf("ok %d, errors %v %v; want 60", tr.OK, tr.ErrorsBy, tr.ErrorSamples)
	}
	sum := func(m map[string]int) (n int) {
		for _, v := range m {
			n += v
		}
		return n
	}
	if sum(tr.Replicas) != 60 || sum(tr.Reasons) != 60 {
		t.Fatalf("replicas %v, reasons %v: want every request counted", tr.Replicas, tr.Reasons)
	}
	for id := range tr.Replicas {
		if id != "l8-gen-0" && id != "l8-gen-1" {
			t.Errorf("replica %q is not one of the stack's", id)
		}
	}
	if tr.Reasons["prefix-affinity"] == 0 {
		t.Errorf("reasons %v: no prefix-affinity decision for 4 shared 4000-byte prefixes", tr.Reasons)
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"by replica: l8-gen-", "by decision reason: ", "prefix-affinity"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report has no %q:\n%s", want, text.String())
		}
	}
}
