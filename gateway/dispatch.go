package gateway

import (
	"strings"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"
)

// dispatcher fans the one wildcard reply subscription out to the requests
// waiting on it. Each attempt has its own reply subject, so late chunks of an
// abandoned attempt find no call and are dropped.
type dispatcher struct {
	depth int
	mu    sync.RWMutex
	calls map[string]*call
}

// call is one attempt's mailbox: a bounded channel with a non-blocking
// hand-off, so a slow HTTP client fails its own stream and never stalls the
// subscription that every other request shares.
type call struct {
	reply    string // the attempt's reply subject
	ch       chan *nats.Msg
	overflow chan struct{}
	once     sync.Once
	// lost is closed when the NATS connection drops while the call waits:
	// its replies may be gone.
	lost     chan struct{}
	lostOnce sync.Once
}

func newDispatcher(depth int) *dispatcher {
	return &dispatcher{depth: depth, calls: map[string]*call{}}
}

func (d *dispatcher) register(id string) *call {
	c := &call{ch: make(chan *nats.Msg, d.depth), overflow: make(chan struct{}), lost: make(chan struct{})}
	d.mu.Lock()
	d.calls[id] = c
	d.mu.Unlock()
	return c
}

func (d *dispatcher) unregister(id string) {
	d.mu.Lock()
	delete(d.calls, id)
	d.mu.Unlock()
}

func (d *dispatcher) onMsg(m *nats.Msg) {
	id := m.Subject
	if i := strings.LastIndexByte(id, '.'); i >= 0 {
		id = id[i+1:]
	}
	d.mu.RLock()
	c := d.calls[id]
	d.mu.RUnlock()
	if c == nil {
		return
	}
	select {
	case c.ch <- m:
	default:
		c.once.Do(func() { close(c.overflow) })
	}
}

// disconnect tells every waiting call that the connection dropped, and
// returns how many there were.
func (d *dispatcher) disconnect() int {
	d.mu.RLock()
	defer d.mu.RUnlock()
	for _, c := range d.calls {
		c.lostOnce.Do(func() { close(c.lost) })
	}
	return len(d.calls)
}

func (d *dispatcher) active() int {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return len(d.calls)
}

// retryBudget caps concurrent retries at a share of the active requests
// (Envoy's retry budget), so retries cannot amplify an outage.
type retryBudget struct {
	ratio    float64
	active   atomic.Int64
	retrying atomic.Int64
}

func (b *retryBudget) acquire() bool {
	limit := int64(float64(b.active.Load()) * b.ratio)
	if limit < 3 {
		limit = 3
	}
	if b.retrying.Add(1) > limit {
		b.retrying.Add(-1)
		return false
	}
	return true
}

func (b *retryBudget) release() { b.retrying.Add(-1) }
