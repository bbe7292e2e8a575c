package testkit

import (
	"bytes"
	"net"
	"sync"
	"testing"
	"time"
)

// Relay carries TCP connections to a server (a NATS server) and can go
// silent: cut, it stops carrying bytes either way and closes nothing, as a
// network link set down does; healed, it carries on with what it held. It
// can also be slow one way (Delay), as a long link is.
type Relay struct {
	ln     net.Listener
	to     string
	mu     sync.Mutex
	healed chan struct{} // nil while the link carries; closed by heal
	down   bool          // every connection closed, new ones refused: Down
	delay  time.Duration // what the server sends is held this long: Delay
	conns  []net.Conn
	wg     sync.WaitGroup
}

// chunk is what one read took from a connection, and when it is due at
// the other end.
type chunk struct {
	data []byte
	due  time.Time
}

// NewRelay listens on a loopback port and carries each connection to to,
// until the test ends.
func NewRelay(t testing.TB, to string) *Relay {
	t.Helper()
	r := &Relay{ln: Listen(t), to: to}
	r.wg.Go(r.accept)
	t.Cleanup(func() {
		r.Heal()
		_ = r.ln.Close()
		r.mu.Lock()
		for _, c := range r.conns {
			_ = c.Close()
		}
		r.mu.Unlock()
		r.wg.Wait()
	})
	return r
}

// Addr is the relay's address, host:port.
func (r *Relay) Addr() string { return r.ln.Addr().String() }

// Retarget carries the connections accepted from now on to to: a relay
// made before the server it fronts (whose port is its own choice) is
// pointed at it once it runs.
func (r *Relay) Retarget(to string) {
	r.mu.Lock()
	r.to = to
	r.mu.Unlock()
}

// URL is the relay's address as a NATS URL.
func (r *Relay) URL() string { return "nats://" + r.ln.Addr().String() }

func (r *Relay) accept() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.mu.Lock()
		to, down := r.to, r.down
		r.mu.Unlock()
		if down {
			_ = c.Close()
			continue
		}
		s, err := net.Dial("tcp", to)
		if err != nil {
			_ = c.Close()
			continue
		}
		r.mu.Lock()
		r.conns = append(r.conns, c, s)
		r.mu.Unlock()
		r.wg.Go(func() { r.pipe(s, c, false) })
		r.wg.Go(func() { r.pipe(c, s, true) })
	}
}

// pipe copies src to dst, holding each read while the link is cut, and
// what goes to the client (toClient) for the relay's delay.
func (r *Relay) pipe(dst, src net.Conn, toClient bool) {
	chunks := make(chan chunk, 64)
	r.wg.Go(func() { deliver(dst, src, chunks) })
	defer close(chunks)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		r.mu.Lock()
		healed, delay := r.healed, r.delay
		r.mu.Unlock()
		if healed != nil {
			<-healed
		}
		if !toClient {
			delay = 0
		}
		if n > 0 {
			chunks <- chunk{data: bytes.Clone(buf[:n]), due: time.Now().Add(delay)}
		}
		if err != nil {
			return
		}
	}
}

// deliver writes the chunks to dst, each when it is due, in order, and
// closes dst when they end; a write that fails closes src too, which ends
// its reader.
func deliver(dst, src net.Conn, chunks <-chan chunk) {
	defer dst.Close()
	failed := false
	for c := range chunks {
		if failed {
			continue
		}
		time.Sleep(time.Until(c.due))
		if _, err := dst.Write(c.data); err != nil {
			failed = true
			_ = src.Close()
		}
	}
}

// Delay holds what the server sends for d before carrying it to the
// client, from now on: a one-way latency d on every connection, the
// order of the bytes kept. 0 carries it at once again.
func (r *Relay) Delay(d time.Duration) {
	r.mu.Lock()
	r.delay = d
	r.mu.Unlock()
}

// Cut stops carrying bytes, either way, and closes nothing.
func (r *Relay) Cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.healed == nil {
		r.healed = make(chan struct{})
	}
}

// Heal carries bytes again, what was held first, and takes connections
// again after Down.
func (r *Relay) Heal() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.down = false
	if r.healed != nil {
		close(r.healed)
		r.healed = nil
	}
}

// Drop heals the relay and closes every connection it carried so far, as a
// client that gives its server up does: the client reconnects through the
// relay, to a link that carries.
func (r *Relay) Drop() { r.closeAll(false) }

// Down closes every connection it carried so far and refuses new ones until
// Heal, as a server that died does: the client's reconnects fail until then.
func (r *Relay) Down() { r.closeAll(true) }

func (r *Relay) closeAll(down bool) {
	r.mu.Lock()
	r.down = down
	conns := r.conns
	r.conns = nil
	if r.healed != nil {
		close(r.healed)
		r.healed = nil
	}
	r.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}
