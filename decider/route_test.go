package decider

import (
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/deploy/examples"
	"github.com/switchyard-llm/switchyard/features"
	"github.com/switchyard-llm/switchyard/natsconn/natstest"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// newTestBroker is a broker whose table holds the dev table plus n general
// replicas of llama-3-70b-instruct v1.5.0, each with a fresh heartbeat.
func newTestBroker(tb testing.TB, n int, now time.Time) *Decider {
	tb.Helper()
	_, url := natstest.Start(tb)
	nc, err := nats.Connect(url)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	b, err := New(nc, Config{ID: "bench", Now: func() time.Time { return now }})
	if err != nil {
		tb.Fatal(err)
	}
	flat := examples.Flat()
	snap, errs := table.FromFlat(flat)
	if len(errs) > 0 {
		tb.Fatal(errs)
	}
	for i := range n {
		id := fmt.Sprintf("r-%d", i)
		v, err := table.Decode("replicas."+id, []byte(`{"model":"llama-3-70b-instruct","version":"v1.5.0","pool":"general","max_batch":32,"max_queue":128,"state":"ready"}`))
		if err != nil {
			tb.Fatal(err)
		}
		snap.Set(v, nil)
	}
	canary, _ := table.Decode("replicas.c-0", []byte(`{"model":"llama-3-70b-instruct","version":"v1.6.0","pool":"canary","max_batch":32,"max_queue":128,"state":"ready"}`))
	snap.Set(canary, nil)
	snap.Revision = 4711 // a live bucket's revision, past strconv's cached small numbers
	b.SetTable(snap)
	for id, r := range snap.Replicas {
		b.router.ObserveHeartbeat(&subjects.Heartbeat{
			Replica: id, Model: r.Model, Version: r.Version, Pool: r.Pool, State: subjects.StateReady,
			KVUsage: 0.3, Running: 4, Waiting: 1, MaxBatch: 32, MaxQueue: 128, ScrapeOK: true,
		}, now)
	}
	return b
}

// gatewayHeaders are the headers the gateway sets for a chat request with
// 32 prefix blocks.
func gatewayHeaders() nats.Header {
	prompt := make([]byte, 32*256)
	for i := range prompt {
		prompt[i] = byte('a' + i%26)
	}
	prefix := features.AppendPrefix(nil, prompt, 256, 64)
	return nats.Header{
		subjects.HdrRequestID:    {"req-1"},
		subjects.HdrModel:        {"chat-large"},
		subjects.HdrEndpoint:     {subjects.EndpointChat},
		subjects.HdrConversation: {"conv-42"},
		subjects.HdrPriority:     {subjects.PriorityInteractive},
		subjects.HdrPromptTokens: {strconv.Itoa(len(prompt) / 4)},
		subjects.HdrMaxTokens:    {"64"},
		subjects.HdrPrefix:       {features.FormatPrefixHeader(prefix)},
		subjects.HdrDeadline:     {"99999999999999"},
	}
}

// dispatch handles one message as a broker's endpoint does: what Handle
// decides is published (the routed notice aside), an owner read done here.
func dispatch(b *Decider, subject, reply string, h nats.Header, data []byte) {
	if reply != "" && !b.InReplySpace(reply) {
		b.RefuseReply(reply)
		return
	}
	if h == nil {
		h = nats.Header{}
	}
	s := b.Get()
	defer b.Release(s)
	var msg nats.Msg
	if handleInto(b, s, subject, reply, h, data, &msg) || msg.Subject != "" {
		_ = b.nc.PublishMsg(&msg)
	}
}

// handleInto fills msg with what send publishes for handle's Action on one
// message (the routed notice aside): the request for the replica, then
// forward is true, or the refusal for reply. An owner read is done here,
// as lookUp does it, and decided on (owned).
func handleInto(b *Decider, s *Scratch, subject, reply string, h nats.Header, data []byte, msg *nats.Msg) (forward bool) {
	a := b.Handle(s, subject, reply, h, data)
	if a.Do == DoReadOwner {
		a = b.Owned(s, subject, reply, h, data, a.Owner)
	}
	switch a.Do {
	case DoForward:
		*msg = a.Route.Msg
		return true
	case DoRefuse:
		b.Reject(msg, reply, a.Err)
	}
	return false
}

func TestHandleForwardsWithRouteHeaders(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	b := newTestBroker(t, 4, now)
	s := NewScratch()
	var msg nats.Msg
	h := gatewayHeaders()
	// A sender cannot send a request's prefill leg anywhere: only the
	// broker's decision names a prefill replica.
	h.Set(subjects.HdrRoutePrefill, "forged")
	body := []byte(`{"model":"chat-large"}`)
	handleInto(b, s, "llm.gw.default", "_INBOX.gw.1", h, body, &msg)
	if v := msg.Header.Get(subjects.HdrRoutePrefill); v != "" {
		t.Errorf("a sender's %s %q was forwarded", subjects.HdrRoutePrefill, v)
	}
	rep := msg.Header.Get(subjects.HdrRouteReplica)
	if msg.Subject != "llm.replica."+rep || msg.Reply != "_INBOX.gw.1" || string(msg.Data) != string(body) {
		t.Fatalf("forwarded %q reply %q body %q", msg.Subject, msg.Reply, msg.Data)
	}
	for _, k := range []string{subjects.HdrRouteModel, subjects.HdrRouteVersion, subjects.HdrRoutePool, subjects.HdrRouteReason, subjects.HdrRouteTableRev, subjects.HdrTenant, subjects.HdrBroker} {
		if msg.Header.Get(k) == "" {
			t.Errorf("%s missing", k)
		}
	}
	if got := msg.Header.Get(subjects.HdrTenant); got != "default" {
		t.Errorf("tenant = %q", got)
	}
}

func TestHandleRejectsUnknownModel(t *testing.T) {
	b := newTestBroker(t, 2, time.Unix(1_800_000_000, 0))
	s := NewScratch()
	var msg nats.Msg
	h := gatewayHeaders()
	h.Set(subjects.HdrModel, "no-such-model")
	handleInto(b, s, "llm.gw.default", "_INBOX.gw.2", h, nil, &msg)
	if msg.Subject != "_INBOX.gw.2" || msg.Header.Get(subjects.HdrStatus) != "404" || msg.Header.Get(subjects.HdrEOS) != "1" || msg.Header.Get(subjects.HdrSeq) != "0" {
		t.Fatalf("want a 404 rejection to the reply subject, got %q %v %s", msg.Subject, msg.Header, msg.Data)
	}
}

func TestHandleTTFTObjective(t *testing.T) {
	// newTestBroker's replicas heartbeat no TTFT: the prediction is 0,
	// which meets any objective.
	b := newTestBroker(t, 2, time.Unix(1_800_000_000, 0))
	s := NewScratch()
	for _, v := range []string{"2s", "1ms", "10m"} {
		var msg nats.Msg
		h := gatewayHeaders()
		h.Set(subjects.HdrTTFTObjective, v)
		if !handleInto(b, s, "llm.gw.default", "_INBOX.gw.3", h, nil, &msg) {
			t.Fatalf("objective %s: not forwarded: %v %s", v, msg.Header, msg.Data)
		}
	}
	for _, v := range []string{"800", "0s", "999us", "10m0.001s", "-1s", strings.Repeat("1", 40) + "s"} {
		var msg nats.Msg
		h := gatewayHeaders()
		h.Set(subjects.HdrTTFTObjective, v)
		handleInto(b, s, "llm.gw.default", "_INBOX.gw.3", h, nil, &msg)
		if msg.Header.Get(subjects.HdrStatus) != "400" || !strings.Contains(string(msg.Data), "Llm-TTFT-Objective") {
			t.Fatalf("objective %q: want a 400 naming the header, got %v %s", v, msg.Header, msg.Data)
		}
	}
}

func TestHandleScansTheBodyOfADirectClient(t *testing.T) {
	b := newTestBroker(t, 2, time.Unix(1_800_000_000, 0))
	s := NewScratch()
	var msg nats.Msg
	body := []byte(`{"model":"chat-large","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`)
	handleInto(b, s, "llm.route.default", "_INBOX.x", nats.Header{}, body, &msg)
	if msg.Header.Get(subjects.HdrRouteModel) != "llama-3-70b-instruct" {
		t.Fatalf("direct client not routed: %q %v %s", msg.Subject, msg.Header, msg.Data)
	}
}

// BenchmarkRoutePath is the broker's own per-request CPU: headers parsed, a
// full decision, route headers written; NATS I/O excluded.
func BenchmarkRoutePath(b *testing.B) {
	for _, n := range []int{8, 64, 1024} {
		b.Run(fmt.Sprintf("candidates=%d", n), func(b *testing.B) {
			now := time.Unix(1_800_000_000, 0)
			br := newTestBroker(b, n, now)
			sent := gatewayHeaders()
			h := maps.Clone(sent)
			body := []byte(`{"model":"chat-large"}`)
			s := NewScratch()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				h[subjects.HdrConversation][0] = strconv.Itoa(i & 1023)
				if a := br.Handle(s, "llm.gw.default", "_INBOX.gw.1", h, body); a.Do != DoForward {
					b.Fatal("not forwarded")
				}
				// NATS decodes each message's headers afresh: only the
				// gateway's are there, and every route header is new.
				for k := range h {
					if sent[k] == nil {
						delete(h, k)
					}
				}
				// Drain the publish queue as the publisher goroutine would.
				for len(br.out) > 0 {
					<-br.out
				}
			}
		})
	}
}

