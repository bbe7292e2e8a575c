package adapter_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-llm/switchyard/enginesim"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	adapter "github.com/switchyard-llm/switchyard/replica-adapter"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// simEngine runs an enginesim server until the test ends.
func simEngine(t *testing.T, cfg enginesim.ServerConfig) (*enginesim.Server, *httptest.Server) {
	t.Helper()
	cfg.Engine.Model = "sim-model"
	srv := enginesim.NewServer(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.CloseClientConnections()
		cancel()
		<-done
		hs.Close()
	})
	return srv, hs
}

// pdPair starts a prefill replica p-1 and a decode replica d-1, each an
// adapter in front of its own enginesim.
type pdPair struct {
	e                *env
	prefill, decode  *enginesim.Server
	prefillEngineURL *httptest.Server
}

func newPDPair(t *testing.T, prefillCfg enginesim.ServerConfig) *pdPair {
	return newPDPairWith(t, prefillCfg, nil, nil)
}

// newPDPairWith is newPDPair with the prefill and the decode adapter's
// configs changed by prefill and decode (when set).
func newPDPairWith(t *testing.T, prefillCfg enginesim.ServerConfig, prefill, decode func(*adapter.Config)) *pdPair {
	e := newEnv(t)
	pe, ps := simEngine(t, prefillCfg)
	de, ds := simEngine(t, enginesim.ServerConfig{Speed: 100})
	cfg := e.config()
	cfg.Replica, cfg.Role, cfg.EngineURL = "p-1", table.RolePrefill, ps.URL
	if prefill != nil {
		prefill(&cfg)
	}
	e.start(cfg)
	cfg = e.config()
	cfg.Replica, cfg.Role, cfg.EngineURL = "d-1", table.RoleDecode, ds.URL
	if decode != nil {
		decode(&cfg)
	}
	e.start(cfg)
	return &pdPair{e: e, prefill: pe, decode: de, prefillEngineURL: ps}
}

const longPrompt = `{"model": "pd-model", "messages": [{"role": "user", "content": "` +
	`the quick brown fox jumps over the lazy dog and keeps running far away `

func longBody(maxTokens string) string {
	return longPrompt + strings.Repeat("again and again ", 400) + `"}], "max_tokens": ` + maxTokens + `}`
}

func splitHeaders(id, prefill string) nats.Header {
	return nats.Header{
		subjects.HdrRequestID:    {id},
		subjects.HdrEndpoint:     {subjects.EndpointChat},
		subjects.HdrTenant:       {"acme"},
		subjects.HdrPromptTokens: {"2000"},
		subjects.HdrRouteReason:  {"power-of-two"},
		subjects.HdrRoutePrefill: {prefill},
	}
}

type chatAnswer struct {
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	KV *enginesim.KVTransferParams `json:"kv_transfer_params"`
}

// answerOf reads a non-streamed answer: the head's headers and the body.
func answerOf(t *testing.T, ch <-chan *nats.Msg) (nats.Header, chatAnswer) {
	t.Helper()
	var head nats.Header
	var body []byte
	for _, m := range untilEnd(t, ch) {
		if head == nil && m.Header.Get(subjects.HdrStatus) != "" {
			head = m.Header
		}
		if m.Header.Get(subjects.HdrAccepted) == "" {
			body = append(body, m.Data...)
		}
	}
	if head.Get(subjects.HdrStatus) != "200" {
		t.Fatalf("status %s: %s", head.Get(subjects.HdrStatus), body)
	}
	var a chatAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		t.Fatalf("answer %q: %v", body, err)
	}
	return head, a
}

func usageEvents(t *testing.T, nc *nats.Conn) *nats.Subscription {
	t.Helper()
	sub, err := nc.SubscribeSync(subjects.New("").UsageAll())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return sub
}

