package kvevents

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
)

// SubscriberConfig configures a Subscriber: the adapter's --kv-events*
// flags.
type SubscriberConfig struct {
	// Endpoint is the engine's PUB address to connect to (vLLM binds), or,
	// with Bind, the address to bind for an engine that dials out.
	Endpoint string
	Bind     bool
	// Topic is a topic prefix to subscribe to; empty: every topic.
	Topic string
	// Replay is the engine's ROUTER address that resends missed batches;
	// empty: a gap cannot be filled and voids what was known.
	Replay string
	// ReplayTimeout bounds one replay (default 2s).
	ReplayTimeout time.Duration
}

// Sink receives what a Subscriber reads, from the Subscriber's goroutine,
// in sequence order.
type Sink interface {
	// Batch is the next batch; unknown counts events of types the decoder
	// skipped.
	Batch(seq uint64, b *Batch, unknown int)
	// Lost says that what was known of the engine's cache is void: batches
	// were missed and could not be replayed, or the engine restarted (its
	// sequence went back).
	Lost(reason string)
	// Gap counts a sequence gap, replayed or not.
	Gap()
	// Malformed counts a message dropped undecoded.
	Malformed(err error)
}

// Subscriber reads an engine's event feed. Create it with NewSubscriber;
// Run reads until its context ends.
type Subscriber struct {
	cfg  SubscriberConfig
	ctx  context.Context
	stop context.CancelFunc
	sub  zmq4.Socket
	once sync.Once // closes sub

	expected uint64 // the next sequence number
	started  bool   // a batch was seen
}

// NewSubscriber opens the SUB socket; with Bind it listens at once, else
// Run connects (and reconnects) to the engine.
func NewSubscriber(cfg SubscriberConfig) (*Subscriber, error) {
	if cfg.ReplayTimeout <= 0 {
		cfg.ReplayTimeout = 2 * time.Second
	}
	ctx, stop := context.WithCancel(context.Background())
	s := &Subscriber{cfg: cfg, ctx: ctx, stop: stop}
	opts := []zmq4.Option{zmq4.WithDialerMaxRetries(-1), zmq4.WithDialerRetry(200 * time.Millisecond)}
	if !cfg.Bind {
		// Reconnecting redials the socket's endpoint: only a socket that
		// dialed has one to redial.
		opts = append(opts, zmq4.WithAutomaticReconnect(true))
	}
	s.sub = zmq4.NewSub(ctx, opts...)
	if err := s.sub.SetOption(zmq4.OptionSubscribe, cfg.Topic); err != nil {
		stop()
		return nil, fmt.Errorf("kvevents: subscribe: %w", err)
	}
	if cfg.Bind {
		if err := s.sub.Listen(cfg.Endpoint); err != nil {
			s.sub.Close()
			stop()
			return nil, fmt.Errorf("kvevents: bind %s: %w", cfg.Endpoint, err)
		}
	}
	return s, nil
}

// Addr is the bound address (tcp://host:port) with Bind, else the endpoint.
func (s *Subscriber) Addr() string {
	if a := s.sub.Addr(); a != nil {
		return "tcp://" + a.String()
	}
	return s.cfg.Endpoint
}

// Close closes the socket: what Run does when it ends, for a Subscriber
// that is not run. It may be called more than once.
func (s *Subscriber) Close() {
	s.once.Do(func() {
		s.stop()
		_ = s.sub.Close()
	})
}

// Run reads batches into sink until ctx ends, then closes the socket.
func (s *Subscriber) Run(ctx context.Context, sink Sink) error {
	defer s.Close()
	go func() {
		select {
		case <-ctx.Done():
			s.stop()
		case <-s.ctx.Done():
		}
	}()
	if !s.cfg.Bind {
		// Dial retries until the engine is up or ctx ends.
		if err := s.sub.Dial(s.cfg.Endpoint); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("kvevents: connect %s: %w", s.cfg.Endpoint, err)
		}
	}
	for {
		m, err := s.sub.Recv()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, context.Canceled) {
				return nil
			}
			// A dropped connection: the socket reconnects; what was
			// missed meanwhile shows as a gap.
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		msg, unknown, err := DecodeMessage(m.Frames)
		if err != nil {
			sink.Malformed(err)
			continue
		}
		s.deliver(ctx, msg, unknown, sink)
	}
}

// deliver hands msg to sink in sequence, filling a gap from the replay
// socket when it can.
func (s *Subscriber) deliver(ctx context.Context, msg Message, unknown int, sink Sink) {
	switch {
	case !s.started:
	case msg.Seq < s.expected:
		sink.Lost(fmt.Sprintf("the engine's sequence went back from %d to %d (restart)", s.expected, msg.Seq))
	case msg.Seq > s.expected:
		sink.Gap()
		if !s.replay(ctx, s.expected, msg.Seq, sink) {
			sink.Lost(fmt.Sprintf("batches %d to %d missed and not replayed", s.expected, msg.Seq-1))
		}
	}
	s.started, s.expected = true, msg.Seq+1
	sink.Batch(msg.Seq, &msg.Batch, unknown)
}

// replay asks the replay socket for batches from..to-1 and delivers them;
// false when it cannot (no socket, a timeout, the engine no longer holds
// them).
func (s *Subscriber) replay(ctx context.Context, from, to uint64, sink Sink) bool {
	if s.cfg.Replay == "" {
		return false
	}
	rctx, cancel := context.WithTimeout(ctx, s.cfg.ReplayTimeout)
	defer cancel()
	d := zmq4.NewDealer(rctx)
	defer d.Close()
	if d.Dial(s.cfg.Replay) != nil {
		return false
	}
	if d.SendMulti(zmq4.NewMsgFrom(nil, SeqFrame(from))) != nil {
		return false
	}
	type held struct {
		seq     uint64
		b       Batch
		unknown int
	}
	var got []held
	next := from
	for {
		m, err := d.Recv()
		if err != nil {
			return false
		}
		f := m.Frames
		if len(f) > 0 && len(f[0]) == 0 {
			f = f[1:] // the delimiter ROUTER echoes back
		}
		if len(f) != 2 || len(f[0]) != 8 {
			sink.Malformed(fmt.Errorf("%w: replay reply of %d frames", ErrMalformed, len(f)))
			return false
		}
		seq := uint64FromBE(f[0])
		if seq == EndSeq {
			break
		}
		if seq < next || seq >= to {
			continue
		}
		if seq > next {
			return false // the engine no longer holds what was missed
		}
		b, unknown, err := DecodeBatch(f[1])
		if err != nil {
			sink.Malformed(err)
			return false
		}
		got = append(got, held{seq, b, unknown})
		next++
	}
	if next != to {
		return false
	}
	for i := range got {
		sink.Batch(got[i].seq, &got[i].b, got[i].unknown)
	}
	return true
}