// BenchmarkRoutePathDirect is BenchmarkRoutePath for a direct client: no
// routing headers, so the broker reads model, tokens, prefix and flags from
// the body itself.
func BenchmarkRoutePathDirect(b *testing.B) {
	now := time.Unix(1_800_000_000, 0)
	br := newTestBroker(b, 8, now)
	body := []byte(`{"model":"chat-large","max_tokens":64,"messages":[{"role":"system","content":"` +
		strings.Repeat("You are a careful assistant. ", 64) + `"},{"role":"user","content":"hi"}]}`)
	s := NewScratch()
	var msg nats.Msg
	h := nats.Header{}
	b.ReportAllocs()
	for b.Loop() {
		clear(h)
		handleInto(br, s, "llm.route.default", "_INBOX.c.1", h, body, &msg)
		if msg.Header.Get(subjects.HdrRouteReplica) == "" {
			b.Fatalf("not forwarded: %v %s", msg.Header, msg.Data)
		}
		for len(br.out) > 0 {
			<-br.out
		}
	}
}

// BenchmarkRefuseOverBound is the broker refusing a 6 MB Llm-Exclude: the
// check counts bytes, so the figure does not grow with the header.
func BenchmarkRefuseOverBound(b *testing.B) {
	br := newTestBroker(b, 8, time.Unix(1_800_000_000, 0))
	h := nats.Header{subjects.HdrExclude: {strings.Repeat("r-0,", 6<<20/4)}}
	body := []byte(`{"model":"chat-large","messages":[{"role":"user","content":"hi"}]}`)
	s := NewScratch()
	var msg nats.Msg
	b.ReportAllocs()
	for b.Loop() {
		s.reset()
		handleInto(br, s, "llm.gw.default", "_INBOX.gw.1", h, body, &msg)
		if msg.Header.Get(subjects.HdrStatus) != "400" {
			b.Fatal("not refused")
		}
		for len(br.out) > 0 {
			<-br.out
		}
	}
}