func TestSplitRequestRunsBothLegs(t *testing.T) {
	pd := newPDPair(t, enginesim.ServerConfig{Speed: 100})
	usage := usageEvents(t, pd.e.nc)
	head, a := answerOf(t, pd.e.request("d-1", splitHeaders("req-split", "p-1"), longBody("7")))
	if got := head.Get(subjects.HdrRoutePrefill); got != "p-1" {
		t.Errorf("head %s = %q, want p-1", subjects.HdrRoutePrefill, got)
	}
	if got := head.Get(subjects.HdrRouteReason); got != "power-of-two" {
		t.Errorf("head reason %q", got)
	}
	if a.Usage.CompletionTokens != 7 || a.Usage.PromptTokens < 1000 || a.KV != nil {
		t.Errorf("answer usage %+v kv %+v", a.Usage, a.KV)
	}
	ps, ds := pd.prefill.KVTransfers(), pd.decode.KVTransfers()
	if len(ps) != 1 || !ps[0].DoRemoteDecode || ps[0].DoRemotePrefill {
		t.Errorf("prefill engine saw %+v", ps)
	}
	if len(ds) != 1 || !ds[0].DoRemotePrefill || ds[0].RemoteEngineID == nil || *ds[0].RemoteEngineID != pd.prefill.EngineID() || len(ds[0].RemoteBlockIDs) == 0 {
		t.Errorf("decode engine saw %+v", ds)
	}
	// The request is counted once: one usage event, the decode leg's.
	m, err := usage.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var u subjects.Usage
	if err := json.Unmarshal(m.Data, &u); err != nil || u.Replica != "d-1" || u.CompletionTokens != 7 || u.PromptTokens != a.Usage.PromptTokens {
		t.Errorf("usage %+v (%v)", u, err)
	}
	if err := pd.e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if m, err := usage.NextMsg(200 * time.Millisecond); err == nil {
		t.Errorf("a second usage event: %s", m.Data)
	}
}

// wholeAfter checks an answer served whole by its decode replica after the
// split did not happen, with cause in the reason.
func wholeAfter(t *testing.T, head nats.Header, a chatAnswer, cause string) {
	t.Helper()
	if got := head.Get(subjects.HdrRoutePrefill); got != "" {
		t.Errorf("head still names prefill replica %q", got)
	}
	if got, want := head.Get(subjects.HdrRouteReason), "power-of-two+prefill-whole:"+cause; got != want {
		t.Errorf("reason %q, want %q", got, want)
	}
	if a.Usage.CompletionTokens != 5 {
		t.Errorf("usage %+v", a.Usage)
	}
}

func TestPrefillRefusedServesWhole(t *testing.T) {
	pd := newPDPair(t, enginesim.ServerConfig{Speed: 100})
	head, a := answerOf(t, pd.e.request("d-1", splitHeaders("req-refused", "no-such-replica"), longBody("5")))
	wholeAfter(t, head, a, "refused")
	if ds := pd.decode.KVTransfers(); len(ds) != 0 {
		t.Errorf("decode engine saw %+v", ds)
	}
	// A decode replica is no prefill replica: it does not serve legs.
	head, a = answerOf(t, pd.e.request("d-1", splitHeaders("req-to-decode", "d-1"), longBody("5")))
	wholeAfter(t, head, a, "refused")
}

func TestPrefillEngineDeadServesWhole(t *testing.T) {
	pd := newPDPair(t, enginesim.ServerConfig{Speed: 100})
	pd.prefillEngineURL.CloseClientConnections()
	pd.prefillEngineURL.Close()
	head, a := answerOf(t, pd.e.request("d-1", splitHeaders("req-dead", "p-1"), longBody("5")))
	if head.Get(subjects.HdrRoutePrefill) != "" || !strings.HasPrefix(head.Get(subjects.HdrRouteReason), "power-of-two+prefill-whole:") {
		t.Errorf("head %v", head)
	}
	if a.Usage.CompletionTokens != 5 {
		t.Errorf("usage %+v", a.Usage)
	}
	if ds := pd.decode.KVTransfers(); len(ds) != 0 {
		t.Errorf("decode engine saw %+v", ds)
	}
}

