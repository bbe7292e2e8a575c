package test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/auth"
	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects"
)

// answer collects one request's reply messages on an inbox until its end.
func answer(t *testing.T, sub *nats.Subscription) (head nats.Header, data []byte) {
	t.Helper()
	for {
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("no end of the answer: %v", err)
		}
		if m.Header.Get(subjects.HdrAccepted) != "" && m.Header.Get(subjects.HdrStatus) == "" && m.Header.Get(subjects.HdrEOS) == "" {
			continue // an accept sent alone (the head was late): not the answer's
		}
		if m.Header.Get(subjects.HdrStatus) != "" && head == nil {
			head = m.Header
		}
		data = append(data, m.Data...)
		if m.Header.Get(subjects.HdrEOS) != "" {
			return head, data
		}
	}
}

// ask publishes a request as nc on subject with h and waits for its whole answer.
func ask(t *testing.T, nc *nats.Conn, subject, inbox string, h nats.Header, body string) (nats.Header, []byte) {
	t.Helper()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	m := &nats.Msg{Subject: subject, Reply: inbox, Header: h, Data: []byte(body)}
	if err := nc.PublishMsg(m); err != nil {
		t.Fatal(err)
	}
	return answer(t, sub)
}

// refused reads the broker's count of messages refused for what they claim.
func refused(st *devstack.Stack, kind string) float64 {
	return metric(st, "switchyard_broker_refused_messages_total", map[string]string{"kind": kind})
}