// TestHandleCarriesAServiceImportReplyInAHeader: a direct tenant's reply is
// a service-import reply, which the server refuses as a published reply, so
// it travels in Llm-Reply; a sender's own Llm-Reply is never passed on.
func TestHandleCarriesAServiceImportReplyInAHeader(t *testing.T) {
	b := newTestBroker(t, 2, time.Unix(1_800_000_000, 0))
	body := []byte(`{"model":"chat-large","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`)
	for _, tc := range []struct {
		reply, forged, wantReply, wantHeader string
	}{
		{"_R_.abc.def", "", "", "_R_.abc.def"},
		{"_R_.abc.def", "llm.reply.gw.victim", "", "_R_.abc.def"},
		{"llm.reply.gw.1", "_R_.other", "llm.reply.gw.1", ""},
		{"_INBOX.x", "llm.heartbeat.r", "_INBOX.x", ""},
	} {
		var msg nats.Msg
		h := nats.Header{}
		if tc.forged != "" {
			h.Set(subjects.HdrReply, tc.forged)
		}
		if !handleInto(b, NewScratch(), "llm.route.default", tc.reply, h, body, &msg) {
			t.Fatalf("reply %q: not forwarded: %v %s", tc.reply, msg.Header, msg.Data)
		}
		if msg.Reply != tc.wantReply || msg.Header.Get(subjects.HdrReply) != tc.wantHeader {
			t.Errorf("reply %q (Llm-Reply %q): forwarded with reply %q, Llm-Reply %q; want %q, %q",
				tc.reply, tc.forged, msg.Reply, msg.Header.Get(subjects.HdrReply), tc.wantReply, tc.wantHeader)
		}
	}
}

