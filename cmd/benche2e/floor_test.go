package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/internal/stages"
	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// sortedLines is a shape's header lines as a multiset.
func sortedLines(s stages.MsgShape) [][2]int {
	l := slices.Clone(s.Header)
	slices.SortFunc(l, func(a, b [2]int) int {
		if a[0] != b[0] {
			return a[0] - b[0]
		}
		return a[1] - b[1]
	})
	return l
}

func sameShape(a, b stages.MsgShape) bool {
	return a.Body == b.Body && slices.Equal(sortedLines(a), sortedLines(b))
}

// The floor sends what a Switchyard request sent: the stack records the
// legs of a real request (its request to the replica, the replies the
// gateway took), and the floor, on the same NATS server under a gateway's
// and an adapter's identities, publishes messages of exactly those shapes
// in one round, as a tap on the bus sees them.
func TestFloorSendsTheLegsOfASwitchyardRequest(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rec := stages.New(1)
	st, err := devstack.Start(ctx, devstack.Config{
		Listen: "127.0.0.1:0", NATSListen: "127.0.0.1:-1", DataDir: t.TempDir(), Stages: rec,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("stack stopped with errors: %v", err)
		}
	})
	if err := st.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	body := promptBody("chat-small", 8<<10, 4, true)
	resp, err := http.Post(st.GatewayURL()+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("chat answered %d: %s", resp.StatusCode, answer)
	}

	// The stack's control serves the access and the legs.
	mux := http.NewServeMux()
	floorHandlers(mux, st, rec)
	ctl := httptest.NewServer(mux)
	defer ctl.Close()
	b := &bench{ctlURL: ctl.URL}
	var legs stages.Legs
	if err := b.getJSON(ctx, ctl.URL+"/legs", &legs); err != nil {
		t.Fatal(err)
	}
	if legs.Request.Body != len(body) || len(legs.Request.Header) == 0 {
		t.Fatalf("request leg %+v: want a body of %d bytes with headers", legs.Request, len(body))
	}
	if len(legs.Replies) < 3 { // head, data, end at least, for a stream
		t.Fatalf("%d replies recorded, want the head, the data and the end", len(legs.Replies))
	}
	var a floorAccess
	if err := b.getJSON(ctx, ctl.URL+"/floor", &a); err != nil {
		t.Fatal(err)
	}
	f, err := newFloor(a)
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	msgs, err := build(legs)
	if err != nil {
		t.Fatal(err)
	}
	f.msgs.Store(msgs)

	// The tap: the replies as a second connection under the client's
	// identity sees them, the request as a second subscription of the
	// responder's connection does.
	tapNC, err := nats.Connect(a.NATS, nats.UserCredentials(a.ClientCreds))
	if err != nil {
		t.Fatal(err)
	}
	defer tapNC.Close()
	var mu sync.Mutex
	var seen []stages.MsgShape
	sub, err := tapNC.Subscribe(f.replyPfx+"once.*", func(m *nats.Msg) {
		mu.Lock()
		seen = append(seen, stages.ShapeOf(m))
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	reqSeen := make(chan stages.MsgShape, 1)
	rsub, err := f.responder.Subscribe(f.subject, func(m *nats.Msg) {
		select {
		case reqSeen <- stages.ShapeOf(m):
		default: // the first request is the one compared
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rsub.Unsubscribe()
	if err := errors.Join(tapNC.Flush(), f.responder.Flush()); err != nil {
		t.Fatal(err)
	}
	d, err := f.once()
	if err != nil {
		t.Fatal(err)
	}
	if d <= 0 || d > 5*time.Second {
		t.Fatalf("round of %s", d)
	}
	if got := <-reqSeen; !sameShape(got, legs.Request) {
		t.Errorf("the floor's request %+v, Switchyard's %+v", got, legs.Request)
	}
	// The tap may take the last reply after the floor's client did.
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(seen) < len(legs.Replies) {
			return fmt.Errorf("the tap saw %d of %d replies", len(seen), len(legs.Replies))
		}
		return nil
	})
	mu.Lock()
	if len(seen) != len(legs.Replies) {
		t.Fatalf("the floor sent %d replies, Switchyard %d", len(seen), len(legs.Replies))
	}
	for i := range seen {
		if !sameShape(seen[i], legs.Replies[i]) {
			t.Errorf("reply %d: the floor's %+v, Switchyard's %+v", i, seen[i], legs.Replies[i])
		}
	}
	mu.Unlock()

	// The rounds of a fixed-rate run, many under way at once on the
	// shared subscription, each take their own replies.
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Go(func() {
			if _, err := f.round(); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	f.mu.Lock()
	left := len(f.waiting)
	f.mu.Unlock()
	if left != 0 {
		t.Errorf("%d rounds still registered after the run", left)
	}
}

// Shapes out of bounds are refused, not sent: the floor takes its legs
// over HTTP.
func TestFloorRefusesShapesOutOfBounds(t *testing.T) {
	ok := stages.MsgShape{Header: [][2]int{{6, 3}}, Body: 10}
	for name, l := range map[string]stages.Legs{
		"no reply":          {Request: ok},
		"a body too large":  {Request: stages.MsgShape{Body: maxFloorBody + 1}, Replies: []stages.MsgShape{ok}},
		"a negative body":   {Request: ok, Replies: []stages.MsgShape{{Body: -1}}},
		"an empty key":      {Request: stages.MsgShape{Header: [][2]int{{0, 3}}}, Replies: []stages.MsgShape{ok}},
		"too many headers":  {Request: stages.MsgShape{Header: make([][2]int, maxFloorHeaders+1)}, Replies: []stages.MsgShape{ok}},
		"too many replies":  {Request: ok, Replies: make([]stages.MsgShape, maxFloorReplies+1)},
		"a round too large": {Request: stages.MsgShape{Body: maxFloorBody}, Replies: []stages.MsgShape{{Body: maxFloorBody}, {Body: maxFloorBody}, {Body: maxFloorBody}, {Body: 1}}},
		"a value too large": {Request: stages.MsgShape{Header: [][2]int{{3, 1 << 20}}}, Replies: []stages.MsgShape{ok}},
	} {
		if _, err := build(l); err == nil {
			t.Errorf("%s: built", name)
		}
	}
	m, err := build(stages.Legs{Request: ok, Replies: []stages.MsgShape{ok, {Body: 0}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := stages.ShapeOf(m.request); !sameShape(got, ok) {
		t.Errorf("built %+v from %+v", got, ok)
	}
}

// Keys of one length stay distinct while they can.
func TestHeaderKeysAreDistinct(t *testing.T) {
	seen := map[string]bool{}
	for i := range 40 {
		k := headerKey(i, 12)
		if len(k) != 12 || seen[k] {
			t.Fatalf("key %d %q", i, k)
		}
		seen[k] = true
	}
}