// TestTrust replays each attack of docs/security.md ("What each part
// checks") against the dev stack under its authorization, as a tenant or a
// compromised part would, and checks that it fails by its outcome.
func TestTrust(t *testing.T) {
	eachDecider(t, func(t *testing.T, decide string) {
		r := devstack.Replicas()
		st := startStack(t, devstack.Config{Gateway: gateway.Config{Decide: decide}, Replicas: []devstack.Replica{r[0], r[1], r[2], r[6]}, Speed: 50})
		chat := func(content string, maxTokens int) string {
			b, _ := json.Marshal(map[string]any{"model": "chat-large", "max_tokens": maxTokens,
				"messages": []map[string]string{{"role": "user", "content": content}}})
			return string(b)
		}

		t.Run("a reply subject outside the reply space is never answered", func(t *testing.T) {
			kv := kvBucket(t, st)
			ctx := context.Background()
			keys := func() int {
				l, err := kv.ListKeys(ctx)
				if err != nil {
					t.Fatal(err)
				}
				n := 0
				for range l.Keys() {
					n++
				}
				return n
			}
			before := keys()
			gw := mustConnectAs(t, st, roleGateway)
			for _, reply := range []string{"$JS.API.STREAM.PURGE.KV_llm-routing", "$KV.llm-routing.tenants.acme", "llm.heartbeat.l70-gen-0"} {
				m := nats.NewMsg("llm.gw.default")
				m.Reply = reply
				m.Data = []byte(chat("purge", 1))
				if err := gw.PublishMsg(m); err != nil {
					t.Fatal(err)
				}
			}
			// The broker handles llm.gw.* in order: once this is answered, so
			// were the forged ones.
			if status, _ := post(t, st.GatewayURL(), "", chat("after", 1)); status != 200 {
				t.Fatalf("status %d", status)
			}
			if after := keys(); after != before {
				t.Errorf("the table went from %d keys to %d", before, after)
			}
			if n := refused(st, "reply_subject"); n < 3 {
				t.Errorf("%v refused reply subjects counted, want 3", n)
			}
		})

		t.Run("a direct client's prompt tokens come from its body", func(t *testing.T) {
			nc := mustConnectAs(t, st, tenant("default"))
			h := nats.Header{subjects.HdrPromptTokens: {"1"}, subjects.HdrFeatures: {"code"}}
			long := strings.Repeat("the quick brown fox jumps over the lazy dog ", 1900) // 80 KB
			head, data := ask(t, nc, "llm.route.default", nats.NewInbox(), h, chat(long, 1))
			if head.Get(subjects.HdrStatus) != "200" {
				t.Fatalf("status %s: %s", head.Get(subjects.HdrStatus), data)
			}
			if pool := head.Get(subjects.HdrRoutePool); pool != "long-context" {
				t.Errorf("an 80 KB prompt sent with Llm-Prompt-Tokens: 1 went to pool %q", pool)
			}
		})

		t.Run("the engine receives the reserved max_tokens", func(t *testing.T) {
			gw := mustConnectAs(t, st, roleGateway)
			h := nats.Header{
				subjects.HdrModel: {"chat-large"}, subjects.HdrEndpoint: {subjects.EndpointChat},
				subjects.HdrPromptTokens: {"10"}, subjects.HdrMaxTokens: {"3"}, subjects.HdrRequestID: {"max-tokens-1"},
			}
			head, data := ask(t, gw, "llm.gw.default", "llm.reply.attacker.1", h, chat("write a lot", 500))
			var out struct {
				Usage struct {
					CompletionTokens int `json:"completion_tokens"`
				} `json:"usage"`
			}
			if err := json.Unmarshal(data, &out); err != nil || head.Get(subjects.HdrStatus) != "200" {
				t.Fatalf("status %s: %s", head.Get(subjects.HdrStatus), data)
			}
			if out.Usage.CompletionTokens != 3 {
				t.Errorf("the engine generated %d tokens on a reservation of 3", out.Usage.CompletionTokens)
			}
			body := `{"model":"chat-large","n":4,"max_tokens":2,"messages":[{"role":"user","content":"x"}]}`
			if status, _ := post(t, st.GatewayURL(), "", body); status != 400 {
				t.Errorf("n=4 through the gateway: status %d, want 400", status)
			}
		})

		t.Run("an endpoint Switchyard does not serve never reaches the engine", func(t *testing.T) {
			// team-x's adapter is loaded on l8-gen-0 by a request for it.
			if status, _ := post(t, st.GatewayURL(), "sk-teamx-dev", `{"model":"chat-small","max_tokens":1,"messages":[{"role":"user","content":"x"}]}`); status != 200 {
				t.Fatalf("team-x request: %d", status)
			}
			loaded := func() bool {
				rec := httptest.NewRecorder()
				st.Engine("l8-gen-0").Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/v1/models", nil))
				return strings.Contains(rec.Body.String(), "team-x-v3")
			}
			if !loaded() {
				t.Fatal("team-x-v3 not loaded on l8-gen-0")
			}
			br := mustConnectAs(t, st, roleBroker)
			h := nats.Header{subjects.HdrEndpoint: {"/v1/unload_lora_adapter"}, subjects.HdrRequestID: {"unload-1"}}
			head, data := ask(t, br, "llm.replica.l8-gen-0", nats.NewInbox(), h, `{"lora_name":"team-x-v3"}`)
			if head.Get(subjects.HdrStatus) != "400" {
				t.Errorf("Llm-Endpoint /v1/unload_lora_adapter: status %s: %s", head.Get(subjects.HdrStatus), data)
			}
			if !loaded() {
				t.Error("the adapter unloaded team-x-v3")
			}
		})

		t.Run("a header over its bound is a 400", func(t *testing.T) {
			nc := mustConnectAs(t, st, tenant("default"))
			for _, h := range []nats.Header{
				{subjects.HdrExclude: {strings.Repeat("l70-gen-0,", 6<<20/10)}},
				{subjects.HdrModel: {strings.Repeat("m", 2<<20)}},
			} {
				head, data := ask(t, nc, "llm.route.default", nats.NewInbox(), h, chat("x", 1))
				if head.Get(subjects.HdrStatus) != "400" {
					t.Errorf("status %s: %s", head.Get(subjects.HdrStatus), data)
				}
			}
			big := `{"model":"` + strings.Repeat("m", 2<<20) + `","max_tokens":1,"messages":[{"role":"user","content":"x"}]}`
			if status, _ := post(t, st.GatewayURL(), "", big); status != 400 {
				t.Errorf("a 2 MB model name through the gateway: status %d", status)
			}
		})

		t.Run("an absurd heartbeat is ignored and traffic stays balanced", func(t *testing.T) {
			forger := mustConnectAs(t, st, adapterRole("l70-gen-1"))
			hb, _ := json.Marshal(map[string]any{"replica": "l70-gen-1", "model": "llama-3-70b-instruct", "version": "v1.5.0",
				"pool": "general", "state": "ready", "scrape_ok": true, "kv_usage": -1e300, "engine_failures": 1000000000})
			defer keepPublishing(forger, "llm.heartbeat.l70-gen-1", hb)()
			served := map[string]int{}
			for i := range 8 {
				status, h := post(t, st.GatewayURL(), "", chat("balanced "+strconv.Itoa(i), 1))
				if status != 200 {
					t.Fatalf("status %d", status)
				}
				served[h.Get("X-Switchyard-Replica")]++
			}
			if served["l70-gen-1"] == 8 {
				t.Errorf("every request went to the replica with kv_usage -1e300: %v", served)
			}
			if ej := st.Broker(0).Router().Ejected(time.Now()); len(ej) > 0 {
				t.Errorf("a forged failure count ejected %v", ej)
			}
		})

		t.Run("a heartbeat with an absurd decode time is refused", func(t *testing.T) {
			forger := mustConnectAs(t, st, adapterRole("l70-gen-1"))
			before := metric(st, "switchyard_broker_bad_messages_total", map[string]string{"kind": "heartbeat"})
			// Were it believed, a negative decode time would predict a
			// full batch's slot wait below zero and draw every request to
			// l70-gen-1; everything else in it is plausible.
			hb, _ := json.Marshal(map[string]any{"replica": "l70-gen-1", "model": "llama-3-70b-instruct", "version": "v1.5.0",
				"pool": "general", "state": "ready", "scrape_ok": true, "running": 32, "max_batch": 32, "decode_ms": -1e300})
			defer keepPublishing(forger, "llm.heartbeat.l70-gen-1", hb)()
			testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
				if metric(st, "switchyard_broker_bad_messages_total", map[string]string{"kind": "heartbeat"}) <= before {
					return errors.New("the heartbeat with decode_ms -1e300 was not refused")
				}
				return nil
			})
		})

		t.Run("an absurd load delta is ignored and traffic stays balanced", func(t *testing.T) {
			forger := mustConnectAs(t, st, adapterRole("l70-gen-1"))
			before := metric(st, "switchyard_broker_bad_messages_total", map[string]string{"kind": "load_delta"})
			// Were it believed, minus a billion requests in flight would
			// make l70-gen-1 look empty whatever its heartbeat says.
			delta, _ := json.Marshal(map[string]any{"replica": "l70-gen-1", "seq": 1 << 40, "inflight": -1000000000,
				"queued_prefill_tokens": -1000000000})
			defer keepPublishing(forger, "llm.load.l70-gen-1", delta)()
			testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
				if metric(st, "switchyard_broker_bad_messages_total", map[string]string{"kind": "load_delta"}) <= before {
					return errors.New("the absurd delta was not refused")
				}
				return nil
			})
			served := map[string]int{}
			for i := range 8 {
				status, h := post(t, st.GatewayURL(), "", chat("balanced delta "+strconv.Itoa(i), 1))
				if status != 200 {
					t.Fatalf("status %d", status)
				}
				served[h.Get("X-Switchyard-Replica")]++
			}
			if served["l70-gen-1"] == 8 {
				t.Errorf("every request went to the replica claiming minus a billion in flight: %v", served)
			}
		})

		t.Run("an unregistered replica's heartbeats make no series", func(t *testing.T) {
			f := t.TempDir() + "/ghost.creds"
			if _, errOut, code := sy(t, nil, "", "auth", "creds", st.Auth().Dir(), "--role", "adapter", "--replica", "ghost-0", "--out", f); code != 0 {
				t.Fatalf("auth creds: %s", errOut)
			}
			nc, err := nats.Connect(st.NATSURL(), nats.UserCredentials(f))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			before := refused(st, "unknown_replica")
			hb := `{"replica":"ghost-0","state":"ready","scrape_ok":true,"kv_usage":0.1}`
			testkit.CheckFor(t, 5*time.Second, 50*time.Millisecond, func() error {
				_ = nc.Publish("llm.heartbeat.ghost-0", []byte(hb))
				if refused(st, "unknown_replica") <= before {
					return errors.New("the ghost's heartbeat was not refused")
				}
				return nil
			})
			mfs, err := st.Registry().Gather()
			if err != nil {
				t.Fatal(err)
			}
			for _, mf := range mfs {
				if !strings.HasPrefix(mf.GetName(), "switchyard_broker_") {
					continue
				}
				for _, m := range mf.GetMetric() {
					for _, l := range m.GetLabel() {
						if l.GetValue() == "ghost-0" {
							t.Errorf("%s has a series for ghost-0", mf.GetName())
						}
					}
				}
			}
		})

		t.Run("a forged usage event cannot refund a spent quota", func(t *testing.T) {
			kv := kvBucket(t, st)
			if _, err := kv.Put(context.Background(), "tenants.trial", []byte(`{"tier":"standard","quota":{"tpm":3000}}`)); err != nil {
				t.Fatal(err)
			}
			testkit.CheckFor(t, 5*time.Second, 50*time.Millisecond, func() error {
				tt := st.Broker(0).Table().Tenants["trial"]
				if tt == nil || tt.Quota.TPM != 3000 {
					return errors.New("the broker has not seen trial's tpm quota")
				}
				return nil
			})
			nc := mustConnectAs(t, st, tenant("trial"))
			// Spend the quota with requests of 300 tokens until one is refused
			// with every honest usage event settled (they give back what a
			// request did not use). Under 310 tokens are left then, and the
			// bucket refills 50 a second: a request of 1000 stays refused for
			// seconds unless something refunds it.
			for round := 0; ; round++ {
				admitted := 0
				for {
					head, data := ask(t, nc, "llm.route.trial", nats.NewInbox(), nil, chat("spend", 300))
					if head.Get(subjects.HdrStatus) == "429" {
						break
					}
					if admitted++; admitted > 12 {
						t.Fatalf("a 3000 tpm quota admitted %d requests of 300 tokens: %s", admitted, data)
					}
				}
				testkit.CheckFor(t, 5*time.Second, 50*time.Millisecond, func() error {
					if st.Broker(0).Router().Reservations() != 0 {
						return errors.New("reservations still held")
					}
					return nil
				})
				if admitted == 0 {
					break
				}
				if round > 5 {
					t.Fatal("the quota is never spent")
				}
			}
			before := refused(st, "usage_unreserved")
			adapter := mustConnectAs(t, st, adapterRole("l70-gen-0"))
			for _, u := range []string{
				`{"tenant":"trial","reserved_tokens":1000000000}`,
				`{"tenant":"trial","request_id":"made-up","reserved_tokens":1000000000}`,
			} {
				if err := adapter.Publish("llm.usage.trial", []byte(u)); err != nil {
					t.Fatal(err)
				}
			}
			testkit.CheckFor(t, 5*time.Second, 50*time.Millisecond, func() error {
				if refused(st, "usage_unreserved") < before+2 {
					return errors.New("the forged usage events were not refused")
				}
				return nil
			})
			head, _ := ask(t, nc, "llm.route.trial", nats.NewInbox(), nil, chat("again", 1000))
			if head.Get(subjects.HdrStatus) != "429" {
				t.Errorf("after forged usage events trial got status %s, want 429: the quota was refunded", head.Get(subjects.HdrStatus))
			}
		})

		t.Run("a routed notice is believed only from a broker", func(t *testing.T) {
			// An adapter that learned a request id forges the brokers'
			// notice on the gateway's reply subject, naming another
			// replica: the gateway would tell that replica to cancel the
			// request. A broker's notice comes on the routed subject.
			victim := r[1].ID
			witness := mustConnectAs(t, st, adapterRole(victim))
			cancels, err := witness.SubscribeSync("llm.replica." + victim + ".cancel")
			if err != nil {
				t.Fatal(err)
			}
			if err := witness.Flush(); err != nil {
				t.Fatal(err)
			}
			notice := func(nc *nats.Conn, subject string) {
				if err := nc.PublishMsg(&nats.Msg{Subject: subject, Header: nats.Header{subjects.HdrRouted: {victim}}}); err != nil {
					t.Fatal(err)
				}
				if err := nc.Flush(); err != nil {
					t.Fatal(err)
				}
			}
			gw := st.Gateway().ID()
			before := metric(st, "switchyard_gateway_refused_routed_notices_total", nil)
			notice(mustConnectAs(t, st, adapterRole(r[0].ID)), "llm.reply."+gw+".forged-by-an-adapter")
			testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
				if metric(st, "switchyard_gateway_refused_routed_notices_total", nil) < before+1 {
					return errors.New("the forged notice was not refused")
				}
				return nil
			})
			// An adapter may not publish where brokers do; a broker's
			// notice there is believed.
			notice(mustConnectAs(t, st, adapterRole(r[0].ID)), "llm.routed."+gw+".forged-on-the-routed-subject")
			notice(mustConnectAs(t, st, roleBroker), "llm.routed."+gw+".late-copy")
			for {
				m, err := cancels.NextMsg(5 * time.Second)
				if err != nil {
					t.Fatal("the broker's notice of a late copy cancelled nothing")
				}
				id := m.Header.Get(subjects.HdrRequestID)
				if id == "late-copy" {
					break
				}
				if strings.HasPrefix(id, "forged") {
					t.Fatalf("an adapter's forged notice had the gateway cancel %s on %s", id, victim)
				}
			}
			if m, err := cancels.NextMsg(100 * time.Millisecond); err == nil {
				t.Errorf("cancel of %s after the broker's", m.Header.Get(subjects.HdrRequestID))
			}
		})
	})
}

var _ = auth.RoleTenant

// keepPublishing publishes body on subject every 5 ms, as a forger would,
// until the function it returns is called; that call waits for the last
// publish.
func keepPublishing(nc *nats.Conn, subject string, body []byte) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
				_ = nc.Publish(subject, body)
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}