// TestRouteEndpointsRunAtOnce: the route and gateway endpoints are two
// subscriptions, each with its own goroutine, so the route path may run on
// both at once; under -race this fails on any state it shares unlocked
// (the decision sampling's random source was such state).
func TestRouteEndpointsRunAtOnce(t *testing.T) {
	b := newTestBroker(t, 4, time.Unix(1_800_000_000, 0))
	next := b.Table().Clone()
	v, err := table.Decode("policy", []byte(`{"decision_sample": 0.5}`))
	if err != nil {
		t.Fatal(err)
	}
	next.Set(v, nil)
	b.SetTable(next)
	sub, err := b.nc.SubscribeSync("llm.replica.>")
	if err != nil {
		t.Fatal(err)
	}
	const each = 200
	var wg sync.WaitGroup
	wg.Go(func() {
		for range each {
			dispatch(b, "llm.gw.default", "_INBOX.gw.1", gatewayHeaders(), []byte(`{"model":"chat-large"}`))
		}
	})
	wg.Go(func() {
		for range each {
			dispatch(b, "llm.route.default", "_INBOX.direct.1", nats.Header{},
				[]byte(`{"model":"chat-large","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`))
		}
	})
	wg.Wait()
	for n := range 2 * each {
		if _, err := sub.NextMsg(5 * time.Second); err != nil {
			t.Fatalf("%d of %d requests forwarded: %v", n, 2*each, err)
		}
	}
}

// TestHandleRunsABatchLineAtBatchPriority: a line on llm.batch.<tenant> is
// the subject's tenant's, at batch priority whatever it says, with its
// features read from the body as a direct client's.
func TestHandleRunsABatchLineAtBatchPriority(t *testing.T) {
	b := newTestBroker(t, 2, time.Unix(1_800_000_000, 0))
	s := NewScratch()
	var msg nats.Msg
	h := nats.Header{
		subjects.HdrEndpoint:     {subjects.EndpointChat},
		subjects.HdrPriority:     {subjects.PriorityInteractive},
		subjects.HdrPromptTokens: {"1"},
		subjects.HdrRequestID:    {"someone-elses"},
	}
	body := []byte(`{"model":"chat-large","messages":[{"role":"user","content":"` + strings.Repeat("long prompt ", 100) + `"}],"max_tokens":3}`)
	handleInto(b, s, "llm.batch.acme", "_INBOX.b.1", h, body, &msg)
	q := &s.req
	if q.Priority != subjects.PriorityBatch || q.Tenant != "acme" || q.PromptTokens < 100 || q.ID == "someone-elses" {
		t.Fatalf("a batch line decided as %+v", q)
	}
	if msg.Header.Get(subjects.HdrPriority) != subjects.PriorityBatch {
		t.Errorf("forwarded with priority %q", msg.Header.Get(subjects.HdrPriority))
	}
}
