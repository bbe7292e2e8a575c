package loadgen_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/loadgen"
)

// server is an httptest server whose handler is h; it remembers when each
// request arrived.
type server struct {
	*httptest.Server
	mu       sync.Mutex
	arrivals []time.Time
}

func newServer(t *testing.T, h http.HandlerFunc) *server {
	t.Helper()
	s := &server{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.arrivals = append(s.arrivals, time.Now())
		s.mu.Unlock()
		_, _ = io.Copy(io.Discard, r.Body)
		h(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *server) arrived() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.arrivals...)
}

func okJSON(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"Paris"}}]}`)
}

func run(t *testing.T, cfg loadgen.Config) *loadgen.Report {
	t.Helper()
	client := loadgen.NewClient()
	t.Cleanup(client.CloseIdleConnections)
	if cfg.Client == nil {
		cfg.Client = client
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := loadgen.Run(ctx, cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return rep
}

// A server that answers one request at a time, 50ms each, gets ten
// requests scheduled 10ms apart. An open-loop generator sends all ten on
// schedule, so the last one waits for the nine before it and its latency,
// counted from its scheduled time, is about 10·50 − 9·10 = 410ms. A
// closed-loop generator would have waited for each answer and reported 50ms.
func TestOpenLoopChargesQueueingFromTheSchedule(t *testing.T) {
	var serial sync.Mutex
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		serial.Lock()
		defer serial.Unlock()
		time.Sleep(50 * time.Millisecond) // the server's service time
		okJSON(w, r)
	})
	rep := run(t, loadgen.Config{Targets: []string{srv.URL}, Rate: 100, Requests: 10})

	tr := rep.Targets[0]
	if tr.OK != 10 || tr.Errors != 0 {
		t.Fatalf("ok %d errors %d (%v), want 10 and 0", tr.OK, tr.Errors, tr.ErrorsBy)
	}
	arr := srv.arrived()
	if span := arr[len(arr)-1].Sub(arr[0]); span > 250*time.Millisecond {
		t.Errorf("requests arrived over %v; sent on schedule they span about 90ms", span)
	}
	if max := tr.Latency.Max.D(); max < 300*time.Millisecond {
		t.Errorf("max latency %v; the last request queued behind nine others for ~360ms", max)
	}
	if min := tr.Latency.Min.D(); min < 45*time.Millisecond {
		t.Errorf("min latency %v is below the server's 50ms service time", min)
	}
}

func TestBoundedByRequestsAndDuration(t *testing.T) {
	srv := newServer(t, okJSON)
	rep := run(t, loadgen.Config{Targets: []string{srv.URL}, Rate: 1000, Requests: 5, Duration: 10 * time.Second})
	if got := len(srv.arrived()); got != 5 || rep.Targets[0].OK != 5 {
		t.Fatalf("server saw %d requests, report %d ok; want 5", got, rep.Targets[0].OK)
	}
	srv2 := newServer(t, okJSON)
	rep = run(t, loadgen.Config{Targets: []string{srv2.URL}, Rate: 200, Duration: 100 * time.Millisecond, Requests: 1000})
	if got := len(srv2.arrived()); got != 20 || rep.Targets[0].Scheduled != 20 {
		t.Fatalf("server saw %d requests, scheduled %d; want 20 (200/s for 100ms)", got, rep.Targets[0].Scheduled)
	}
}

func TestWarmupIsSentButNotCounted(t *testing.T) {
	srv := newServer(t, okJSON)
	rep := run(t, loadgen.Config{Targets: []string{srv.URL}, Rate: 100, Requests: 5, Warmup: 50 * time.Millisecond})
	if got := len(srv.arrived()); got != 10 {
		t.Errorf("server saw %d requests, want 5 of warmup and 5 measured", got)
	}
	if tr := rep.Targets[0]; tr.OK != 5 || tr.Latency.N != 5 {
		t.Errorf("report counts ok %d, latency samples %d; want 5", tr.OK, tr.Latency.N)
	}
}

func TestTargetsAreInterleavedAndCompared(t *testing.T) {
	var mu sync.Mutex
	var order []string
	mark := func(name string, delay time.Duration) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
			time.Sleep(delay)
			okJSON(w, r)
		}
	}
	fast := newServer(t, mark("a", 0))
	slow := newServer(t, mark("b", 20*time.Millisecond))
	// At 10/s target b is due 50 ms after a, so the order holds unless a
	// send is late by more than that: a margin for a loaded machine.
	rep := run(t, loadgen.Config{Targets: []string{fast.URL, slow.URL}, Names: []string{"fast", "slow"}, Rate: 10, Requests: 6})

	mu.Lock()
	got := strings.Join(order, "")
	mu.Unlock()
	if got != "abababababab" {
		t.Errorf("arrival order %q, want the targets alternating", got)
	}
	if len(rep.Diffs) != 1 {
		t.Fatalf("%d diffs, want 1", len(rep.Diffs))
	}
	d := rep.Diffs[0]
	if d.Target != "slow" || d.Reference != "fast" {
		t.Errorf("diff of %s against %s, want slow against fast", d.Target, d.Reference)
	}
	if d.Latency.P50.D() < 15*time.Millisecond || d.RatioP50 <= 1 {
		t.Errorf("slow is %v (×%.2f) over fast at p50; want about +20ms", d.Latency.P50.D(), d.RatioP50)
	}
}

func TestErrorsAreCountedByKind(t *testing.T) {
	busy := newServer(t, func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"error":{"message":"busy"}}`, http.StatusServiceUnavailable)
	})
	hang := newServer(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	rep := run(t, loadgen.Config{Targets: []string{busy.URL, hang.URL}, Rate: 100, Requests: 3, Timeout: 100 * time.Millisecond})
	if got := rep.Targets[0].ErrorsBy["503"]; got != 3 || rep.Targets[0].OK != 0 {
		t.Errorf("busy: errors %v, ok %d; want 3 × 503", rep.Targets[0].ErrorsBy, rep.Targets[0].OK)
	}
	if got := rep.Targets[1].ErrorsBy["timeout"]; got != 3 {
		t.Errorf("hang: errors %v; want 3 timeouts", rep.Targets[1].ErrorsBy)
	}
	if got := rep.Targets[0].ErrorSamples["503"]; !strings.Contains(got, "busy") {
		t.Errorf("busy: error sample %q, want the response body", got)
	}
	if rep.Targets[0].Latency.N != 0 {
		t.Errorf("failed requests were counted in the latency")
	}
}

