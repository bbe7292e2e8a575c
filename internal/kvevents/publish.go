package kvevents

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/go-zeromq/zmq4"
)

// PublisherConfig configures a Publisher: what an engine's
// --kv-events-config says.
type PublisherConfig struct {
	// Endpoint is the PUB socket's address, e.g. tcp://127.0.0.1:5557.
	Endpoint string
	// Dial connects the PUB socket to a subscriber that binds (an engine
	// that dials out, as llm-d's vLLM simulator does) instead of binding.
	Dial bool
	// Replay is the ROUTER socket's address that resends held batches;
	// empty: none.
	Replay string
	// Topic is the first frame of every message.
	Topic string
	// Format is the batches' encoding (default FormatArray).
	Format Format
	// Buffer is how many batches are held for replay (default 10,000,
	// vLLM's buffer_steps).
	Buffer int
	// Queue bounds the batches waiting to be sent (default 1,000): past it
	// Publish drops the batch, and the sequence gap tells subscribers.
	Queue int
}

// Publisher publishes batches as an engine does: three frames (topic,
// 8-byte big-endian sequence, msgpack batch) on a PUB socket, the last
// Buffer batches resent on request by a ROUTER socket. Its goroutines end
// with Close.
type Publisher struct {
	cfg    PublisherConfig
	pub    zmq4.Socket
	router zmq4.Socket
	cancel context.CancelFunc
	queue  chan []byte
	wg     sync.WaitGroup

	mu     sync.Mutex
	seq    uint64   // the next batch's sequence number
	held   []record // the last Buffer batches, oldest first
	closed bool

	dropped atomic.Int64
}

type record struct {
	seq     uint64
	payload []byte
}

// NewPublisher opens the sockets.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	if cfg.Format == "" {
		cfg.Format = FormatArray
	}
	if _, err := ParseFormat(string(cfg.Format)); err != nil {
		return nil, fmt.Errorf("kvevents: format: %w", err)
	}
	if cfg.Buffer <= 0 {
		cfg.Buffer = 10_000
	}
	if cfg.Queue <= 0 {
		cfg.Queue = 1_000
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{cfg: cfg, cancel: cancel, queue: make(chan []byte, cfg.Queue)}
	p.pub = zmq4.NewPub(ctx)
	var err error
	if cfg.Dial {
		err = p.pub.Dial(cfg.Endpoint)
	} else {
		err = p.pub.Listen(cfg.Endpoint)
	}
	if err != nil {
		p.pub.Close()
		cancel()
		return nil, fmt.Errorf("kvevents: publisher %s: %w", cfg.Endpoint, err)
	}
	if cfg.Replay != "" {
		p.router = zmq4.NewRouter(ctx)
		if err := p.router.Listen(cfg.Replay); err != nil {
			p.pub.Close()
			p.router.Close()
			cancel()
			return nil, fmt.Errorf("kvevents: replay %s: %w", cfg.Replay, err)
		}
		p.wg.Go(p.serveReplay)
	}
	p.wg.Go(func() { p.send(ctx) })
	return p, nil
}

// Addr is the PUB socket's bound address (tcp://host:port), or the
// endpoint it dialed.
func (p *Publisher) Addr() string {
	if a := p.pub.Addr(); a != nil {
		return "tcp://" + a.String()
	}
	return p.cfg.Endpoint
}

// ReplayAddr is the ROUTER socket's address, "" without one.
func (p *Publisher) ReplayAddr() string {
	if p.router == nil {
		return ""
	}
	return "tcp://" + p.router.Addr().String()
}

// Dropped is the number of batches dropped because the send queue was full.
func (p *Publisher) Dropped() int64 { return p.dropped.Load() }

// Publish numbers b, holds it for replay and queues it; it never blocks.
func (p *Publisher) Publish(b *Batch) {
	p.mu.Lock()
	defer p.mu.Unlock()
	seq, payload, ok := p.holdLocked(b)
	if !ok {
		return
	}
	m := make([]byte, 8, 8+len(payload))
	copy(m, SeqFrame(seq))
	select {
	case p.queue <- append(m, payload...):
	default:
		p.dropped.Add(1)
	}
}

// holdLocked numbers b and holds it for replay.
// mu should be held.
func (p *Publisher) holdLocked(b *Batch) (uint64, []byte, bool) {
	if p.closed {
		return 0, nil, false
	}
	payload := AppendBatch(nil, b, p.cfg.Format)
	seq := p.seq
	p.seq++
	if len(p.held) == p.cfg.Buffer {
		p.held = append(p.held[:0], p.held[1:]...)
	}
	p.held = append(p.held, record{seq, payload})
	return seq, payload, true
}

func (p *Publisher) send(ctx context.Context) {
	topic := []byte(p.cfg.Topic)
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-p.queue:
			// A send fails only when the socket is closing.
			_ = p.pub.SendMulti(zmq4.NewMsgFrom(topic, m[:8], m[8:]))
		}
	}
}

// serveReplay answers [identity, "", start_seq] with every held batch from
// start_seq on, as [identity, "", seq, batch], then the end marker.
func (p *Publisher) serveReplay() {
	for {
		m, err := p.router.Recv()
		if err != nil {
			return
		}
		if len(m.Frames) != 3 || len(m.Frames[2]) != 8 {
			continue
		}
		id, start := m.Frames[0], uint64FromBE(m.Frames[2])
		p.mu.Lock()
		var out []record
		for _, r := range p.held {
			if r.seq >= start {
				out = append(out, r)
			}
		}
		p.mu.Unlock()
		for _, r := range out {
			if p.router.SendMulti(zmq4.NewMsgFrom(id, nil, SeqFrame(r.seq), r.payload)) != nil {
				return
			}
		}
		if p.router.SendMulti(zmq4.NewMsgFrom(id, nil, SeqFrame(EndSeq), nil)) != nil {
			return
		}
	}
}

// Close closes the sockets and waits for the publisher's goroutines. One
// goroutine of zmq4's PUB socket outlives it (testkit.IgnoreZMQPub).
func (p *Publisher) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.cancel()
	err := p.pub.Close()
	if p.router != nil {
		err = errors.Join(err, p.router.Close())
	}
	p.wg.Wait()
	return err
}

func uint64FromBE(b []byte) uint64 {
	var v uint64
	for _, c := range b {
		v = v<<8 | uint64(c)
	}
	return v
}
