package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-llm/switchyard/deploy/examples"
	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/internal/sse"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/natsconn/natstest"
	"github.com/switchyard-llm/switchyard/subjects"
	replyproto "github.com/switchyard-llm/switchyard/subjects/reply"
	"github.com/switchyard-llm/switchyard/table/kv"
)

// upstream plays broker and adapter for one gateway: every request on
// llm.gw.* is handed, in its own goroutine, to the test's script with
// its attempt number, and the script answers on the reply subject.
type upstream struct {
	t        *testing.T
	srv      *server.Server
	url      string
	gw       string // the gateway's base URL
	nc       *nats.Conn
	reg      *prometheus.Registry
	attempts atomic.Int64
	mu       sync.Mutex
	excludes []string // Llm-Exclude of each attempt, in order
	avoids   []string // Llm-Avoid of each attempt, in order
	script   func(r *reply, attempt int)
}

// reply answers one attempt.
type reply struct {
	t   *testing.T
	nc  *nats.Conn
	m   *nats.Msg
	seq int
}

// send publishes the next message of the reply protocol.
func (r *reply) send(h nats.Header, data string) {
	if h == nil {
		h = nats.Header{}
	}
	h.Set(subjects.HdrSeq, strconv.Itoa(r.seq))
	r.seq++
	_ = r.nc.PublishMsg(&nats.Msg{Subject: r.m.Reply, Header: h, Data: []byte(data)})
}

func (r *reply) routed(replica string) {
	_ = r.nc.PublishMsg(&nats.Msg{Subject: subjects.New("").RoutedFor(r.m.Reply), Header: nats.Header{subjects.HdrRouted: {replica}}})
}

func (r *reply) accept(replica string) {
	r.routed(replica)
	r.send(nats.Header{subjects.HdrAccepted: {replica}}, `{"replica":"`+replica+`"}`)
}

// reject turns the request away as replica's adapter does, with status
// and code.
func (r *reply) reject(replica string, status int, code string) {
	e := subjects.NewError(status, code, "replica "+replica+" turns it away")
	e.RetryAfter = time.Second
	f := replyproto.Rejection(e)
	f.Header[subjects.HdrRouteReplica] = []string{replica}
	_ = r.nc.PublishMsg(f.Msg(r.m.Reply))
}

func (r *reply) head(status int, ct string) {
	r.send(nats.Header{subjects.HdrStatus: {strconv.Itoa(status)}, subjects.HdrContent: {ct}}, "")
}

func (r *reply) keepalive() {
	_ = r.nc.PublishMsg(&nats.Msg{Subject: r.m.Reply, Header: nats.Header{
		subjects.HdrSeq: {strconv.Itoa(max(r.seq-1, 0))}, subjects.HdrKeepalive: {"1"}}})
}

func (r *reply) end(errText string) {
	h := nats.Header{subjects.HdrEOS: {"1"}}
	if errText != "" {
		h.Set(subjects.HdrError, errText)
	}
	r.send(h, "")
}

// stream answers a whole SSE stream of n chunks from replica.
func (r *reply) stream(replica string, n int) {
	r.accept(replica)
	r.head(200, "text/event-stream")
	for i := range n {
		r.send(nil, "data: {\"i\":"+strconv.Itoa(i)+"}\n\n")
	}
	r.send(nil, "data: [DONE]\n\n")
	r.end("")
}

func newUpstream(t *testing.T, cfg gateway.Config, script func(r *reply, attempt int)) *upstream {
	t.Helper()
	return newUpstreamVia(t, cfg, script, func(url string) string { return url })
}

// newUpstreamVia is newUpstream with the gateway connecting to the URL via
// makes of the server's (a relay's, say).
func newUpstreamVia(t *testing.T, cfg gateway.Config, script func(r *reply, attempt int), via func(url string) string) *upstream {
	t.Helper()
	srv, url := natstest.Start(t)
	u := &upstream{t: t, srv: srv, url: url, script: script, reg: prometheus.NewRegistry()}
	nc := connect(t, url)
	u.nc = nc
	seedDevTable(t, nc)
	if script != nil {
		var wg sync.WaitGroup
		t.Cleanup(wg.Wait)
		if _, err := nc.Subscribe("llm.gw.*", func(m *nats.Msg) {
			n := int(u.attempts.Add(1))
			u.mu.Lock()
			u.excludes = append(u.excludes, m.Header.Get(subjects.HdrExclude))
			u.avoids = append(u.avoids, m.Header.Get(subjects.HdrAvoid))
			u.mu.Unlock()
			wg.Go(func() { u.script(&reply{t: t, nc: nc, m: m}, n) })
		}); err != nil {
			t.Fatal(err)
		}
		_ = nc.Flush()
	}
	gnc := connect(t, via(url))
	cfg.Registerer, cfg.Gatherer = u.reg, u.reg
	if cfg.RoutedTimeout == 0 {
		// A script answers when it likes, on a machine as busy as it
		// is: copies sent again would be attempts it did not expect.
		// The tests of copies ask for them.
		cfg.RoutedTimeout = -1
	}
	if cfg.Decide == "" {
		cfg.Decide = gateway.DecideBroker // the scripted broker answers
	}
	g, err := gateway.New(gnc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln := testkit.Listen(t)
	rctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = g.Serve(rctx, ln) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	u.gw = "http://" + ln.Addr().String()
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, testkit.Cond("the gateway to load the table", func() bool { return g.Table() != nil }))
	return u
}

