package test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects"
)

// A prefill leg is stopped only by the adapter that sent it. Any adapter
// may send prefill legs, so one that learned another's request id (a
// retried request reaches several replicas with the same id) must not be
// able to cancel that replica's prefill: a cancel is believed only on the
// subject that names its sender last, which only that sender may publish.
func TestAPrefillLegIsCancelledOnlyByItsSender(t *testing.T) {
	const prefill, victim, attacker = "pd-prefill-0", "pd-decode-0", "pd-decode-1"
	// Speed 1: a prompt of about 39,000 tokens takes seconds to prefill.
	st := startStack(t, devstack.Config{Speed: 1, Replicas: devstack.ReplicasNamed(prefill, victim, attacker)})
	legs := mustConnectAs(t, st, adapterRole(victim))
	evil := mustConnectAs(t, st, adapterRole(attacker))
	subj := subjects.New("")
	eng := st.Engine(prefill)

	// startLeg sends a prefill leg as the victim's adapter does.
	startLeg := func(id string) <-chan *nats.Msg {
		t.Helper()
		inbox := legs.NewRespInbox()
		ch := make(chan *nats.Msg, 1)
		sub, err := legs.ChanSubscribe(inbox, ch)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
		m := &nats.Msg{Subject: subj.Prefill(prefill, victim), Reply: inbox, Data: []byte(pdPrompt(id, 30000, 5)), Header: nats.Header{
			subjects.HdrRequestID: {id}, subjects.HdrEndpoint: {subjects.EndpointChat},
		}}
		if err := legs.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
		testkit.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
			if eng.InFlight() != 1 {
				return errText("the prefill leg has not reached its engine")
			}
			return nil
		})
		return ch
	}
	cancel := func(nc *nats.Conn, subject, id string) {
		t.Helper()
		_ = nc.PublishMsg(&nats.Msg{Subject: subject, Header: nats.Header{subjects.HdrRequestID: {id}, subjects.HdrPrefillCancel: {"1"}}})
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}

	ch := startLeg("victim-leg")
	// The attacker cancels by request id every way it can: on a leg
	// subject, its own or the victim's, and in the victim's name (the
	// server refuses both of the victim's), in its own.
	cancel(evil, subj.Prefill(prefill, attacker), "victim-leg")
	cancel(evil, subj.Prefill(prefill, victim), "victim-leg")
	cancel(evil, subj.PrefillCancel(prefill, victim), "victim-leg")
	cancel(evil, subj.PrefillCancel(prefill, attacker), "victim-leg")
	m := legAnswer(t, ch)
	var a struct {
		KV *struct {
			DoRemotePrefill bool  `json:"do_remote_prefill"`
			BlockIDs        []int `json:"remote_block_ids"`
		} `json:"kv_transfer_params"`
	}
	if m.Header.Get(subjects.HdrStatus) != "200" || json.Unmarshal(m.Data, &a) != nil || a.KV == nil || len(a.KV.BlockIDs) == 0 {
		t.Fatalf("another adapter's cancel stopped the leg: %s %.300s", m.Header.Get(subjects.HdrStatus), m.Data)
	}

	// The victim's own cancel stops its leg.
	ch = startLeg("victim-leg-2")
	cancel(legs, subj.PrefillCancel(prefill, victim), "victim-leg-2")
	testkit.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if eng.InFlight() != 0 {
			return errText("the cancelled leg still runs")
		}
		return nil
	})
	if m := legAnswer(t, ch); m.Header.Get(subjects.HdrStatus) == "200" {
		t.Errorf("a cancelled leg answered 200: %.300s", m.Data)
	}
}

// A prefill leg speaks for the decode replica its subject names last,
// which only that replica's adapter may publish. An adapter that learned
// another's request id cannot claim it first, so that the other's leg is
// refused and its request prefilled whole: the server refuses a leg in
// the other's name, and the prefill adapter keys a leg sent in the
// attacker's own name by that name, whatever replica Llm-Route-Replica
// claims.
func TestAPrefillLegIsSentOnlyInItsSendersName(t *testing.T) {
	const prefill, victim, attacker, id = "pd-prefill-0", "pd-decode-0", "pd-decode-1", "victim-leg"
	// Speed 1: the attacker's leg of about 39,000 tokens runs for seconds.
	st := startStack(t, devstack.Config{Speed: 1, Replicas: devstack.ReplicasNamed(prefill, victim, attacker)})
	legs := mustConnectAs(t, st, adapterRole(victim))
	evil := mustConnectAs(t, st, adapterRole(attacker))
	subj := subjects.New("")
	eng := st.Engine(prefill)

	send := func(nc *nats.Conn, subject string, words int, h nats.Header) <-chan *nats.Msg {
		t.Helper()
		inbox := nc.NewRespInbox()
		ch := make(chan *nats.Msg, 1)
		sub, err := nc.ChanSubscribe(inbox, ch)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
		h.Set(subjects.HdrRequestID, id)
		h.Set(subjects.HdrEndpoint, subjects.EndpointChat)
		if err := nc.PublishMsg(&nats.Msg{Subject: subject, Reply: inbox, Data: []byte(pdPrompt(id, words, 5)), Header: h}); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		return ch
	}
	served := func(m *nats.Msg) bool {
		var a struct {
			KV *struct {
				BlockIDs []int `json:"remote_block_ids"`
			} `json:"kv_transfer_params"`
		}
		return m.Header.Get(subjects.HdrStatus) == "200" && json.Unmarshal(m.Data, &a) == nil && a.KV != nil && len(a.KV.BlockIDs) > 0
	}

	// In the victim's name: the server refuses it.
	inVictimsName := subj.Prefill(prefill, victim)
	send(evil, inVictimsName, 30000, nats.Header{})
	if err := evil.LastError(); !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), inVictimsName) {
		t.Fatalf("a leg in another replica's name: %v, want the server's permissions violation", err)
	}
	// In its own name, claiming the victim's: it runs as the attacker's.
	squat := send(evil, subj.Prefill(prefill, attacker), 30000, nats.Header{subjects.HdrRouteReplica: {victim}})
	testkit.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if eng.InFlight() != 1 {
			return errText("the attacker's leg has not reached the engine")
		}
		return nil
	})
	// The victim's leg of the same id, sent while the attacker's runs, is
	// served rather than refused.
	if m := legAnswer(t, send(legs, subj.Prefill(prefill, victim), 2000, nats.Header{})); !served(m) {
		t.Fatalf("the victim's leg was not served beside the attacker's of its id: %s %.300s", m.Header.Get(subjects.HdrStatus), m.Data)
	}
	if m := legAnswer(t, squat); !served(m) {
		t.Errorf("the attacker's own leg: %s %.300s", m.Header.Get(subjects.HdrStatus), m.Data)
	}
}

type errText string

func (e errText) Error() string { return string(e) }

// legAnswer is the first message a prefill leg's inbox gets, within a
// minute.
func legAnswer(t *testing.T, ch <-chan *nats.Msg) *nats.Msg {
	t.Helper()
	select {
	case m := <-ch:
		return m
	case <-time.After(60 * time.Second):
		t.Fatal("the prefill leg never answered")
		return nil
	}
}
