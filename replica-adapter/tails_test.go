package adapter_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/natsconn/natstest"
	"github.com/switchyard-llm/switchyard/subjects"
)

// TestEndsBeforeALostConnectionAreMarked: a reply that ended just before
// the adapter's NATS server went away may have lost its end with it, so
// after the reconnect the adapter sends the reply subject a marker one past
// the end. A gateway still waiting sees the gap and fails the request at
// once instead of waiting for its idle timeout; one that had the whole
// reply has forgotten the subject. The adapter also re-announces itself
// (its heartbeat) as soon as it is back.
func TestEndsBeforeALostConnectionAreMarked(t *testing.T) {
	c := natstest.Cluster(t, 3)
	urls := strings.Split(c.URL(), ",")
	connect := func(first int) *nats.Conn {
		ordered := append(append([]string{}, urls[first:]...), urls[:first]...)
		nc, err := nats.Connect(strings.Join(ordered, ","), nats.DontRandomize(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	observer := connect(1)
	js, _ := jetstream.New(observer)
	if _, err := js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: subjects.DefaultBucket, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	// The adapter is on member 0, the observer (the gateway's side) on 1.
	e := &env{t: t, nc: connect(0), eng: newEngine(t)}
	e.eng.handle(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte("data: {\"choices\":[]}\n\ndata: [DONE]\n\n"))
	})
	// Heartbeats an hour apart: after the start, only a re-announce sends one.
	cfg := e.config()
	cfg.HeartbeatEvery = time.Hour
	hbs := make(chan *nats.Msg, 16)
	hbSub, err := observer.ChanSubscribe(subjects.New("").Heartbeat("r-1"), hbs)
	if err != nil {
		t.Fatal(err)
	}
	defer hbSub.Unsubscribe()
	e.start(cfg)

	inbox := nats.NewInbox()
	ch := make(chan *nats.Msg, 64)
	sub, err := observer.ChanSubscribe(inbox, ch)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := observer.Flush(); err != nil {
		t.Fatal(err)
	}
	// The adapter's subscription reaches the observer's server over a
	// route, after the adapter started: a request sent before it would be
	// dropped.
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, testkit.Cond("the observer's server to know the replica's subject", func() bool {
		acc, err := c.Servers()[1].LookupAccount(server.DEFAULT_GLOBAL_ACCOUNT)
		return err == nil && acc.Interest(subjects.New("").Replica("r-1")) > 0
	}))
	if err := observer.PublishMsg(&nats.Msg{Subject: subjects.New("").Replica("r-1"), Reply: inbox, Header: chatHeaders("q-1"), Data: []byte(`{"model":"chat-small","stream":true,"messages":[{"role":"user","content":"hi"}]}`)}); err != nil {
		t.Fatal(err)
	}
	msgs := untilEnd(t, ch)
	end := seq(t, msgs[len(msgs)-1])

	for len(hbs) > 0 {
		<-hbs
	}
	c.Stop(0)
	// The adapter re-announces itself as soon as it is back: deciders that
	// lost its server see its state now, not in an hour.
	select {
	case <-hbs:
	case <-time.After(20 * time.Second):
		t.Fatal("no heartbeat within 20s of the adapter's reconnect")
	}
	select {
	case m := <-ch:
		if got := seq(t, m); got != end+1 || m.Header.Get(subjects.HdrEOS) != "" || m.Header.Get(subjects.HdrError) == "" {
			t.Fatalf("marker: seq %d (the end was %d), headers %v; want seq %d, an Llm-Error and no end", got, end, m.Header, end+1)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no marker within 20s of the adapter's server going away")
	}
}
