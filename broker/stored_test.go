package broker

import (
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/decider"
	"github.com/switchyard-llm/switchyard/owners"
	"github.com/switchyard-llm/switchyard/subjects"
)

// TestOwnerLookupDoesNotHoldUpRouting: a request naming a stored response
// reads its owner from the owners bucket; while that read hangs (here a
// JetStream API that takes requests and never answers, as during a leader
// election), the requests behind it on the same endpoint are still routed.
// The one waiting is answered 503 when its read times out, and past
// MaxOwnerLookups waiting, the next is answered 503 at once.
func TestOwnerLookupDoesNotHoldUpRouting(t *testing.T) {
	var stalled *nats.Subscription
	b := newTestBroker(t, 4, time.Unix(1_800_000_000, 0), func(nc *nats.Conn, cfg *Config) {
		var err error
		if stalled, err = nc.SubscribeSync("stalled.API.>"); err != nil {
			t.Fatal(err)
		}
		js, err := jetstream.NewWithAPIPrefix(nc, "stalled.API")
		if err != nil {
			t.Fatal(err)
		}
		cfg.owners = owners.NewReader(js, "")
	})
	replies, err := b.nc.SubscribeSync("_INBOX.t.>")
	if err != nil {
		t.Fatal(err)
	}
	// The replicas take what is forwarded (else the server answers the
	// forwarded request's reply subject with "no responders").
	forwarded, err := b.nc.SubscribeSync(b.subj.Replica(">"))
	if err != nil {
		t.Fatal(err)
	}
	// The endpoint's goroutine, as micro runs it: one message at a time.
	deliver := func(reply string, h nats.Header) {
		b.dispatch("llm.gw.default", reply, h, []byte(`{"model":"chat-large"}`))
	}
	storedHeaders := func() nats.Header {
		h := gatewayHeaders()
		h.Set(subjects.HdrEndpoint, subjects.EndpointResponses)
		h.Set(subjects.HdrPreviousResponse, "resp_0123456789abcdef")
		return h
	}

	// Whatever names the stored response: a gateway's header, a GET, or a
	// direct client's body (keys match as encoding/json matches them, so
	// in any case and with escapes).
	deliver("_INBOX.t.stored", storedHeaders())
	if _, err := stalled.NextMsg(5 * time.Second); err != nil {
		t.Fatalf("the owners read never reached JetStream: %v", err)
	}
	b.dispatch("llm.gw.default", "_INBOX.t.get", nats.Header{subjects.HdrMethod: {"GET"}, subjects.HdrPreviousResponse: {"resp_0123456789abcdef"}}, nil)
	for i, key := range []string{`Previous_Response_ID`, `previous\u005fresponse_id`} {
		b.dispatch("llm.route.default", "_INBOX.t.direct-"+strconv.Itoa(i), nats.Header{},
			[]byte(`{"model":"chat-large","input":"hi","`+key+`":"resp_0123456789abcdef"}`))
	}
	deliver("_INBOX.t.plain", gatewayHeaders())
	m, err := replies.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if m.Subject != "_INBOX.t.plain" || m.Header.Get(subjects.HdrRouted) == "" {
		t.Fatalf("first answer %s %v %s: the plain request waited behind an owners read", m.Subject, m.Header, m.Data)
	}
	if m, err := forwarded.NextMsg(5 * time.Second); err != nil || m.Reply != "_INBOX.t.plain" {
		t.Fatalf("the plain request was not forwarded: %v", err)
	}

	// Fill the lookups: the one past the bound is refused at once.
	const waiting = 4 // the stored turn, the GET and the two direct turns
	for i := waiting; i < MaxOwnerLookups; i++ {
		deliver("_INBOX.t.stored-"+strconv.Itoa(i), storedHeaders())
	}
	deliver("_INBOX.t.over", storedHeaders())
	m, err = replies.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if m.Subject != "_INBOX.t.over" || m.Header.Get(subjects.HdrStatus) != "503" || m.Header.Get("Retry-After") == "" {
		t.Fatalf("past the bound: %s %v %s, want 503 with Retry-After to _INBOX.t.over", m.Subject, m.Header, m.Data)
	}

	// Stopping waits for the reads; every waiting request is answered when
	// its read times out.
	b.endLookups()
	answered := map[string]bool{}
	for len(answered) < MaxOwnerLookups {
		m, err := replies.NextMsg(time.Second)
		if err != nil {
			t.Fatalf("%d of %d waiting requests answered when stopping ended: %v", len(answered), MaxOwnerLookups, err)
		}
		if m.Header.Get(subjects.HdrStatus) != "503" || answered[m.Subject] {
			t.Fatalf("%s: %v %s", m.Subject, m.Header, m.Data)
		}
		answered[m.Subject] = true
	}
	if len(b.lookups) != 0 {
		t.Errorf("%d lookup tokens held after every lookup ended", len(b.lookups))
	}
	// Stopping, a request is finished where it arrives: answered by the
	// time dispatch returns (its read took OwnerTimeout; on a goroutine,
	// the answer would come that long after), with no goroutine left.
	deliver("_INBOX.t.stopping", storedHeaders())
	if m, err := replies.NextMsg(decider.OwnerTimeout / 2); err != nil || m.Subject != "_INBOX.t.stopping" {
		t.Fatalf("a request naming a stored response while stopping was not answered by dispatch: %v", err)
	}
}
