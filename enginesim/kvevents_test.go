package enginesim_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/enginesim"
	"github.com/switchyard-llm/switchyard/internal/kvevents"
	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// eventLog collects what a subscriber reads from the engine's feed.
type eventLog struct {
	mu     sync.Mutex
	events []kvevents.Event
	lost   int
}

func (l *eventLog) Batch(_ uint64, b *kvevents.Batch, _ int) {
	l.mu.Lock()
	l.events = append(l.events, b.Events...)
	l.mu.Unlock()
}
func (l *eventLog) Lost(string)     { l.mu.Lock(); l.lost++; l.mu.Unlock() }
func (l *eventLog) Gap()            {}
func (l *eventLog) Malformed(error) {}

func (l *eventLog) snapshot() []kvevents.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events)
}

func userChat(text string) string {
	b, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 1, "messages": []map[string]string{{"role": "user", "content": text}}})
	return string(b)
}

// The engine's feed tells the blocks a prompt stored, with the token ids
// /tokenize gives for it, and their eviction once other prompts fill the
// cache: what vLLM publishes, in either encoding.
func TestKVEventsTellStoredAndEvicted(t *testing.T) {
	for _, format := range []kvevents.Format{kvevents.FormatArray, kvevents.FormatMap} {
		t.Run(string(format), func(t *testing.T) {
			srv := enginesim.NewServer(enginesim.ServerConfig{Engine: enginesim.Config{Model: "m", KVBlocks: 64}, Speed: 50})
			pub, err := srv.PublishKVEvents(kvevents.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Replay: "tcp://127.0.0.1:0", Topic: "kv-events", Format: format})
			if err != nil {
				t.Fatal(err)
			}
			hs := serve(t, srv)
			sub, err := kvevents.NewSubscriber(kvevents.SubscriberConfig{Endpoint: pub.Addr(), Replay: pub.ReplayAddr()})
			if err != nil {
				t.Fatal(err)
			}
			log := &eventLog{}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- sub.Run(ctx, log) }()
			t.Cleanup(func() { cancel(); <-done })

			// PUB drops what it sends before the subscription arrives.
			n := 0
			testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
				if len(log.snapshot()) > 0 {
					return nil
				}
				n++
				post(t, hs, "/v1/chat/completions", userChat(fmt.Sprintf("warm-up %d %s", n, strings.Repeat("w", 80)))).Body.Close()
				return fmt.Errorf("no event yet")
			})

			p := strings.Repeat("the shared system prompt of P. ", 24) // 10+ blocks of 16 tokens
			resp := post(t, hs, "/v1/chat/completions", userChat(p))
			resp.Body.Close()
			tok := readJSON(t, post(t, hs, "/tokenize", `{"model":"m","messages":[{"role":"user","content":`+jsonString(p)+`}]}`).Body)
			var ids []uint32
			for _, v := range tok["tokens"].([]any) {
				ids = append(ids, uint32(v.(float64)))
			}
			if int(tok["count"].(float64)) != len(ids) || len(ids) < 160 {
				t.Fatalf("/tokenize = %v", tok)
			}
			var stored kvevents.Event
			testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
				for _, ev := range log.snapshot() {
					if ev.Kind == kvevents.BlockStored && !ev.HasParent && len(ev.TokenIDs) >= 160 && slices.Equal(ev.TokenIDs, ids[:len(ev.TokenIDs)]) {
						stored = ev
						return nil
					}
				}
				return fmt.Errorf("no BlockStored with P's token ids")
			})
			if stored.BlockSize != 16 || len(stored.TokenIDs) != 16*len(stored.Hashes) || len(stored.Hashes) != len(ids)/16 {
				t.Fatalf("stored %d hashes of %d tokens, block size %d; prompt of %d tokens", len(stored.Hashes), len(stored.TokenIDs), stored.BlockSize, len(ids))
			}

			// Other prompts fill the 64 blocks: P's are evicted.
			for i := range 8 {
				post(t, hs, "/v1/chat/completions", userChat(fmt.Sprintf("other prompt %d %s", i, strings.Repeat("x", 640)))).Body.Close()
			}
			testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
				removed := map[kvevents.Hash]bool{}
				for _, ev := range log.snapshot() {
					if ev.Kind == kvevents.BlockRemoved {
						for _, h := range ev.Hashes {
							removed[h] = true
						}
					}
				}
				for _, h := range stored.Hashes {
					if !removed[h] {
						return fmt.Errorf("block %x of P not removed", h)
					}
				}
				return nil
			})
		})
	}
}

func jsonString(s string) string { b, _ := json.Marshal(s); return string(b) }

// serve runs srv with an httptest front until the test ends.
func serve(t *testing.T, srv *enginesim.Server) *httptest.Server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		hs.Close()
	})
	return hs
}
