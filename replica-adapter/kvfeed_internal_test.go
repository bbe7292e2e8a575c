package adapter

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/switchyard-llm/switchyard/features"
	"github.com/switchyard-llm/switchyard/internal/kvevents"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/natsconn/natstest"
	"github.com/switchyard-llm/switchyard/subjects"
)

// feedAdapter is an adapter with a KV-event feed that binds addr, built
// by New and never run.
func feedAdapter(t *testing.T, addr string) *Adapter {
	t.Helper()
	return feedAdapterOf(t, addr, "http://127.0.0.1:1")
}

func feedAdapterOf(t *testing.T, addr, engine string) *Adapter {
	t.Helper()
	_, url := natstest.Start(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	a, err := New(nc, Config{Replica: "r-0", Model: "m", Version: "v1", EngineURL: engine, KVEventsBind: addr})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// chatBody is a chat request whose messages hold msg and whose other
// members hold pad bytes learning has no use for.
func chatBody(msg string, pad int) []byte {
	b, _ := json.Marshal(map[string]any{
		"model":    "m",
		"messages": []map[string]string{{"role": "user", "content": msg}},
		"metadata": map[string]string{"pad": strings.Repeat("x", pad)},
	})
	return b
}

func prefixOf(prompt string) string {
	return features.FormatPrefixHeader(features.AppendPrefix(nil, []byte(prompt), 16, 64))
}

func TestLearnQueueHoldsOnlyTheTokenSource(t *testing.T) {
	a := feedAdapter(t, "tcp://127.0.0.1:0")
	f := a.kv
	msg := strings.Repeat("a question about the weather, ", 40)
	body := chatBody(msg, 1<<20)
	f.learn(subjects.EndpointChat, prefixOf("user: "+msg), body)
	if len(f.learnCh) != 1 {
		t.Fatalf("%d requests queued, want 1", len(f.learnCh))
	}
	r := <-f.learnCh
	want, _ := json.Marshal([]map[string]string{{"role": "user", "content": msg}})
	if !bytes.Equal(r.source, want) {
		t.Errorf("queued %q, want only the messages %q", r.source, want)
	}
	if n := f.learnBytes.Load(); n != r.size() || n > int64(len(want))+1024 {
		t.Errorf("the queue counts %d bytes for a %d-byte body, want its token source's %d", n, len(body), r.size())
	}
	// What is learned from it is what the whole body says.
	whole, err := features.ParseRequest(subjects.EndpointChat, body)
	if err != nil {
		t.Fatal(err)
	}
	kept, err := features.ParseRequest(subjects.EndpointChat, r.body("m"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(whole.Prompt, kept.Prompt) {
		t.Errorf("prompt from the queued source %q, from the body %q", kept.Prompt, whole.Prompt)
	}
}

func TestLearnQueueIsBoundedInBytesAndCount(t *testing.T) {
	a := feedAdapter(t, "tcp://127.0.0.1:0")
	f := a.kv
	dropped := func() int { return int(testutil.ToFloat64(a.metrics.kvLearnDropped)) }

	// 1 MiB prompts: the byte bound is reached long before the count.
	big := strings.Repeat("y", 1<<20)
	const sent = 40
	for range sent {
		f.learn(subjects.EndpointChat, prefixOf("user: "+big), chatBody(big, 0))
	}
	queued := len(f.learnCh)
	if n := f.learnBytes.Load(); n > learnQueueBytes {
		t.Errorf("the learn queue holds %d bytes, bound %d", n, learnQueueBytes)
	}
	if queued == 0 || queued >= sent || dropped() != sent-queued {
		t.Errorf("%d of %d large requests queued, %d counted dropped", queued, sent, dropped())
	}
	// Draining gives the bytes back.
	for range queued {
		r := <-f.learnCh
		f.learnBytes.Add(-r.size())
	}
	if n := f.learnBytes.Load(); n != 0 {
		t.Errorf("%d bytes counted after draining the queue", n)
	}

	// Small requests stop at the count.
	before := dropped()
	for range learnQueue + 10 {
		f.learn(subjects.EndpointCompletions, prefixOf("hello world, this is a prompt"), []byte(`{"model":"m","prompt":"hello world, this is a prompt"}`))
	}
	if len(f.learnCh) != learnQueue || dropped()-before != 10 {
		t.Errorf("%d small requests queued (bound %d), %d counted dropped, want 10", len(f.learnCh), learnQueue, dropped()-before)
	}
}

func TestTokenSource(t *testing.T) {
	for _, c := range []struct {
		endpoint, body, want string
	}{
		{subjects.EndpointChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[]}`, `[{"role":"user","content":"hi"}]`},
		{subjects.EndpointCompletions, ` {"prompt": "once upon", "max_tokens": 3}`, `"once upon"`},
		// The last of duplicates, matched as encoding/json matches keys.
		{subjects.EndpointChat, `{"messages":[1],"Messages":[{"role":"user","content":"x"}]}`, `[{"role":"user","content":"x"}]`},
		{subjects.EndpointChat, `{"prompt":"no messages"}`, ``},
		{subjects.EndpointChat, `{"messages":null}`, ``},
		{subjects.EndpointChat, `{"messages":[`, ``},
	} {
		if got := tokenSource(c.endpoint, []byte(c.body)); string(got) != c.want {
			t.Errorf("tokenSource(%s, %s) = %q, want %q", c.endpoint, c.body, got, c.want)
		}
	}
}

// A feed that is built but not run holds no socket: its bind address is
// free until the adapter runs (open), and free again once it closes.
func TestKVFeedBindsOnlyWhenRun(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	a := feedAdapter(t, "tcp://"+addr)
	free := func() bool {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return false
		}
		l.Close()
		return true
	}
	if !free() {
		t.Fatalf("%s is taken by an adapter that was built but not run", addr)
	}
	if err := a.kv.open(); err != nil {
		t.Fatal(err)
	}
	if free() {
		t.Errorf("%s is free after the feed opened", addr)
	}
	a.kv.close()
	if !free() {
		t.Errorf("%s is still taken after the feed closed", addr)
	}
}

// A block evicted and stored again holds its text keys again: a request
// learned while the block was cached may wait in the engine's queue while
// the block is evicted, and stores it again when it runs.
func TestKVFeedKeysSurviveAnEvictionOfTheirBlock(t *testing.T) {
	ids := make([]uint32, 64)
	for i := range ids {
		ids[i] = uint32(1000 + i)
	}
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/tokenize" {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"tokens": ids, "count": len(ids)})
	}))
	defer eng.Close()
	a := feedAdapterOf(t, "tcp://127.0.0.1:0", eng.URL)
	f := a.kv
	body := chatBody(strings.Repeat("the shared system prompt. ", 10), 0)
	req, err := features.ParseRequest(subjects.EndpointChat, body)
	if err != nil {
		t.Fatal(err)
	}
	keys := features.AppendPrefix(nil, req.Prompt, 16, 64)
	held := func() map[uint64]bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		out := map[uint64]bool{}
		for k := range f.keyRef {
			out[k] = true
		}
		return out
	}
	stored := func(hashes []kvevents.Hash, parent kvevents.Hash, tokens []uint32) {
		f.Batch(0, &kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockStored, Hashes: hashes, Parent: parent, HasParent: parent != 0, TokenIDs: tokens, BlockSize: 16}}}, 0)
	}
	stored([]kvevents.Hash{101, 102, 103, 104}, 0, ids)
	f.learn(subjects.EndpointChat, features.FormatPrefixHeader(keys), body)
	if err := f.learnOne(context.Background(), <-f.learnCh); err != nil {
		t.Fatal(err)
	}
	all := held()
	if len(all) != len(keys) {
		t.Fatalf("%d of %d keys held with every block stored", len(all), len(keys))
	}
	// The last block goes: the keys it ended go with it.
	f.Batch(0, &kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockRemoved, Hashes: []kvevents.Hash{104}}}}, 0)
	after := held()
	if len(after) == 0 || len(after) == len(keys) {
		t.Fatalf("%d of %d keys held after the last block was evicted", len(after), len(keys))
	}
	// The queued request runs and stores it again.
	stored([]kvevents.Hash{204}, 103, ids[48:])
	if got := held(); len(got) != len(keys) {
		t.Errorf("%d of %d keys held after the block was stored again", len(got), len(keys))
	}
}

// Any identity that may publish llm.kvsync could ask every adapter to
// resend every key in a loop: a flood of asks costs an adapter at most one
// resend a second, each ask is counted, and a decider that starts right
// after a resend still has every key within 2 s.
func TestKVSyncFloodResendsOnceASecond(t *testing.T) {
	_, url := natstest.Start(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	a, err := New(nc, Config{Replica: "r-0", Model: "m", Version: "v1", EngineURL: "http://127.0.0.1:1", KVEventsBind: "tcp://127.0.0.1:0", KVBlocks: 1024})
	if err != nil {
		t.Fatal(err)
	}
	f := a.kv
	const held = 100
	f.mu.Lock()
	for k := range uint64(held) {
		f.holdLocked(k + 1)
	}
	f.mu.Unlock()
	updates, err := nc.SubscribeSync(a.subj.KV("r-0"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.open(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	// next reads updates until one that starts over (Reset), and every key
	// stored from it on, within wait.
	next := func(sub *nats.Subscription, wait time.Duration) (subjects.KVUpdate, int) {
		t.Helper()
		deadline := time.Now().Add(wait)
		var first subjects.KVUpdate
		keys := 0
		for keys < held {
			m, err := sub.NextMsg(time.Until(deadline))
			if err != nil {
				t.Fatalf("%d of %d keys within %v: %v", keys, held, wait, err)
			}
			var u subjects.KVUpdate
			if err := json.Unmarshal(m.Data, &u); err != nil {
				t.Fatal(err)
			}
			if u.Reset {
				first, keys = u, 0
			}
			keys += len(u.Stored)
		}
		return first, keys
	}
	if u, _ := next(updates, 5*time.Second); u.Resend {
		t.Fatalf("the first update is a resend: %+v", u)
	}
	count := func(outcome string) int { return int(testutil.ToFloat64(a.metrics.kvSyncs.WithLabelValues(outcome))) }

	// Two seconds of asks, as fast as one connection sends them.
	flood, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(flood.Close)
	start := time.Now()
	asks := 0
	for time.Since(start) < 2*time.Second {
		if err := flood.Publish(a.subj.KVSync(), nil); err != nil {
			t.Fatal(err)
		}
		if asks++; asks%64 == 0 {
			if err := flood.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
	testkit.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if got := count(kvSyncResent) + count(kvSyncCoalesced); got != asks {
			return fmt.Errorf("%d of %d asks counted", got, asks)
		}
		return nil
	})
	// The asks of the last second share the resend at its end.
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.resendDue || f.reset {
			return errors.New("a resend is still due")
		}
		return nil
	})
	elapsed := time.Since(start)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	resends := 0
	for {
		m, err := updates.NextMsg(200 * time.Millisecond)
		if err != nil {
			break
		}
		var u subjects.KVUpdate
		if json.Unmarshal(m.Data, &u) == nil && u.Resend {
			resends++
		}
	}
	// One at the first ask, then one at the end of every second that had
	// asks: in elapsed, at most elapsed/kvResendEvery + 2.
	bound := int(elapsed/kvResendEvery) + 2
	if asks < 100 || resends == 0 || resends > bound || resends != count(kvSyncResent) {
		t.Fatalf("%d asks in %v made %d resends (counted %d, coalesced %d), want 1 to %d",
			asks, elapsed, resends, count(kvSyncResent), count(kvSyncCoalesced), bound)
	}
	t.Logf("%d asks in %v: %d resends", asks, elapsed, resends)

	// A decider that starts right after a resend has every key within 2 s.
	fresh, err := nc.SubscribeSync(a.subj.KV("r-0"))
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish(a.subj.KVSync(), nil); err != nil {
		t.Fatal(err)
	}
	if u, keys := next(fresh, 2*time.Second); !u.Resend || keys != held {
		t.Errorf("a late decider got %d keys from %+v", keys, u)
	}
}

// A feed refused now and then is failing between its refusals too: the
// batches that decode meanwhile (a removal, say) do not clear the mark,
// which holds for kvRefusedHold after the last refusal.
func TestARefusedFeedStaysFailingBetweenRefusals(t *testing.T) {
	f := feedAdapter(t, "tcp://127.0.0.1:0").kv
	_, _, err := kvevents.DecodeBatch([]byte{0xc1})
	if err == nil {
		t.Fatal("0xc1 decoded")
	}
	f.Malformed(err)
	f.Batch(1, &kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockRemoved, Hashes: []kvevents.Hash{7}}}}, 0)
	if _, refused := f.state(); refused != kvevents.RefusedShape {
		t.Fatalf("refused %q after a decoded batch, want %q until the hold passes", refused, kvevents.RefusedShape)
	}
	f.mu.Lock()
	f.refusedAt = time.Now().Add(-kvRefusedHold)
	f.mu.Unlock()
	if _, refused := f.state(); refused != "" {
		t.Fatalf("refused %q %v after the last refusal, want healthy", refused, kvRefusedHold)
	}
}