// seedDevTable writes the dev routing table into the bucket a gateway
// watches, creating it.
func seedDevTable(t *testing.T, nc *nats.Conn) {
	t.Helper()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	bucket, err := kv.EnsureBucket(ctx, js, "llm-routing", 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Seed(ctx, bucket, examples.Flat()); err != nil {
		t.Fatal(err)
	}
}

func connect(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func (u *upstream) excluded() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.excludes...)
}

func (u *upstream) avoided() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.avoids...)
}

// counter reads a gateway counter (summed over its labels matching want).
func (u *upstream) counter(name string, want map[string]string) float64 {
	return testkit.Sum(u.reg, name, want)
}

// result is what a client saw.
type result struct {
	status int
	code   string // the OpenAI error code of a non-200 answer
	body   string
	took   time.Duration
}

// post sends a chat request whose answer cannot be continued on another
// replica (logprobs), so a failure mid-answer shows as judge's explicit error;
// resume_test.go has the answers that continue.
func (u *upstream) post(stream bool) result {
	u.t.Helper()
	return u.postBody(`{"model":"chat-small","logprobs":true,"messages":[{"role":"user","content":"hi"}],"stream":` + strconv.FormatBool(stream) + `}`)
}

func (u *upstream) postBody(body string) result {
	u.t.Helper()
	start := time.Now()
	resp, err := http.Post(u.gw+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		u.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := result{status: resp.StatusCode, body: string(b), took: time.Since(start)}
	if resp.StatusCode != 200 {
		var e openAIError
		if err := json.Unmarshal(b, &e); err != nil {
			u.t.Fatalf("status %d without the OpenAI error shape: %s", resp.StatusCode, b)
		}
		r.code = e.Error.Code
	}
	return r
}

// sseError returns the code of the stream's error event (data:
// {"error":…} with no event line before it, and nothing after it), or "".
func sseError(body string) string {
	r := sse.NewReader(strings.NewReader(body), 1<<20)
	named := false // the line before was an event line
	for {
		l, err := r.Next()
		if err != nil {
			return ""
		}
		if l.Field == "event" {
			named = true
			continue
		}
		if l.Field != "data" || !bytes.HasPrefix(l.Value, []byte(`{"error"`)) || named {
			named = false
			continue
		}
		var e openAIError
		if json.Unmarshal(l.Value, &e) != nil {
			return "unparsed"
		}
		if _, err := r.Next(); !errors.Is(err, io.EOF) {
			return "trailing_after_error"
		}
		return e.Error.Code
	}
}

func TestSequenceGapEndsTheResponseExplicitly(t *testing.T) {
	u := newUpstream(t, gateway.Config{}, func(r *reply, _ int) {
		r.accept("r-0")
		r.head(200, "text/event-stream")
		r.send(nil, "data: {\"i\":0}\n\n")
		r.seq++ // message 3 is lost
		r.send(nil, "data: {\"i\":2}\n\n")
		r.send(nil, "data: [DONE]\n\n")
		r.end("")
	})
	s := u.post(true)
	if s.status != 200 || !strings.Contains(s.body, `{"i":0}`) || sseError(s.body) != subjects.CodeUpstreamError || strings.Contains(s.body, "[DONE]") {
		t.Errorf("stream with a gap: %d %q; want the first chunk, then an SSE error event, no [DONE]", s.status, s.body)
	}
	if n := u.attempts.Load(); n != 1 {
		t.Errorf("%d attempts: after the first byte nothing is retried", n)
	}
	ns := u.post(false)
	if ns.status != 502 || ns.code != subjects.CodeUpstreamError {
		t.Errorf("non-streamed answer with a gap: %d %s, want 502 upstream_error", ns.status, ns.code)
	}
	if n := u.counter("switchyard_gateway_stream_errors_total", map[string]string{"cause": "sequence_gap"}); n != 2 {
		t.Errorf("sequence_gap errors counted %v, want 2", n)
	}
}

// One head a reply: a second one in the middle of the stream (an accept
// riding on a head again) is a gap, never relayed as data.
func TestASecondHeadIsASequenceGap(t *testing.T) {
	u := newUpstream(t, gateway.Config{}, func(r *reply, _ int) {
		r.accept("r-0")
		r.head(200, "text/event-stream")
		r.send(nil, "data: {\"i\":0}\n\n")
		r.send(nats.Header{subjects.HdrAccepted: {"r-0"}, subjects.HdrStatus: {"200"}, subjects.HdrContent: {"text/event-stream"}}, "data: {\"i\":9}\n\n")
		r.send(nil, "data: [DONE]\n\n")
		r.end("")
	})
	s := u.post(true)
	if s.status != 200 || !strings.Contains(s.body, `{"i":0}`) || strings.Contains(s.body, `{"i":9}`) ||
		sseError(s.body) != subjects.CodeUpstreamError || strings.Contains(s.body, "[DONE]") {
		t.Errorf("stream with a second head: %d %q; want the first chunk, then an SSE error event, nothing of the second head", s.status, s.body)
	}
}

// An accept whose replica is no subject token names no replica: it is not
// taken, and the attempt goes on to the accept that follows.
func TestAnAcceptNamingNoReplicaIsIgnored(t *testing.T) {
	u := newUpstream(t, gateway.Config{}, func(r *reply, _ int) {
		r.routed("r-0")
		r.send(nats.Header{subjects.HdrAccepted: {"r-0.>"}}, `{"replica":"r-0.>"}`)
		r.seq = 0
		r.accept("r-0")
		r.head(200, "application/json")
		r.send(nil, `{"choices":[{}]}`)
		r.end("")
	})
	ns := u.post(false)
	if ns.status != 200 || !strings.Contains(ns.body, `"choices"`) {
		t.Errorf("answer after a malformed accept: %d %q %s, want the 200 that followed", ns.status, ns.code, ns.body)
	}
	if n := u.attempts.Load(); n != 1 {
		t.Errorf("%d attempts, want 1", n)
	}
}

// A reply whose accept was lost with a NATS connection is no answer: the
// messages after it fail the request explicitly, never a bare 502.
func TestLostAcceptIsASequenceGap(t *testing.T) {
	u := newUpstream(t, gateway.Config{}, func(r *reply, _ int) {
		r.routed("r-0")
		r.seq++ // the accept is lost
		r.head(200, "application/json")
		r.send(nil, `{"choices":[{}]}`)
		r.end("")
	})
	ns := u.post(false)
	if ns.status != 502 || ns.code != subjects.CodeUpstreamError {
		t.Errorf("reply without its accept: %d %q %s, want 502 upstream_error", ns.status, ns.code, ns.body)
	}
	if n := u.attempts.Load(); n != 1 {
		t.Errorf("%d attempts: the replica did the work, it is not run again", n)
	}
}

func TestSilencePastTheIdleTimeoutFailsExplicitly(t *testing.T) {
	const idle = 200 * time.Millisecond
	release := make(chan struct{})
	u := newUpstream(t, gateway.Config{IdleTimeout: idle}, func(r *reply, attempt int) {
		switch attempt {
		case 1, 2: // accepted, then nothing: before the first byte
			r.accept("r-0")
		case 3: // a stream that stops mid-way
			r.accept("r-0")
			r.head(200, "text/event-stream")
			r.send(nil, "data: {\"i\":0}\n\n")
		case 4: // slow but alive: keepalives for 3 idle timeouts
			r.accept("r-0")
			for range 12 {
				time.Sleep(idle / 4)
				r.keepalive()
			}
			r.head(200, "application/json")
			r.send(nil, `{"ok":true}`)
			r.end("")
		}
		<-release
	})
	t.Cleanup(func() { close(release) }) // runs before the scripts are awaited
	// The replies are silent until the test ends: the idle timeout (200 ms)
	// is what answers. The 5 s bounds only tell that apart from waiting
	// forever, generous for a loaded machine running -race.
	if s := u.post(false); s.status != 504 || s.code != subjects.CodeUpstreamTimeout || s.took > 5*time.Second {
		t.Errorf("silent replica, non-streamed: %d %s after %v; want 504 upstream_timeout", s.status, s.code, s.took)
	}
	if s := u.post(true); s.status != 504 || s.code != subjects.CodeUpstreamTimeout {
		t.Errorf("silent replica before the head of a stream: %d %s; want 504", s.status, s.code)
	}
	s := u.post(true)
	if s.status != 200 || sseError(s.body) != subjects.CodeUpstreamTimeout || s.took > 5*time.Second {
		t.Errorf("stream gone silent: %d %q after %v; want an SSE error event upstream_timeout", s.status, s.body, s.took)
	}
	s = u.post(false)
	if s.status != 200 || s.body != `{"ok":true}` {
		t.Errorf("keepalives did not keep a slow answer alive: %d %q", s.status, s.body)
	}
	t.Logf("slow answer with keepalives took %v against an idle timeout of %v", s.took.Round(time.Millisecond), idle)
}

// TestSilentGoneReplicaFailsAtTheProbe: a reply silent for ProbeAfter is
// probed on its replica's cancel subject. An adapter that died leaves
// nothing subscribed there, NATS answers no-responders, and the answer
// fails then (502 upstream_error, or an SSE error event), long before the
// idle timeout; a live adapter, subscribed, is probed and left alone.
func TestSilentGoneReplicaFailsAtTheProbe(t *testing.T) {
	const probe = 50 * time.Millisecond
	release := make(chan struct{})
	u := newUpstream(t, gateway.Config{IdleTimeout: time.Minute, ProbeAfter: probe}, func(r *reply, attempt int) {
		switch attempt {
		case 1: // accepted, then gone before the head
			r.accept("r-gone")
		case 2: // gone mid-stream
			r.accept("r-gone")
			r.head(200, "text/event-stream")
			r.send(nil, "data: {\"i\":0}\n\n")
		case 3: // alive (its cancel subject taken) and silent for 6 probes
			r.accept("r-live")
			r.head(200, "text/event-stream")
			r.send(nil, "data: {\"i\":0}\n\n")
			time.Sleep(6 * probe)
			r.send(nil, "data: [DONE]\n\n")
			r.end("")
		}
		<-release
	})
	t.Cleanup(func() { close(release) })
	probes := make(chan *nats.Msg, 64)
	sub, err := u.nc.ChanSubscribe("llm.replica.r-live.cancel", probes)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := u.nc.Flush(); err != nil {
		t.Fatal(err)
	}

	// Were the probe not answered, the idle timeout (a minute) would
	// answer 504 upstream_timeout: the code tells the two apart.
	if s := u.post(false); s.status != 502 || s.code != subjects.CodeUpstreamError {
		t.Errorf("gone replica, non-streamed: %d %s after %v; want 502 upstream_error", s.status, s.code, s.took)
	}
	s := u.post(true)
	if s.status != 200 || sseError(s.body) != subjects.CodeUpstreamError || !strings.Contains(s.body, "is gone") {
		t.Errorf("gone replica mid-stream: %d %q after %v; want an SSE error event saying it is gone", s.status, s.body, s.took)
	}
	s = u.post(true)
	if s.status != 200 || sseError(s.body) != "" || !strings.Contains(s.body, "[DONE]") {
		t.Errorf("live replica silent for 6 probes: %d %q; want the whole stream", s.status, s.body)
	}
	if len(probes) == 0 {
		t.Error("the live replica was never probed")
	}
	for len(probes) > 0 {
		if m := <-probes; m.Header.Get(subjects.HdrRequestID) != "" || m.Reply == "" {
			t.Errorf("a probe must name no request and carry a reply subject: %v reply %q", m.Header, m.Reply)
		}
	}
	if got := u.counter("switchyard_gateway_stream_errors_total", map[string]string{"cause": "replica_gone"}); got != 2 {
		t.Errorf("stream_errors_total{cause=replica_gone} = %v, want 2", got)
	}
}

// TestAProbeMustFindNothingTwiceInARow: a replica is gone only when two
// probes in a row get "no responders"; one answered so (an adapter
// reconnecting to another server), or two with a probe that found the
// adapter between them, leave the answer alone, and so does a "no
// responders" that answers no probe.
func TestAProbeMustFindNothingTwiceInARow(t *testing.T) {
	const probe = 50 * time.Millisecond
	u := newUpstream(t, gateway.Config{IdleTimeout: time.Minute, ProbeAfter: probe}, func(r *reply, attempt int) {
		switch attempt {
		case 1: // r-flap: silent for twelve probe periods
			r.accept("r-flap")
			r.head(200, "text/event-stream")
			r.send(nil, "data: {\"i\":0}\n\n")
			time.Sleep(12 * probe)
		case 2: // bare "no responders", as many as fail a replica, before any probe
			r.accept("r-0")
			r.head(200, "text/event-stream")
			r.send(nil, "data: {\"i\":0}\n\n")
			for range 2 { // two in a row fail a replica that was probed
				_ = r.nc.PublishMsg(&nats.Msg{Subject: r.m.Reply, Header: nats.Header{"Status": {"503"}}})
			}
		}
		r.send(nil, "data: [DONE]\n\n")
		r.end("")
	})
	// r-flap's adapter answers its first and fourth probes as NATS would
	// if it were away, and takes the others.
	var probes atomic.Int64
	sub, err := u.nc.Subscribe("llm.replica.r-flap.cancel", func(m *nats.Msg) {
		if n := probes.Add(1); n == 1 || n == 4 {
			_ = u.nc.PublishMsg(&nats.Msg{Subject: m.Reply, Header: nats.Header{"Status": {"503"}}})
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := u.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if s := u.post(true); s.status != 200 || sseError(s.body) != "" || !strings.Contains(s.body, "[DONE]") {
		t.Errorf("replica away for single probes: %d %q after %d probes; want the whole stream", s.status, s.body, probes.Load())
	}
	if n := probes.Load(); n < 5 {
		t.Errorf("%d probes in twelve probe periods; the test needs five", n)
	}
	if s := u.post(true); s.status != 200 || sseError(s.body) != "" || !strings.Contains(s.body, "[DONE]") {
		t.Errorf("a no-responders status that answers no probe: %d %q; want the whole stream", s.status, s.body)
	}
}

// TestNoRespondersWithoutAProbeIsIgnored: a "no responders" status on a
// reply that was never probed (probing off here) is no answer of NATS to
// the gateway: whoever sent it, the answer goes on.
func TestNoRespondersWithoutAProbeIsIgnored(t *testing.T) {
	u := newUpstream(t, gateway.Config{ProbeAfter: -1}, func(r *reply, _ int) {
		r.accept("r-0")
		r.head(200, "text/event-stream")
		r.send(nil, "data: {\"i\":0}\n\n")
		_ = r.nc.PublishMsg(&nats.Msg{Subject: r.m.Reply, Header: nats.Header{"Status": {"503"}}})
		r.send(nil, "data: [DONE]\n\n")
		r.end("")
	})
	if s := u.post(true); s.status != 200 || sseError(s.body) != "" || !strings.Contains(s.body, "[DONE]") {
		t.Errorf("got %d %q; want the whole stream", s.status, s.body)
	}
}

func TestEngineFailureMidStreamIsAnSSEErrorEvent(t *testing.T) {
	u := newUpstream(t, gateway.Config{}, func(r *reply, _ int) {
		r.accept("r-0")
		r.head(200, "text/event-stream")
		r.send(nil, "data: {\"i\":0}\n\n")
		r.end("engine stream broke: connection reset")
	})
	s := u.post(true)
	if s.status != 200 || sseError(s.body) != subjects.CodeUpstreamError || strings.Contains(s.body, "[DONE]") {
		t.Errorf("got %d %q; want an SSE error event and no [DONE]", s.status, s.body)
	}
	if s := u.post(false); s.status != 502 || s.code != subjects.CodeUpstreamError {
		t.Errorf("non-streamed: %d %s, want 502 upstream_error", s.status, s.code)
	}
}

// TestHeadThatIsAlsoTheEnd: an adapter that fails before the engine
// answers sends one message, head, error body and end together; the client
// gets it at once, not at the idle timeout.
func TestHeadThatIsAlsoTheEnd(t *testing.T) {
	u := newUpstream(t, gateway.Config{}, func(r *reply, _ int) {
		r.accept("r-0")
		r.send(nats.Header{subjects.HdrStatus: {"502"}, subjects.HdrContent: {"application/json"}, subjects.HdrEOS: {"1"}},
			`{"error":{"message":"engine unreachable","type":"server_error","param":null,"code":"upstream_error"}}`)
	})
	// "At once" is well under the default 60 s idle timeout: 10 s is
	// generous for a loaded machine running -race.
	for _, stream := range []bool{false, true} {
		s := u.post(stream)
		if s.status != 502 || s.code != subjects.CodeUpstreamError || s.took > 10*time.Second {
			t.Errorf("stream=%v: %d %s after %v, want 502 upstream_error at once", stream, s.status, s.code, s.took)
		}
	}
}

func TestEngineRejectionIsRetriedElsewhere(t *testing.T) {
	for _, status := range []int{429, 503} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			u := newUpstream(t, gateway.Config{}, func(r *reply, attempt int) {
				if attempt == 1 {
					r.accept("r-0")
					r.send(nats.Header{subjects.HdrStatus: {strconv.Itoa(status)}, subjects.HdrContent: {"application/json"}}, "")
					r.send(nil, `{"error":{"message":"busy","type":"server_error","code":"busy"}}`)
					r.end("")
					return
				}
				r.stream("r-1", 3)
			})
			s := u.post(true)
			if s.status != 200 || !strings.Contains(s.body, "[DONE]") {
				t.Fatalf("got %d %q; want the retry's stream", s.status, s.body)
			}
			if ex := u.excluded(); len(ex) != 2 || ex[0] != "" || ex[1] != "r-0" {
				t.Errorf("Llm-Exclude per attempt = %q, want the rejecting replica excluded on the retry", ex)
			}
		})
	}
}

// TestFullReplicasLeftNoneIsAllReplicasBusy: a request whose tried
// replicas were full (all_replicas_busy), and for which the broker then
// finds no replica left (no_replicas), is answered all_replicas_busy: its
// replicas are alive, only without room. A request refused by draining
// replicas alone keeps the broker's no_replicas.
func TestFullReplicasLeftNoneIsAllReplicasBusy(t *testing.T) {
	for _, c := range []struct{ refusal, want string }{
		{subjects.CodeAllReplicasBusy, subjects.CodeAllReplicasBusy},
		{subjects.CodeNoReplicas, subjects.CodeNoReplicas},
	} {
		t.Run(c.refusal, func(t *testing.T) {
			u := newUpstream(t, gateway.Config{}, func(r *reply, attempt int) {
				if attempt == 1 {
					r.reject("r-0", 503, c.refusal)
					return
				}
				f := replyproto.Rejection(subjects.NewError(503, subjects.CodeNoReplicas, "No replica of x is available."))
				_ = r.nc.PublishMsg(f.Msg(r.m.Reply))
			})
			s := u.post(false)
			if s.status != 503 || s.code != c.want {
				t.Errorf("got %d %s, want 503 %s", s.status, s.code, c.want)
			}
			if ex := u.excluded(); len(ex) != 2 || ex[1] != "r-0" {
				t.Errorf("Llm-Exclude per attempt = %q; want the refusing replica excluded on the retry", ex)
			}
		})
	}
}

// listen subscribes to replica's cancel subject as its adapter does: the
// probes (which name no request) it answers present when answers is set,
// as a live adapter does, and ignores otherwise, as one cut off from the
// gateway does; the cancels it passes to cancels, when set.
func (u *upstream) listen(t *testing.T, replica string, answers bool, cancels chan<- string) {
	t.Helper()
	if _, err := u.nc.Subscribe("llm.replica."+replica+".cancel", func(m *nats.Msg) {
		if m.Header.Get(subjects.HdrRequestID) == "" {
			if answers && m.Header.Get(subjects.HdrProbe) != "" {
				f := replyproto.Frame{Kind: replyproto.Present, Replica: replica}
				_ = u.nc.PublishMsg(f.Msg(m.Reply))
			}
			return
		}
		if cancels != nil {
			cancels <- m.Subject
		}
	}); err != nil {
		t.Fatal(err)
	}
	_ = u.nc.Flush()
}

// TestAcceptTimeoutAvoidsTheRoutedReplica: a routed replica that looks
// alive (it answers each probe present) but does not accept is waited for
// AcceptWaitsUnseen accept timeouts, then cancelled, and the retry carries
// it in Llm-Avoid (behind every other replica), not in Llm-Exclude. One
// that answers no probe (cut off with its NATS server, or frozen: its
// subscriptions stay at the other servers for seconds) is waited for once,
// then avoided the same way.
func TestAcceptTimeoutAvoidsTheRoutedReplica(t *testing.T) {
	for _, c := range []struct {
		name    string
		answers bool
		waits   float64
	}{{"answering probes", true, gateway.AcceptWaitsUnseen - 1}, {"answering none", false, 1}} {
		t.Run(c.name, func(t *testing.T) {
			cancels := make(chan string, 4*gateway.AcceptWaits)
			u := newUpstream(t, gateway.Config{AcceptTimeout: 50 * time.Millisecond}, func(r *reply, attempt int) {
				if attempt == 1 {
					r.routed("r-stuck") // the broker chose it; it never accepts
					return
				}
				r.stream("r-1", 2)
			})
			u.listen(t, "r-stuck", c.answers, cancels)
			s := u.post(true)
			if s.status != 200 || !strings.Contains(s.body, "[DONE]") {
				t.Fatalf("got %d %q", s.status, s.body)
			}
			if ex, av := u.excluded(), u.avoided(); len(av) != 2 || av[1] != "r-stuck" || ex[1] != "" {
				t.Errorf("Llm-Avoid per attempt = %q, Llm-Exclude %q; want r-stuck avoided, not excluded, on the retry", av, ex)
			}
			select {
			case c := <-cancels:
				if c != "llm.replica.r-stuck.cancel" {
					t.Errorf("cancel sent to %s", c)
				}
			case <-time.After(10 * time.Second):
				t.Error("no cancel sent to the replica that did not accept")
			}
			if n := u.counter("switchyard_gateway_accept_timeouts_total", nil); n != 1 {
				t.Errorf("accept timeouts counted %v, want 1", n)
			}
			if n := u.counter("switchyard_gateway_accept_waits_total", nil); n != c.waits {
				t.Errorf("accept timeouts waited out %v, want %v", n, c.waits)
			}
		})
	}
}

// TestRoutedReplicaWithNothingListeningIsExcluded: a routed replica where
// nothing listens (NATS answers the probe no-responders) is gone, not
// slow: the retry excludes it, without waiting out the accept timeouts.
func TestRoutedReplicaWithNothingListeningIsExcluded(t *testing.T) {
	const acceptTimeout = 200 * time.Millisecond
	u := newUpstream(t, gateway.Config{AcceptTimeout: acceptTimeout}, func(r *reply, attempt int) {
		if attempt == 1 {
			r.routed("r-dead")
			return
		}
		r.stream("r-1", 2)
	})
	s := u.post(true)
	if s.status != 200 || !strings.Contains(s.body, "[DONE]") {
		t.Fatalf("got %d %q", s.status, s.body)
	}
	if ex := u.excluded(); len(ex) != 2 || ex[1] != "r-dead" {
		t.Errorf("Llm-Exclude per attempt = %q, want r-dead excluded on the retry", ex)
	}
	if n := u.counter("switchyard_gateway_accept_timeouts_total", nil); n != 0 {
		t.Errorf("accept timeouts counted %v, want 0 (the replica was gone, not slow)", n)
	}
}

// TestSlowReplicaPastTheAcceptTimeoutServes: slow is not dead. The only
// replica accepts three accept timeouts late, answering the probes
// meanwhile: the gateway waits for it and the request is served in one
// attempt, never 503 no_replicas.
func TestSlowReplicaPastTheAcceptTimeoutServes(t *testing.T) {
	const acceptTimeout = 100 * time.Millisecond
	u := newUpstream(t, gateway.Config{AcceptTimeout: acceptTimeout}, func(r *reply, attempt int) {
		r.routed("r-slow")
		time.Sleep(3 * acceptTimeout)
		r.stream("r-slow", 2)
	})
	u.listen(t, "r-slow", true, nil)
	s := u.post(true)
	if s.status != 200 || !strings.Contains(s.body, "[DONE]") {
		t.Fatalf("a slow only replica: %d %s %q; want it served", s.status, s.code, s.body)
	}
	if n := u.attempts.Load(); n != 1 {
		t.Errorf("%d attempts, want 1: the gateway waited for the slow accept", n)
	}
	if n := u.counter("switchyard_gateway_accept_waits_total", nil); n < 2 {
		t.Errorf("accept timeouts waited out %v, want at least 2", n)
	}
}

func TestRetriesStopAtTwo(t *testing.T) {
	u := newUpstream(t, gateway.Config{}, func(r *reply, attempt int) {
		r.accept("r-" + strconv.Itoa(attempt))
		r.send(nats.Header{subjects.HdrStatus: {"503"}, subjects.HdrContent: {"application/json"}}, "")
		r.end("")
	})
	s := u.post(false)
	if s.status != 503 || s.code != subjects.CodeAllReplicasBusy {
		t.Errorf("got %d %s, want 503 %s after the retries: every replica was full, none unavailable", s.status, s.code, subjects.CodeAllReplicasBusy)
	}
	if n := u.attempts.Load(); n != 3 {
		t.Errorf("%d attempts, want 3 (one try, two retries)", n)
	}
	if ex := u.excluded(); len(ex) != 3 || ex[2] != "r-1,r-2" {
		t.Errorf("Llm-Exclude per attempt = %q", ex)
	}
}

func TestNoRespondersIsAFast503(t *testing.T) {
	// Fast is less than one accept timeout (three attempts would wait three):
	// NATS's no-responders answers, not the timer.
	u := newUpstream(t, gateway.Config{AcceptTimeout: 20 * time.Second}, nil)
	s := u.post(false)
	if s.status != 503 || s.code != subjects.CodeRouterUnavailable || s.took > 10*time.Second {
		t.Errorf("no broker: %d %s after %v, want a fast 503 router_unavailable", s.status, s.code, s.took)
	}
	if n := u.counter("switchyard_gateway_retries_total", nil); n != 2 {
		t.Errorf("retries = %v, want 2", n)
	}
}

// TestRetryBudgetCapsRetries fails every attempt of many concurrent
// requests: the budget (20% of active requests, at least 3) lets only a few
// of them retry, so a failing fleet is not sent three times the load.
func TestRetryBudgetCapsRetries(t *testing.T) {
	const clients = 30
	u := newUpstream(t, gateway.Config{}, func(r *reply, attempt int) {
		r.accept("r-x")
		time.Sleep(200 * time.Millisecond) // every attempt is in flight together
		r.send(nats.Header{subjects.HdrStatus: {"503"}, subjects.HdrContent: {"application/json"}}, "")
		r.end("")
	})
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range clients {
		wg.Go(func() {
			if s := u.post(false); s.status == 503 {
				failed.Add(1)
			}
		})
	}
	wg.Wait()
	attempts := u.attempts.Load()
	retries := attempts - clients
	t.Logf("%d requests, %d attempts: %d retries (no budget: %d)", clients, attempts, retries, 2*clients)
	if failed.Load() != clients {
		t.Errorf("%d of %d failed explicitly", failed.Load(), clients)
	}
	// Concurrent retries are capped at max(3, 0.2·30) = 6; each request
	// retries at most twice, so at most 12 retries, never 60.
	if retries > 12 || retries < 1 {
		t.Errorf("%d retries, want between 1 and 12", retries)
	}
}

func TestNATSDisconnectFailsInFlightThenRecovers(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	u := newUpstream(t, gateway.Config{IdleTimeout: time.Minute}, func(r *reply, attempt int) {
		if attempt == 1 {
			r.accept("r-0")
			r.head(200, "text/event-stream")
			r.send(nil, "data: {\"i\":0}\n\n")
			<-release // the rest would come after the outage
			return
		}
		r.stream("r-1", 2)
	})
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	resp, err := http.Post(u.gw+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"chat-small","messages":[{"role":"user","content":"hi"}],"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, _ := br.ReadString('\n'); !strings.Contains(line, `"i":0`) {
		t.Fatalf("first chunk: %q", line)
	}
	start := time.Now()
	srv := natstest.Restart(t, u.srv)
	u.srv = srv
	rest, _ := io.ReadAll(br)
	failedIn := time.Since(start)
	once.Do(func() { close(release) })
	if sseError(string(rest)) != subjects.CodeRouterUnavailable {
		t.Errorf("in-flight stream after the disconnect: %q; want an SSE error event router_unavailable", rest)
	}
	// New requests flow again once the connections are back.
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		s := u.post(true)
		if s.status == 200 && strings.Contains(s.body, "[DONE]") {
			return nil
		}
		if s.status != 503 || s.code != subjects.CodeRouterUnavailable {
			t.Fatalf("during the outage: %d %s %q; want 200 or an explicit 503", s.status, s.code, s.body)
		}
		return errors.New("requests do not flow again after the reconnect")
	})
	t.Logf("in-flight stream failed %v after the server went down; requests flowed again %v after", failedIn.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}