func TestDecodeRejectingTheParametersServesWhole(t *testing.T) {
	// The prefill's blocks expire at once: the decode engine cannot pull
	// them and fails the request as vLLM does.
	pd := newPDPair(t, enginesim.ServerConfig{Speed: 100, KVHold: time.Nanosecond})
	head, a := answerOf(t, pd.e.request("d-1", splitHeaders("req-expired", "p-1"), longBody("5")))
	wholeAfter(t, head, a, "decode_rejected")
	if ds := pd.decode.KVTransfers(); len(ds) != 1 || !ds[0].DoRemotePrefill {
		t.Errorf("decode engine saw %+v, want the one rejected decode leg", ds)
	}
}

// A decode engine's 500 for KV blocks it cannot pull (the prefill's
// blocks expired) is not the decode replica's failure: each such request
// is prefilled there instead, and neither the failure counter nor the
// heartbeat's streak, which brokers eject on, hears of it, however many
// come at once.
func TestExpiredKVBlocksNeverEjectTheDecodeReplica(t *testing.T) {
	reg := prometheus.NewRegistry()
	pd := newPDPairWith(t, enginesim.ServerConfig{Speed: 100, KVHold: time.Nanosecond}, nil, func(c *adapter.Config) { c.Registerer = reg })
	nextHB := heartbeats(t, pd.e.nc, "d-1")
	n := subjects.EjectAfterFailures + 3
	answers := make([]<-chan *nats.Msg, n)
	for i := range answers {
		answers[i] = pd.e.request("d-1", splitHeaders(fmt.Sprint("req-expired-", i), "p-1"), longBody("5"))
	}
	for _, ch := range answers {
		head, a := answerOf(t, ch)
		wholeAfter(t, head, a, "decode_rejected")
	}
	if ds := pd.decode.KVTransfers(); len(ds) != n {
		t.Fatalf("decode engine saw %d decode legs, want %d (each refused, then prefilled here)", len(ds), n)
	}
	if got := counter(t, reg, "switchyard_adapter_engine_failures_total", "", ""); got != 0 {
		t.Errorf("engine failures counted: %v, want none", got)
	}
	if got := counter(t, reg, "switchyard_adapter_prefill_fallbacks_total", "cause", "decode_rejected"); got != float64(n) {
		t.Errorf("decode_rejected fallbacks counted: %v, want %d", got, n)
	}
	worst := 0
	waitHeartbeat(t, nextHB, func(hb subjects.Heartbeat) error {
		worst = max(worst, hb.EngineFailures)
		if hb.EngineSuccesses < uint64(n) {
			return fmt.Errorf("engine successes %d, want %d", hb.EngineSuccesses, n)
		}
		return nil
	})
	if worst != 0 {
		t.Errorf("a heartbeat reported a streak of %d engine failures", worst)
	}
}

func TestClientGoneBetweenTheLegs(t *testing.T) {
	// A prefill slow enough to cancel during it.
	pd := newPDPair(t, enginesim.ServerConfig{Speed: 1, Engine: enginesim.Config{PrefillPerToken: 20 * time.Millisecond}})
	usage := usageEvents(t, pd.e.nc)
	ch := pd.e.request("d-1", splitHeaders("req-gone", "p-1"), longBody("5"))
	testkit.CheckFor(t, 20*time.Second, 5*time.Millisecond, func() error {
		if pd.prefill.InFlight() != 1 {
			return errString("the prefill leg has not reached its engine")
		}
		return nil
	})
	if err := pd.e.nc.PublishMsg(&nats.Msg{Subject: subjects.New("").ReplicaCancel("d-1"), Header: nats.Header{subjects.HdrRequestID: {"req-gone"}}}); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if pd.prefill.InFlight() != 0 {
			return errString("the prefill leg still runs")
		}
		return nil
	})
	for _, m := range untilEnd(t, ch) {
		if m.Header.Get(subjects.HdrStatus) == "200" {
			t.Errorf("a cancelled request was answered: %v", m.Header)
		}
	}
	if ds := pd.decode.KVTransfers(); len(ds) != 0 || pd.decode.InFlight() != 0 {
		t.Errorf("the decode engine was called: %+v", ds)
	}
	m, err := usage.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var u subjects.Usage
	if err := json.Unmarshal(m.Data, &u); err != nil || u.CompletionTokens != 0 || u.Replica != "d-1" {
		t.Errorf("usage %+v, want nothing used", u)
	}
}

