package adapter_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects"
)

// TestAcceptRidesOnTheHead: with a fast engine, a non-streamed answer is one
// message: seq 1 carrying the accept, the head, the whole body and the end;
// Llm-Held says how long the accept waited for the engine's head.
func TestAcceptRidesOnTheHead(t *testing.T) {
	const engineHead = 30 * time.Millisecond
	e := newEnv(t)
	e.eng.handle(func(w http.ResponseWriter, r *http.Request) {
		<-time.After(engineHead)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"object":"chat.completion","usage":{"prompt_tokens":3,"completion_tokens":2}}`))
	})
	cfg := e.config()
	cfg.AcceptDelay = time.Second
	e.start(cfg)
	e.waitReady("r-1")
	h := chatHeaders("req-fast")
	h.Del(subjects.HdrStream)
	msgs := untilEnd(t, e.request("r-1", h, `{"model":"x"}`))
	if len(msgs) != 1 {
		t.Fatalf("%d messages, want one", len(msgs))
	}
	m := msgs[0]
	if seq(t, m) != 1 || m.Header.Get(subjects.HdrAccepted) != "r-1" || m.Header.Get(subjects.HdrStatus) != "200" ||
		m.Header.Get(subjects.HdrEOS) != "1" || string(m.Data) != `{"object":"chat.completion","usage":{"prompt_tokens":3,"completion_tokens":2}}` {
		t.Errorf("want seq 1 with accept, head, body and end; got %v %s", m.Header, m.Data)
	}
	if held := heldOf(t, m); held < engineHead || held >= time.Second {
		t.Errorf("Llm-Held %v, want at least the engine's %v and under the accept delay", held, engineHead)
	}
}

// heldOf reads a message's Llm-Held.
func heldOf(t *testing.T, m *nats.Msg) time.Duration {
	t.Helper()
	us, err := strconv.ParseInt(m.Header.Get(subjects.HdrHeld), 10, 64)
	if err != nil {
		t.Fatalf("Llm-Held %q: %v", m.Header.Get(subjects.HdrHeld), err)
	}
	return time.Duration(us) * time.Microsecond
}

// TestAcceptGoesAloneWhenTheEngineIsSlow: past the accept delay the accept
// is sent on its own (seq 0), so the gateway's accept timeout never fires on
// a slow engine, and the head follows as seq 1.
func TestAcceptGoesAloneWhenTheEngineIsSlow(t *testing.T) {
	e := newEnv(t)
	// The engine answers only once the accept has arrived: an adapter that
	// held the accept for the engine would never send it.
	release := make(chan struct{})
	answer := sync.OnceFunc(func() { close(release) })
	t.Cleanup(answer)
	e.eng.handle(func(w http.ResponseWriter, r *http.Request) {
		<-release
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte("data: {\"n\":1}\n\ndata: [DONE]\n\n"))
	})
	cfg := e.config()
	cfg.AcceptDelay = 20 * time.Millisecond
	e.start(cfg)
	e.waitReady("r-1")
	ch := e.request("r-1", chatHeaders("req-slow"), `{"model":"x"}`)
	accept := next(t, ch)
	answer()
	if seq(t, accept) != 0 || accept.Header.Get(subjects.HdrAccepted) != "r-1" || accept.Header.Get(subjects.HdrStatus) != "" {
		t.Errorf("want a lone accept at seq 0, got %v", accept.Header)
	}
	if held := heldOf(t, accept); held < 20*time.Millisecond || held >= time.Second {
		t.Errorf("Llm-Held %v on a lone accept, want the accept delay (20ms) or a little more", held)
	}
	rest := untilEnd(t, ch)
	if seq(t, rest[0]) != 1 || rest[0].Header.Get(subjects.HdrStatus) != "200" || rest[0].Header.Get(subjects.HdrAccepted) != "" {
		t.Errorf("want the head alone at seq 1, got %v", rest[0].Header)
	}
}

// TestCancelBeforeTheRequest: a cancel that overtakes its request (separate
// subscriptions) still stops it: the request is dropped when it arrives.
func TestCancelBeforeTheRequest(t *testing.T) {
	e := newEnv(t)
	e.eng.handle(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	})
	e.start(e.config())
	e.waitReady("r-1")
	cancel := nats.NewMsg(subjects.New("").ReplicaCancel("r-1"))
	cancel.Header.Set(subjects.HdrRequestID, "req-early")
	if err := e.nc.PublishMsg(cancel); err != nil {
		t.Fatal(err)
	}
	// Wait until the adapter's cancel endpoint has handled it (micro stats).
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, testkit.Cond("the cancel to be handled", func() bool { return cancelsHandled(t, e.nc) >= 1 }))
	ch := e.request("r-1", chatHeaders("req-early"), `{"model":"x"}`)
	select {
	case m := <-ch:
		t.Fatalf("a cancelled request was served: %v", m.Header)
	case <-time.After(300 * time.Millisecond):
	}
	if n := len(e.eng.requests()); n != 0 {
		t.Errorf("the engine got %d requests", n)
	}
	// Another request goes through as usual.
	if msgs := untilEnd(t, e.request("r-1", chatHeaders("req-next"), `{"model":"x"}`)); len(msgs) == 0 {
		t.Fatal("no answer")
	}
}

// cancelsHandled reads the adapter's micro stats for its cancel endpoint.
func cancelsHandled(t *testing.T, nc *nats.Conn) int {
	t.Helper()
	m, err := nc.Request("$SRV.STATS.switchyard-adapter", nil, time.Second)
	if err != nil {
		return 0
	}
	var st struct {
		Endpoints []struct {
			Subject     string `json:"subject"`
			NumRequests int    `json:"num_requests"`
		} `json:"endpoints"`
	}
	if err := json.Unmarshal(m.Data, &st); err != nil {
		t.Fatal(err)
	}
	for _, ep := range st.Endpoints {
		if strings.HasSuffix(ep.Subject, ".cancel") {
			return ep.NumRequests
		}
	}
	return 0
}

// TestTheSameRequestTwiceIsServedOnce: a gateway that saw no accept in time
// sends the request once more under the same id, in case the first was
// lost; an adapter that has it already drops the second, so the engine
// runs it once and the reply has one accept.
func TestTheSameRequestTwiceIsServedOnce(t *testing.T) {
	e := newEnv(t)
	release := make(chan struct{})
	e.eng.handle(func(w http.ResponseWriter, r *http.Request) {
		<-release
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	})
	e.start(e.config())
	e.waitReady("r-1")
	inbox := nats.NewInbox()
	ch := make(chan *nats.Msg, 64)
	sub, err := e.nc.ChanSubscribe(inbox, ch)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	msg := &nats.Msg{Subject: subjects.New("").Replica("r-1"), Reply: inbox, Header: chatHeaders("req-twice"), Data: []byte(`{"model":"x"}`)}
	for range 2 {
		if err := e.nc.PublishMsg(msg); err != nil {
			t.Fatal(err)
		}
	}
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, testkit.Cond("the engine to have the request", func() bool { return len(e.eng.requests()) >= 1 }))
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	close(release)
	msgs := untilEnd(t, ch)
	accepts := 0
	for _, m := range msgs {
		if m.Header.Get(subjects.HdrAccepted) != "" {
			accepts++
		}
	}
	select {
	case m := <-ch:
		t.Errorf("a reply message after the end: %v", m.Header)
	case <-time.After(200 * time.Millisecond):
	}
	if n := len(e.eng.requests()); n != 1 || accepts > 1 {
		t.Errorf("engine got %d requests, %d accepts in the reply; want the request served once", n, accepts)
	}
}

// TestAProbeIsAnsweredPresent: an empty message on the replica's cancel
// subject with a reply subject and Llm-Probe is a gateway's probe; the
// adapter answers it present, naming itself. It publishes nothing for a
// reply outside the reply space, nor for a probe that does not ask (an
// earlier gateway's, which would read the answer as a sequence gap).
func TestAProbeIsAnsweredPresent(t *testing.T) {
	e := newEnv(t)
	e.start(e.config())
	e.waitReady("r-1")
	cancel := subjects.New("").ReplicaCancel("r-1")
	for _, c := range []struct {
		reply   string
		ask     bool
		answers bool
	}{{"llm.reply.gw-1.probe-1", true, true}, {"llm.elsewhere.probe-2", true, false}, {"llm.reply.gw-1.probe-3", false, false}} {
		sub, err := e.nc.SubscribeSync(c.reply)
		if err != nil {
			t.Fatal(err)
		}
		probe := &nats.Msg{Subject: cancel, Reply: c.reply, Header: nats.Header{}}
		if c.ask {
			probe.Header.Set(subjects.HdrProbe, "1")
		}
		if err := e.nc.PublishMsg(probe); err != nil {
			t.Fatal(err)
		}
		m, err := sub.NextMsg(time.Second)
		switch {
		case c.answers && err != nil:
			t.Errorf("no answer to a probe on %s: %v", c.reply, err)
		case c.answers && (m.Header.Get(subjects.HdrPresent) != "r-1" || m.Header.Get(subjects.HdrSeq) != "" || len(m.Data) != 0):
			t.Errorf("answer to a probe: %v %q, want Llm-Present: r-1 alone", m.Header, m.Data)
		case !c.answers && err == nil:
			t.Errorf("a probe (reply %s, asking %v) answered: %v", c.reply, c.ask, m.Header)
		}
		_ = sub.Unsubscribe()
	}
}
