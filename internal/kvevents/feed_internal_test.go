package kvevents

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m, testkit.IgnoreZMQPub()) }

// sink records what a Subscriber delivers.
type sink struct {
	mu        sync.Mutex
	seqs      []uint64
	lost      []string
	gaps, bad int
}

func (s *sink) Batch(seq uint64, _ *Batch, _ int) {
	s.mu.Lock()
	s.seqs = append(s.seqs, seq)
	s.mu.Unlock()
}
func (s *sink) Lost(r string) { s.mu.Lock(); s.lost = append(s.lost, r); s.mu.Unlock() }
func (s *sink) Gap()          { s.mu.Lock(); s.gaps++; s.mu.Unlock() }
func (s *sink) Malformed(error) {
	s.mu.Lock()
	s.bad++
	s.mu.Unlock()
}

func (s *sink) snapshot() ([]uint64, []string, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.seqs), slices.Clone(s.lost), s.gaps
}

func batch() *Batch {
	return &Batch{TS: 1, DPRank: 0, Events: []Event{{Kind: BlockStored, Hashes: []Hash{1}, TokenIDs: []uint32{1, 2}, BlockSize: 2}}}
}

// feed starts a publisher and a subscriber on loopback and publishes until
// the subscriber has seen a first batch (PUB drops what it sends before a
// subscription arrives).
func feed(t *testing.T, pcfg PublisherConfig, bind bool) (*Publisher, *sink) {
	t.Helper()
	var sub *Subscriber
	var err error
	scfg := SubscriberConfig{Topic: "kv", Bind: bind}
	if bind {
		scfg.Endpoint = "tcp://127.0.0.1:0"
		if sub, err = NewSubscriber(scfg); err != nil {
			t.Fatal(err)
		}
		pcfg.Endpoint, pcfg.Dial = sub.Addr(), true
	}
	pcfg.Topic = "kv-events"
	p, err := NewPublisher(pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if !bind {
		scfg.Endpoint, scfg.Replay = p.Addr(), p.ReplayAddr()
		if sub, err = NewSubscriber(scfg); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	s := &sink{}
	go func() { done <- sub.Run(ctx, s) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if seqs, _, _ := s.snapshot(); len(seqs) == 0 {
			p.Publish(batch())
			return fmt.Errorf("no batch yet")
		}
		return nil
	})
	return p, s
}

func TestFeedInOrder(t *testing.T) {
	for _, bind := range []bool{false, true} {
		t.Run(fmt.Sprintf("subscriber binds=%v", bind), func(t *testing.T) {
			p, s := feed(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Format: FormatMap}, bind)
			first, _, _ := s.snapshot()
			for range 5 {
				p.Publish(batch())
			}
			testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
				seqs, lost, gaps := s.snapshot()
				if len(lost) > 0 || gaps > 0 {
					return fmt.Errorf("lost %v, %d gaps", lost, gaps)
				}
				want := first[len(first)-1] + 5
				if seqs[len(seqs)-1] != want {
					return fmt.Errorf("last seq %d, want %d", seqs[len(seqs)-1], want)
				}
				return nil
			})
		})
	}
}

// A batch lost in transit is fetched from the replay socket and delivered
// in order; without a replay socket the gap voids what was known.
func TestFeedGapReplayed(t *testing.T) {
	p, s := feed(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Replay: "tcp://127.0.0.1:0"}, false)
	p.mu.Lock()
	p.holdLocked(batch()) // held for replay, never sent
	p.holdLocked(batch())
	p.mu.Unlock()
	p.Publish(batch())
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		seqs, lost, gaps := s.snapshot()
		if len(lost) > 0 {
			return fmt.Errorf("lost: %v", lost)
		}
		for i := 1; i < len(seqs); i++ {
			if seqs[i] != seqs[i-1]+1 {
				t.Fatalf("out of order: %v", seqs)
			}
		}
		if gaps != 1 || seqs[len(seqs)-1] != p.seq-1 {
			return fmt.Errorf("seqs %v, %d gaps", seqs, gaps)
		}
		return nil
	})
}

func TestFeedGapWithoutReplayIsLost(t *testing.T) {
	p, s := feed(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:0"}, false)
	p.mu.Lock()
	p.holdLocked(batch())
	p.mu.Unlock()
	p.Publish(batch())
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if _, lost, gaps := s.snapshot(); len(lost) != 1 || gaps != 1 {
			return fmt.Errorf("lost %v, %d gaps", lost, gaps)
		}
		return nil
	})
}