// A forged prefill leg (any adapter may send one) gets one token and the
// KV-transfer parameters, never a full or streamed answer, and spends no
// tenant's quota.
func TestForgedPrefillLegNeverAnswersWhole(t *testing.T) {
	pd := newPDPair(t, enginesim.ServerConfig{Speed: 100})
	usage := usageEvents(t, pd.e.nc)
	body := longPrompt + `"}], "max_tokens": 500, "max_completion_tokens": 500, "stream": true, "stream_options": {"include_usage": true}}`
	h := nats.Header{subjects.HdrRequestID: {"forged"}, subjects.HdrEndpoint: {subjects.EndpointChat}, subjects.HdrTenant: {"victim"}}
	m, err := pd.e.nc.RequestMsg(&nats.Msg{Subject: subjects.New("").Prefill("p-1", "d-1"), Header: h, Data: []byte(body)}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var a chatAnswer
	if err := json.Unmarshal(m.Data, &a); err != nil {
		t.Fatalf("answer %q: %v", m.Data, err)
	}
	if m.Header.Get(subjects.HdrStatus) != "200" || a.Usage.CompletionTokens != 1 || a.KV == nil {
		t.Errorf("forged leg answered %s: %s", m.Header.Get(subjects.HdrStatus), m.Data)
	}
	if strings.Contains(string(m.Data), "data:") {
		t.Errorf("a forged leg got a stream: %s", m.Data)
	}
	// Not a prefill leg at all: refused. (Its own id: the first leg's
	// may still be booked for a moment after its answer.)
	h.Set(subjects.HdrEndpoint, subjects.EndpointEmbeddings)
	h.Set(subjects.HdrRequestID, "forged-2")
	if m, err := pd.e.nc.RequestMsg(&nats.Msg{Subject: subjects.New("").Prefill("p-1", "d-1"), Header: h, Data: []byte(`{"input": "x"}`)}, 5*time.Second); err != nil || m.Header.Get(subjects.HdrStatus) != "400" {
		t.Errorf("embeddings leg: %v %v", err, m)
	}
	if err := pd.e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if m, err := usage.NextMsg(200 * time.Millisecond); err == nil {
		t.Errorf("a prefill leg reported usage: %s", m.Data)
	}
}

type errString string

func (e errString) Error() string { return string(e) }

// A prefill leg stops only for a cancel on the subject that names the
// decode replica that sent it; a cancel by request id on the leg subject,
// or in another replica's name, stops nothing.
func TestPrefillLegCancelledOnlyInItsSendersName(t *testing.T) {
	// A prefill slow enough to try every cancel during it.
	pd := newPDPair(t, enginesim.ServerConfig{Speed: 1, Engine: enginesim.Config{PrefillPerToken: time.Millisecond}})
	subj := subjects.New("")
	h := splitHeaders("leg-1", "")
	inbox := nats.NewInbox()
	answer, err := pd.e.nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := pd.e.nc.PublishMsg(&nats.Msg{Subject: subj.Prefill("p-1", "d-1"), Reply: inbox, Header: h, Data: []byte(longBody("5"))}); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 20*time.Second, 5*time.Millisecond, func() error {
		if pd.prefill.InFlight() != 1 {
			return errString("the prefill leg has not reached its engine")
		}
		return nil
	})
	cancel := func(subject string) {
		t.Helper()
		m := &nats.Msg{Subject: subject, Header: nats.Header{subjects.HdrRequestID: {"leg-1"}, subjects.HdrPrefillCancel: {"1"}}}
		if err := pd.e.nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	cancel(subj.Prefill("p-1", "d-1"))
	cancel(subj.PrefillCancel("p-1", "d-2"))
	m, err := answer.NextMsg(30 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var a chatAnswer
	if m.Header.Get(subjects.HdrStatus) != "200" || json.Unmarshal(m.Data, &a) != nil || a.KV == nil {
		t.Fatalf("a cancel not in the sender's name stopped the leg: %s %.300s", m.Header.Get(subjects.HdrStatus), m.Data)
	}

	// The second leg's prompt shares no prefix with the first one's, which
	// the engine has cached: it is prefilled whole, 20 s at 1 ms a token,
	// so the cancel reaches it in flight however loaded the machine, and
	// only a cancel that works answers it before then.
	h.Set(subjects.HdrRequestID, "leg-2")
	legTwo := `{"model": "pd-model", "messages": [{"role": "user", "content": "` +
		strings.Repeat("a second prompt of its own ", 3000) + `"}], "max_tokens": 5}`
	if err := pd.e.nc.PublishMsg(&nats.Msg{Subject: subj.Prefill("p-1", "d-1"), Reply: inbox, Header: h, Data: []byte(legTwo)}); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 20*time.Second, 5*time.Millisecond, func() error {
		if pd.prefill.InFlight() != 1 {
			return errString("the second leg has not reached its engine")
		}
		return nil
	})
	m2 := &nats.Msg{Subject: subj.PrefillCancel("p-1", "d-1"), Header: nats.Header{subjects.HdrRequestID: {"leg-2"}, subjects.HdrPrefillCancel: {"1"}}}
	if err := pd.e.nc.PublishMsg(m2); err != nil {
		t.Fatal(err)
	}
	if m, err = answer.NextMsg(time.Minute); err != nil {
		t.Fatal(err)
	}
	if m.Header.Get(subjects.HdrStatus) == "200" {
		t.Errorf("the sender's cancel did not stop its leg: %.300s", m.Data)
	}
}

// A prefill leg's decode replica is its subject's last token, never a
// header: a leg sent in d-2's name that claims d-1 in Llm-Route-Replica
// does not take d-1's request id, and d-1's own leg of the same id is
// served beside it.
func TestPrefillLegSenderIsTheSubjectsNotTheHeaders(t *testing.T) {
	pd := newPDPair(t, enginesim.ServerConfig{Speed: 1, Engine: enginesim.Config{PrefillPerToken: time.Millisecond}})
	subj := subjects.New("")
	lying := splitHeaders("same-id", "")
	lying.Set(subjects.HdrRouteReplica, "d-1")
	squat, err := pd.e.nc.SubscribeSync(nats.NewInbox())
	if err != nil {
		t.Fatal(err)
	}
	if err := pd.e.nc.PublishMsg(&nats.Msg{Subject: subj.Prefill("p-1", "d-2"), Reply: squat.Subject, Header: lying, Data: []byte(longBody("5"))}); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if pd.prefill.InFlight() != 1 {
			return errString("the squatting leg has not reached its engine")
		}
		return nil
	})
	m, err := pd.e.nc.RequestMsg(&nats.Msg{Subject: subj.Prefill("p-1", "d-1"), Header: splitHeaders("same-id", ""), Data: []byte(longBody("5"))}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var a chatAnswer
	if m.Header.Get(subjects.HdrStatus) != "200" || json.Unmarshal(m.Data, &a) != nil || a.KV == nil {
		t.Fatalf("d-1's leg was refused for an id another replica's leg claimed in its name: %s %.300s", m.Header.Get(subjects.HdrStatus), m.Data)
	}
	if m, err = squat.NextMsg(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if m.Header.Get(subjects.HdrStatus) != "200" {
		t.Errorf("d-2's leg: %s %.300s", m.Header.Get(subjects.HdrStatus), m.Data)
	}
}