// TestFailureOnEachSideOfTheFirstByte drives every failure kind through a
// real gateway, before the first byte (a retry, or an HTTP error) and after
// it (an SSE error event ending the stream, never a retry). No responders
// and an accept timeout can only happen before the first byte: the accept
// precedes it.
func TestFailureOnEachSideOfTheFirstByte(t *testing.T) {
	const idle = 200 * time.Millisecond
	chunk := "data: {\"i\":0}\n\n"
	// streamed starts an answer whose first byte reaches a streaming client.
	streamed := func(r *reply) {
		r.accept("r-0")
		r.head(200, "text/event-stream")
		r.send(nil, chunk)
	}
	tests := []struct {
		name   string
		stream bool
		script func(r *reply, attempt int) // nil: no broker at all
		status int
		code   string // the HTTP error code, or the SSE error event's code
		tries  int64
	}{
		{"no responders/before", false, nil, 503, subjects.CodeRouterUnavailable, 3},
		{"accept timeout/before", false, func(r *reply, attempt int) {
			if attempt == 1 {
				r.routed("r-dead")
				return
			}
			r.stream("r-1", 1)
		}, 200, "", 2},
		{"engine refusal/before", true, func(r *reply, attempt int) {
			if attempt == 1 {
				r.accept("r-0")
				r.send(nats.Header{subjects.HdrStatus: {"503"}, subjects.HdrContent: {"application/json"}, subjects.HdrEOS: {"1"}}, `{}`)
				return
			}
			r.stream("r-1", 1)
		}, 200, "", 2},
		{"engine refusal/after", true, func(r *reply, _ int) {
			streamed(r)
			r.end("engine answered 503 mid-stream")
		}, 200, subjects.CodeUpstreamError, 1},
		{"sequence gap/before", false, func(r *reply, _ int) {
			r.accept("r-0")
			r.head(200, "application/json")
			r.seq++
			r.send(nil, `{}`)
		}, 502, subjects.CodeUpstreamError, 1},
		{"sequence gap/after", true, func(r *reply, _ int) {
			streamed(r)
			r.seq++
			r.send(nil, chunk)
		}, 200, subjects.CodeUpstreamError, 1},
		{"silence/before", false, func(r *reply, _ int) {
			r.accept("r-0")
			r.head(200, "application/json")
		}, 504, subjects.CodeUpstreamTimeout, 1},
		{"silence/after", true, func(r *reply, _ int) {
			streamed(r)
		}, 200, subjects.CodeUpstreamTimeout, 1},
		{"death/before", false, func(r *reply, _ int) {
			r.accept("r-0")
			r.head(200, "application/json")
			r.end("engine stream broke: connection reset")
		}, 502, subjects.CodeUpstreamError, 1},
		{"death/after", true, func(r *reply, _ int) {
			streamed(r)
			r.end("engine stream broke: connection reset")
		}, 200, subjects.CodeUpstreamError, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := newUpstream(t, gateway.Config{AcceptTimeout: idle, IdleTimeout: idle}, tt.script)
			s := u.post(tt.stream)
			code := s.code
			if s.status == 200 {
				code = sseError(s.body)
			}
			if s.status != tt.status || code != tt.code {
				t.Errorf("got %d %q (%q); want %d %q", s.status, code, s.body, tt.status, tt.code)
			}
			if s.status == 200 && tt.code == "" && !strings.Contains(s.body, "[DONE]") {
				t.Errorf("the retry's answer did not arrive whole: %q", s.body)
			}
			tries := u.attempts.Load()
			if tt.script == nil {
				tries = int64(u.counter("switchyard_gateway_retries_total", nil)) + 1
			}
			if tries != tt.tries {
				t.Errorf("%d attempts, want %d", tries, tt.tries)
			}
		})
	}
}