func TestRefusesTargetsOffThisMachine(t *testing.T) {
	cases := []struct {
		url  string
		want error // nil: accepted
	}{
		{"http://127.0.0.1:8080", nil},
		{"http://127.9.8.7:1/v1/chat/completions", nil},
		{"http://[::1]:8080", nil},
		{"http://[::ffff:127.0.0.1]:8080", nil},
		{"http://localhost:8080", nil},
		{"http://10.0.0.1:8080", loadgen.ErrNotLoopback},
		{"http://192.168.1.10", loadgen.ErrNotLoopback},
		{"https://[2001:db8::1]:443", loadgen.ErrNotLoopback},
		{"http://0.0.0.0:8080", loadgen.ErrNotLoopback},
	}
	for _, c := range cases {
		err := loadgen.CheckLoopback(context.Background(), c.url)
		if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("CheckLoopback(%s) = %v, want %v", c.url, err, c.want)
		}
	}
	for _, bad := range []string{"ftp://127.0.0.1/", "http://", "127.0.0.1:8080"} {
		if err := loadgen.CheckLoopback(context.Background(), bad); err == nil {
			t.Errorf("CheckLoopback(%q) accepted a URL that is not http(s) with a host", bad)
		}
	}
	if _, err := loadgen.Run(context.Background(), loadgen.Config{Targets: []string{"http://10.0.0.1:8080"}, Rate: 1, Requests: 1}); !errors.Is(err, loadgen.ErrNotLoopback) {
		t.Errorf("Run against 10.0.0.1 = %v, want ErrNotLoopback", err)
	}
	// The client refuses at dial time too: no packet leaves for 192.0.2.1.
	_, err := loadgen.NewClient().Get("http://192.0.2.1:9/")
	if !errors.Is(err, loadgen.ErrNotLoopback) {
		t.Errorf("client dialled 192.0.2.1: %v, want ErrNotLoopback", err)
	}
}

// sse writes data lines gap apart after a first delay, then [DONE] unless
// cut is set.
func sse(first, gap time.Duration, chunks int, tail string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		time.Sleep(first)
		for i := range chunks {
			if i > 0 {
				time.Sleep(gap)
			}
			fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"w%d\"}}]}\n\n", i)
			fl.Flush()
		}
		_, _ = io.WriteString(w, tail)
	}
}

