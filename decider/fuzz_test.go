package decider

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/subjects"
)

// FuzzRouteHeaders feeds the broker's hot path (headers → policy.Request →
// decision → message) with arbitrary headers and bodies, as a direct NATS
// client may send them. Whatever comes in, the broker answers with exactly
// one well-formed message: a forward to a valid replica subject, or a
// rejection with a status to the reply subject.
func FuzzRouteHeaders(f *testing.F) {
	now := time.Unix(1_800_000_000, 0)
	b := newTestBroker(f, 3, now)
	f.Add("default", "chat-large", "/v1/chat/completions", "20", "64", "99999999999999", "0123456789abcdef,fedcba9876543210", "code", "r-1", "interactive", "conv-1", []byte(`{"model":"chat-large"}`))
	f.Add("acme", "", "", "", "", "", "", "", "", "", "", []byte(`{"model":"chat-small","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`))
	f.Add("b@d", "x", "", "-1", "abc", "soon", "zz", ",,", ",", "urgent", "", []byte(`[`))
	f.Add("default", "chat-large:team-x-v3", "/v1/completions", "999999999999", "0", "1", "", "", "r-0,r-1,r-2", "batch", "", []byte(`{"model":"auto","prompt":"def f(): pass"}`))
	f.Fuzz(func(t *testing.T, tenant, model, endpoint, prompt, maxTok, deadline, prefix, feats, exclude, priority, conv string, body []byte) {
		h := nats.Header{}
		for k, v := range map[string]string{
			subjects.HdrModel: model, subjects.HdrEndpoint: endpoint, subjects.HdrPromptTokens: prompt,
			subjects.HdrMaxTokens: maxTok, subjects.HdrDeadline: deadline, subjects.HdrPrefix: prefix,
			subjects.HdrFeatures: feats, subjects.HdrExclude: exclude, subjects.HdrPriority: priority,
			subjects.HdrConversation: conv,
		} {
			if v != "" {
				h.Set(k, v)
			}
		}
		s := NewScratch()
		var msg nats.Msg
		handleInto(b, s, "llm.route."+tenant, "_INBOX.fuzz", h, body, &msg)
		for len(b.out) > 0 {
			<-b.out
		}
		switch {
		case msg.Subject == "_INBOX.fuzz":
			if msg.Header.Get(subjects.HdrStatus) == "" || msg.Header.Get(subjects.HdrEOS) != "1" || msg.Header.Get(subjects.HdrSeq) != "0" {
				t.Fatalf("rejection without status/end/seq: %v", msg.Header)
			}
		case strings.HasPrefix(msg.Subject, "llm.replica."):
			rep := strings.TrimPrefix(msg.Subject, "llm.replica.")
			if subjects.ValidToken(rep) != nil || msg.Header.Get(subjects.HdrRouteReplica) != rep || msg.Reply != "_INBOX.fuzz" {
				t.Fatalf("forward to %q with %v reply %q", msg.Subject, msg.Header, msg.Reply)
			}
			if subjects.ValidToken(tenant) != nil || s.req.Model == "" || s.req.PromptTokens < 0 || s.req.MaxTokens < 0 {
				t.Fatalf("forwarded a request that should not pass: tenant %q %+v", tenant, s.req)
			}
		default:
			t.Fatalf("no answer: %q", msg.Subject)
		}
	})
}

// FuzzDecodeHeartbeat checks the heartbeat gate: whatever arrives, a
// heartbeat taken names a valid replica, the one of its subject, in a known
// state, and one failing its scrapes is never taken as ready.
func FuzzDecodeHeartbeat(f *testing.F) {
	f.Add("llm.heartbeat.r-0", []byte(`{"replica":"r-0","state":"ready","kv_usage":0.5,"scrape_ok":true}`))
	f.Add("llm.heartbeat.r-0", []byte(`{"replica":"r-0","state":"ready","scrape_ok":false}`))
	f.Add("llm.heartbeat.r-1", []byte(`{"replica":"r-0","state":"ready","scrape_ok":true}`))
	f.Add("llm.heartbeat.x", []byte(`{"replica":"x","state":"loading","lora":{"running":["a"],"waiting":null,"max":2}}`))
	f.Add("llm.heartbeat.", []byte(`{"replica":"","state":"ready"}`))
	f.Add("heartbeat", []byte(`null`))
	f.Fuzz(func(t *testing.T, subject string, data []byte) {
		var hb subjects.Heartbeat
		unhealthy, err := DecodeHeartbeat(subject, data, &hb)
		if err != nil {
			if unhealthy {
				t.Fatal("unhealthy with an error")
			}
			return
		}
		if subjects.ValidToken(hb.Replica) != nil || !strings.HasSuffix(subject, "."+hb.Replica) {
			t.Fatalf("took replica %q from %q", hb.Replica, subject)
		}
		if !subjects.ValidState(hb.State) {
			t.Fatalf("took state %q", hb.State)
		}
		if !hb.ScrapeOK && hb.State == subjects.StateReady {
			t.Fatal("a replica failing its scrapes taken as ready")
		}
		if unhealthy && (hb.ScrapeOK || hb.State != subjects.StateDraining) {
			t.Fatalf("unhealthy but state %q scrape_ok %v", hb.State, hb.ScrapeOK)
		}
	})
}

