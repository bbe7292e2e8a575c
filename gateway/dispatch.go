package gateway

import (
	"strings"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"
)

// dispatcher fans the one wildcard reply subscription out to the requests
// waiting on it. Each copy of an attempt has its own reply subject, so late
// chunks of an abandoned one find no call and are dropped; a message for no
// call goes to orphan (nil: dropped), which cancels what a broker routed
// too late.
type dispatcher struct {
	depth  int
	orphan func(id string, m *nats.Msg)
	mu     sync.RWMutex
	calls  map[string]*call
}

// call is one attempt's mailbox: a bounded channel with a non-blocking
// hand-off, so a slow HTTP client fails its own stream and never stalls the
// subscription that every other request shares.
type call struct {
	ids      []string // the request ids (and reply subjects' last tokens) of its copies
	ch       chan *nats.Msg
	overflow chan struct{}
	once     sync.Once
	// lost is closed when the NATS connection drops while the call waits:
	// its replies may be gone.
	lost     chan struct{}
	lostOnce sync.Once
}

func newDispatcher(depth int, orphan func(id string, m *nats.Msg)) *dispatcher {
	return &dispatcher{depth: depth, orphan: orphan, calls: map[string]*call{}}
}

func (d *dispatcher) register(id string) *call {
	c := &call{ch: make(chan *nats.Msg, d.depth), overflow: make(chan struct{}), lost: make(chan struct{})}
	d.add(c, id)
	return c
}

// add makes the reply subject of id, another copy of c's attempt, c's too.
// Only c's owner adds and unregisters.
func (d *dispatcher) add(c *call, id string) {
	c.ids = append(c.ids, id)
	d.mu.Lock()
	d.calls[id] = c
	d.mu.Unlock()
}

// unregister forgets every copy of c.
func (d *dispatcher) unregister(c *call) {
	d.mu.Lock()
	for _, id := range c.ids {
		delete(d.calls, id)
	}
	d.mu.Unlock()
}

// deliver hands m to the call: the non-blocking hand-off. A call whose
// mailbox is full is told so (overflow), and m is dropped.
func (c *call) deliver(m *nats.Msg) {
	select {
	case c.ch <- m:
	default:
		c.once.Do(func() { close(c.overflow) })
	}
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
		if d.orphan != nil {
			d.orphan(id, m)
		}
		return
	}
	c.deliver(m)
}

// disconnect tells every waiting call that the connection dropped, and
// returns how many reply subjects were waited on.
func (d *dispatcher) disconnect() int {
	d.mu.RLock()
	defer d.mu.RUnlock()
	for _, c := range d.calls {
		c.lostOnce.Do(func() { close(c.lost) })
	}
	return len(d.calls)
}

// retryBudget caps concurrent retries at a share of the active requests
// (Envoy's retry budget), so retries cannot amplify an outage.
type retryBudget struct {
	ratio    float64
	active   atomic.Int64
	retrying atomic.Int64
	copying  atomic.Int64 // attempts sending copies
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

// copyFloor is the least number of attempts that may send copies at once.
const copyFloor = 16

// acquireCopy lets an attempt send copies (leg.sendCopy). Copies have a
// budget of their own, wider than the retries': a copy reaches no replica
// unless a broker routes it, and an attempt that may send none waits out
// the accept timeout at a cut broker. Half the active requests may, and at
// least copyFloor.
func (b *retryBudget) acquireCopy() bool {
	if b.copying.Add(1) > max(b.active.Load()/2, copyFloor) {
		b.copying.Add(-1)
		return false
	}
	return true
}

func (b *retryBudget) releaseCopy() { b.copying.Add(-1) }