func TestStreamGapsAreMeasuredBetweenDataLines(t *testing.T) {
	srv := newServer(t, sse(30*time.Millisecond, 20*time.Millisecond, 4, "data: [DONE]\n\n"))
	rep := run(t, loadgen.Config{Targets: []string{srv.URL}, Rate: 50, Requests: 3, Stream: true})
	tr := rep.Targets[0]
	if tr.OK != 3 {
		t.Fatalf("ok %d, errors %v; want 3 ok", tr.OK, tr.ErrorsBy)
	}
	// Four chunks and [DONE]: three 20ms gaps and one ~0 gap per stream.
	if tr.Gaps == nil || tr.Gaps.N != 12 {
		t.Fatalf("gaps %+v, want 12 of them", tr.Gaps)
	}
	if p50 := tr.Gaps.P50.D(); p50 < 15*time.Millisecond || p50 > 200*time.Millisecond {
		t.Errorf("gap p50 %v, want about 20ms", p50)
	}
	if min := tr.Gaps.Min.D(); min > 10*time.Millisecond {
		t.Errorf("gap min %v; [DONE] follows the last chunk at once", min)
	}
	if fd := tr.FirstData.P50.D(); fd < 30*time.Millisecond {
		t.Errorf("first data p50 %v, before the server's 30ms", fd)
	}
	if lat := tr.Latency.P50.D(); lat < 90*time.Millisecond {
		t.Errorf("latency p50 %v, want at least 30+3·20ms", lat)
	}
}

func TestBrokenStreamsAreErrors(t *testing.T) {
	cut := newServer(t, sse(0, time.Millisecond, 2, ""))
	failed := newServer(t, sse(0, time.Millisecond, 1, "data: {\"error\":{\"message\":\"engine died\"}}\n\n"))
	rep := run(t, loadgen.Config{Targets: []string{cut.URL, failed.URL}, Rate: 100, Requests: 2, Stream: true})
	if got := rep.Targets[0].ErrorsBy["incomplete stream"]; got != 2 {
		t.Errorf("stream without [DONE]: errors %v, want 2 incomplete", rep.Targets[0].ErrorsBy)
	}
	if got := rep.Targets[1].ErrorsBy["stream error event"]; got != 2 {
		t.Errorf("stream with an error event: errors %v, want 2", rep.Targets[1].ErrorsBy)
	}
}

// TestStreamsEndInEachAPIsForm: a Messages stream ends with message_stop
// and a Responses stream with response.completed, neither with [DONE];
// their error events are failures.
func TestStreamsEndInEachAPIsForm(t *testing.T) {
	raw := func(body string) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, body)
		}
	}
	const (
		messages = "event: message_start\ndata: {\"type\":\"message_start\"}\n\n" +
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\"}\n\n" +
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
		responses = "event: response.created\ndata: {\"type\":\"response.created\"}\n\n" +
			"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\"}\n\n" +
			"event: response.completed\ndata: {\"type\":\"response.completed\"}\n\n"
		messagesFailed  = "event: message_start\ndata: {}\n\nevent: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\"}}\n\n"
		responsesFailed = "event: response.created\ndata: {}\n\nevent: error\ndata: {\"type\":\"error\",\"code\":\"upstream_error\"}\n\n"
		messagesCut     = "event: message_start\ndata: {}\n\n"
	)
	var targets []string
	for _, b := range []string{messages, responses, messagesFailed, responsesFailed, messagesCut} {
		targets = append(targets, newServer(t, raw(b)).URL)
	}
	rep := run(t, loadgen.Config{Targets: targets, Rate: 100, Requests: 2, Stream: true})
	for i, want := range []string{"", "", "stream error event", "stream error event", "incomplete stream"} {
		tr := rep.Targets[i]
		if want == "" && (tr.OK != 2 || tr.Gaps == nil || tr.Gaps.N != 4) {
			t.Errorf("target %d: ok %d, errors %v, gaps %+v; want 2 whole streams of 3 events", i, tr.OK, tr.ErrorsBy, tr.Gaps)
		}
		if want != "" && tr.ErrorsBy[want] != 2 {
			t.Errorf("target %d: errors %v, want 2 %q", i, tr.ErrorsBy, want)
		}
	}
}