// FuzzMessages sends the broker what an outsider with a NATS connection
// could: requests with any reply subject and header size, heartbeats and
// load deltas with any numbers for registered and made-up replicas, usage
// and presence events. It fails when the broker publishes outside the reply space and
// its own subjects, when one message takes more than a bounded time, or
// when a message grows the broker's state: the load view, the metric
// series, the reservations, the brokers counted.
func FuzzMessages(f *testing.F) {
	now := time.Unix(1_800_000_000, 0)
	b := newTestBroker(f, 3, now)
	watch, err := nats.Connect(b.nc.ConnectedUrl())
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(watch.Close)
	seen, err := watch.SubscribeSync(">")
	if err != nil {
		f.Fatal(err)
	}
	if err := watch.Flush(); err != nil {
		f.Fatal(err)
	}
	known, reservations := b.router.Known(), b.router.Reservations()
	body := `{"model":"chat-large","messages":[{"role":"user","content":"hi"}]}`
	f.Add(uint8(0), "gw.default", "$JS.API.STREAM.PURGE.KV_llm-routing", uint16(0), 0.5, []byte(body))
	f.Add(uint8(0), "route.acme", "_INBOX.ok", uint16(60000), 0.0, []byte(body))
	f.Add(uint8(0), "gw.default", "llm.reply.gw.1", uint16(10), 1.0, []byte(body))
	f.Add(uint8(1), "r-1", "", uint16(0), -1e300, []byte(nil))
	f.Add(uint8(1), "ghost", "", uint16(3), 0.5, []byte(nil))
	f.Add(uint8(2), "trial", "", uint16(0), 1e9, []byte(`{"tenant":"trial","request_id":"x","reserved_tokens":1000000000}`))
	f.Add(uint8(3), "", "", uint16(0), 0.0, []byte("b-2"))
	f.Add(uint8(4), "r-1", "", uint16(3), -1e9, []byte(nil))
	f.Add(uint8(4), "ghost", "", uint16(20), 5.0, []byte(nil))
	f.Fuzz(func(t *testing.T, kind uint8, token, reply string, size uint16, num float64, data []byte) {
		var msg *nats.Msg
		h := nats.Header{}
		switch kind % 5 {
		case 0:
			if size > 0 {
				h.Set(subjects.HdrExclude, strings.Repeat("r-0,", int(size)*25))
			}
		case 1:
			hb, _ := json.Marshal(map[string]any{"replica": token, "state": "ready", "scrape_ok": true,
				"kv_usage": num, "running": int(num), "waiting": int(size), "engine_failures": int(num),
				"ttft_ewma_ms": num, "lora": map[string]any{"running": strings.Split(strings.Repeat("a,", int(size)), ",")}})
			msg = &nats.Msg{Subject: "llm.heartbeat." + token, Data: hb}
		case 2:
			msg = &nats.Msg{Subject: "llm.usage." + token, Data: data}
		case 3:
			msg = &nats.Msg{Subject: "llm.broker.presence", Data: data}
		case 4:
			samples := make([]map[string]any, int(size)%32)
			for i := range samples {
				samples[i] = map[string]any{"broker": "bench", "predicted_ms": num, "observed_ms": float64(size)}
			}
			d, _ := json.Marshal(map[string]any{"replica": token, "seq": size, "inflight": int(num),
				"queued_prefill_tokens": int(num) * int(size), "ttft": samples})
			msg = &nats.Msg{Subject: "llm.load." + token, Data: d}
		}
		deliver := func() time.Duration {
			start := time.Now()
			switch kind % 5 {
			case 0:
				dispatch(b, "llm."+token, reply, nats.Header(http.Header(h).Clone()), data)
			case 1:
				b.onHeartbeat(msg)
			case 2:
				b.onUsage(msg)
			case 3:
				b.onPresence(msg)
			case 4:
				b.onLoad(msg)
			}
			return time.Since(start)
		}
		// The bound is about time, so a loaded machine gets two more tries:
		// work in proportion to a 6 MB header took over a second each time;
		// a stall of the process does not repeat three times.
		d, tries := deliver(), 1
		for ; d > 100*time.Millisecond && tries < 3; tries++ {
			d = min(d, deliver())
		}
		if d > 100*time.Millisecond {
			t.Fatalf("one message took %v, the best of %d", d, tries)
		}
		for len(b.out) > 0 {
			<-b.out
		}
		if err := b.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := watch.Flush(); err != nil {
			t.Fatal(err)
		}
		for {
			m, err := seen.NextMsg(0)
			if err != nil {
				break
			}
			rep, isReplica := strings.CutPrefix(m.Subject, "llm.replica.")
			if !b.subj.InReplySpace(m.Subject) && !(isReplica && subjects.ValidToken(rep) == nil) && !strings.HasPrefix(m.Subject, "llm.heartbeat.") &&
				!strings.HasPrefix(m.Subject, "llm.usage.") && m.Subject != "llm.broker.presence" {
				t.Fatalf("the broker published on %q", m.Subject)
			}
		}
		if got := b.router.Known(); got != known {
			t.Fatalf("the load view grew from %d to %d replicas", known, got)
		}
		if got := series(b.metrics.heartbeatAge); got > known {
			t.Fatalf("%d heartbeat series for %d replicas", got, known)
		}
		if got := b.router.Reservations(); got > reservations+tries {
			t.Fatalf("%d reservations after one message sent %d times", got, tries)
		}
		reservations = b.router.Reservations()
		if n := b.LiveBrokers(); n > maxBrokers+1 {
			t.Fatalf("%d brokers counted", n)
		}
	})
}
