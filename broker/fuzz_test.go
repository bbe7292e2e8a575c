package broker

import (
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
		s := newScratch()
		var msg nats.Msg
		b.handle(s, "llm.route."+tenant, "_INBOX.fuzz", h, body, &msg)
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
		unhealthy, err := decodeHeartbeat(subject, data, &hb)
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