func TestReportJSONRoundTrips(t *testing.T) {
	a, b := newServer(t, okJSON), newServer(t, sse(0, time.Millisecond, 2, "data: [DONE]\n\n"))
	rep := run(t, loadgen.Config{Targets: []string{a.URL, b.URL}, Names: []string{"direct", "proxy"}, Rate: 100, Requests: 4, Stream: true})
	var buf bytes.Buffer
	if err := rep.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	first := buf.String()
	for _, key := range []string{`"targets"`, `"diffs"`, `"p99_ms"`, `"errors_by"`, `"gaps"`, `"name": "proxy"`, `"rate_per_target": 100`} {
		if !strings.Contains(first, key) {
			t.Errorf("JSON has no %s:\n%s", key, first)
		}
	}
	back, err := loadgen.ReadJSON(strings.NewReader(first))
	if err != nil {
		t.Fatal(err)
	}
	buf.Reset()
	if err := back.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	if buf.String() != first {
		t.Errorf("JSON does not round-trip:\n%s\nthen\n%s", first, buf.String())
	}
	if back.Targets[1].Gaps == nil || back.Targets[1].Gaps.N != rep.Targets[1].Gaps.N {
		t.Errorf("gaps lost in the round trip")
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil || !strings.Contains(text.String(), "difference from direct") {
		t.Errorf("text report (%v):\n%s", err, text.String())
	}
}

func TestProgressLinesWhileRunning(t *testing.T) {
	srv := newServer(t, okJSON)
	var buf bytes.Buffer
	run(t, loadgen.Config{Targets: []string{srv.URL}, Names: []string{"direct"}, Rate: 20, Duration: 1500 * time.Millisecond, Progress: &buf})
	if !strings.Contains(buf.String(), "direct ok") || strings.Count(buf.String(), "\n") < 1 {
		t.Errorf("progress output:\n%s", buf.String())
	}
}

func TestInterruptedRunReturnsPartialReport(t *testing.T) {
	srv := newServer(t, okJSON)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		// Let a few slots go out first: the first has long been answered
		// when the tenth arrives (90 ms later at 100/s).
		_, _ = testkit.Poll(time.Minute, 5*time.Millisecond, testkit.Cond("ten arrivals", func() bool { return len(srv.arrived()) >= 10 || ctx.Err() != nil }))
		cancel()
	}()
	client := loadgen.NewClient()
	defer client.CloseIdleConnections()
	rep, err := loadgen.Run(ctx, loadgen.Config{Targets: []string{srv.URL}, Rate: 100, Duration: time.Minute, Client: client})
	if !errors.Is(err, context.Canceled) || rep == nil || !rep.Interrupted {
		t.Fatalf("Run = %v, %v; want a partial report and context.Canceled", rep, err)
	}
	if ok := rep.Targets[0].OK; ok == 0 || ok > 100 {
		t.Errorf("ok %d, want the few sent before the cancel", ok)
	}
}

// Refusals (answers with an HTTP error status) are counted by their
// OpenAI error code and timed apart from the successes; those that do not
// say when to come back are counted.
func TestRefusalsAreCountedByCodeAndTimed(t *testing.T) {
	var n atomic.Int64
	srv := newServer(t, func(w http.ResponseWriter, _ *http.Request) {
		v := n.Add(1)
		if v%2 == 0 {
			okJSON(w, nil)
			return
		}
		if v%4 == 1 { // three of the five refusals say when to come back, two do not
			w.Header().Set("Retry-After", "1")
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":{"message":"busy","type":"server_error","param":null,"code":"gateway_overloaded"}}`))
	})
	rep := run(t, loadgen.Config{Targets: []string{srv.URL}, Rate: 1000, Requests: 10})
	tr := rep.Targets[0]
	if tr.OK != 5 || tr.Errors != 5 || tr.CodesBy["gateway_overloaded"] != 5 {
		t.Errorf("ok %d, errors %d, codes %v; want 5, 5, 5 gateway_overloaded", tr.OK, tr.Errors, tr.CodesBy)
	}
	if tr.Refused == nil || tr.Refused.N != 5 || tr.Latency.N != 5 {
		t.Errorf("refusals timed %v, successes %d; want 5 and 5", tr.Refused, tr.Latency.N)
	}
	if tr.RefusedService == nil || tr.RefusedService.N != 5 || tr.RefusedService.Max > tr.Refused.Max {
		t.Errorf("refusals timed from the actual send %v; want 5, none longer than from the schedule (%v)", tr.RefusedService, tr.Refused)
	}
	if tr.NoRetryAfter != 2 {
		t.Errorf("refusals without Retry-After %d, want 2", tr.NoRetryAfter)
	}
}