// TestClientGoneBeforeRoutedIsCancelledWhereRouted: a client that leaves
// after the request was published but before the broker said where it
// routed it still gets the replica's engine call cancelled, once the
// routed notice comes.
func TestClientGoneBeforeRoutedIsCancelledWhereRouted(t *testing.T) {
	published := make(chan struct{}, 1)
	routeNow := make(chan struct{})
	u := newUpstream(t, gateway.Config{}, func(r *reply, _ int) {
		published <- struct{}{}
		<-routeNow
		r.routed("r-slow")
		r.accept("r-slow")
	})
	cancels := make(chan string, 4)
	if _, err := u.nc.Subscribe("llm.replica.*.cancel", func(m *nats.Msg) { cancels <- m.Subject }); err != nil {
		t.Fatal(err)
	}
	_ = u.nc.Flush()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", u.gw+"/v1/chat/completions",
		strings.NewReader(`{"model":"chat-small","messages":[{"role":"user","content":"hi"}]}`))
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-published
	cancel() // the client leaves; no broker has routed the request yet
	<-errc
	// A slow broker: the pause makes the gateway usually see the client
	// leave before the routed notice. What is asserted holds in either
	// order (a client gone after the accept is cancelled by the relay).
	time.Sleep(50 * time.Millisecond)
	close(routeNow)
	select {
	case c := <-cancels:
		if c != "llm.replica.r-slow.cancel" {
			t.Errorf("cancel sent to %s", c)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no cancel sent to the replica the request was routed to after its client left")
	}
	checkCounter(t, u, "switchyard_gateway_client_disconnects_total", 1)
}

// checkCounter polls a gateway counter until it reads want.
func checkCounter(t *testing.T, u *upstream, name string, want float64) {
	t.Helper()
	testkit.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if got := u.counter(name, nil); got != want {
			return fmt.Errorf("%s = %v, want %v", name, got, want)
		}
		return nil
	})
}
