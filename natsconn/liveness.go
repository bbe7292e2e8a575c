package natsconn

import (
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// The liveness check's defaults and bounds: a server that stops answering
// without closing the connection (a partition, a frozen process) is given
// up within (DefaultMaxPingsOut+1)·DefaultPingInterval, 2 s, and the
// connection moves to another server.
const (
	DefaultPingInterval = 500 * time.Millisecond
	DefaultMaxPingsOut  = 3
	MinPingInterval     = 100 * time.Millisecond
	MaxPingInterval     = time.Minute
	MaxMaxPingsOut      = 100
)

// liveness watches one connection. Every interval it notes whether the
// server gave a sign of life since the last tick: bytes from the server on
// its socket (a message, a pong, the server's own ping). Traffic
// counts as proof of life as it does for the server, so a loaded machine
// whose pongs queue behind a stream of messages raises no false alarm; a
// ping is sent each tick so that an idle connection has a pong to show.
// After maxOut intervals in a row without a sign, it closes the socket,
// and the client library reconnects, trying the other servers first.
//
// The check counts and closes the socket itself (dialer), never waiting on
// the client library's lock: a write into a cut link whose socket buffer is
// full holds that lock for up to writeTimeout (5 s), and the library's own
// ForceReconnect flushes into the same socket before it closes it. Closing
// the socket fails that write at once. (A connection the library made
// without the dialer, in process, is checked through the library's counts
// and ForceReconnect.)
//
// The client library's own pings (pingInterval, maxPingsOut) stay as a
// backstop: they take only a pong as proof and are slower.
type liveness struct {
	nc   *nats.Conn
	dial *dialer
	// up is whether the library has the connection up: set by its
	// connected and reconnected handlers, cleared by its disconnected one,
	// so that a socket left open by a handshake that failed is not taken
	// for the connection.
	up       atomic.Bool
	interval time.Duration
	maxOut   int
	log      *slog.Logger
	stop     chan struct{}
	once     sync.Once
}

func newLiveness(interval time.Duration, maxOut int, log *slog.Logger) *liveness {
	return &liveness{dial: &dialer{}, interval: interval, maxOut: maxOut, log: log, stop: make(chan struct{})}
}

// closed stops the check: the connection's closed handler calls it.
func (l *liveness) closed() { l.once.Do(func() { close(l.stop) }) }

// sign is what the check reads at a tick: the socket in use (nil: none
// dialed, or the library's in-process connection), whether the connection
// is up, a count that grows with what the server sends, and whether the
// connection is closed for good. The library is asked nothing while a
// socket is open: a write blocked in it holds the library's lock.
func (l *liveness) sign() (w *watched, up bool, received uint64, closed bool) {
	if w = l.dial.cur.Load(); w != nil && !w.closed.Load() {
		return w, l.up.Load(), w.received(), false
	}
	if l.nc.IsClosed() {
		return w, false, 0, true
	}
	if w != nil {
		return w, false, 0, false // between sockets: reconnecting
	}
	return nil, l.nc.IsConnected(), l.nc.Stats().InMsgs, false
}

// run checks until the connection closes. Its probes (one ping in flight at
// a time) end before it returns.
func (l *liveness) run() {
	t := time.NewTicker(l.interval)
	defer t.Stop()
	answer := make(chan error, 1)
	probing := false
	defer func() {
		if probing {
			<-answer
		}
	}()
	var last *watched
	var lastIn uint64
	answered, misses := false, 0
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		w, up, in, closed := l.sign()
		if closed {
			return
		}
		if probing {
			select {
			case err := <-answer:
				probing, answered = false, err == nil
			default:
			}
		}
		// A socket new since the last tick is a fresh start.
		alive := in != lastIn || w != last || answered
		last, lastIn, answered = w, in, false
		switch {
		case !up:
			misses = 0 // reconnecting: the library's own wait and retries apply
		case alive:
			misses = 0
		default:
			misses++
		}
		if misses >= l.maxOut {
			misses = 0
			l.leave(w)
			continue
		}
		if !probing && up {
			probing = true
			go func() { answer <- l.nc.FlushTimeout(time.Duration(l.maxOut) * l.interval) }()
		}
	}
}

// leave gives up the silent server: it closes w, the socket, and the
// library reconnects (without a socket of the check's, the library is
// asked to).
func (l *liveness) leave(w *watched) {
	where := "in process"
	if w != nil {
		where = w.RemoteAddr().String()
	}
	l.log.Warn("NATS server silent: reconnecting to another", "addr", where,
		"silent_for", (time.Duration(l.maxOut) * l.interval).String())
	if w != nil {
		_ = w.Close()
		return
	}
	_ = l.nc.ForceReconnect()
}

// dialer dials the connection's servers (nats.SetCustomDialer) through
// the dialer the options chose (a context's SOCKS proxy, a caller's own,
// else one with the options' timeout), and keeps the newest socket for the
// check.
type dialer struct {
	inner nats.CustomDialer
	cur   atomic.Pointer[watched]
}

// wrap makes d dial through what o, the connection's options, would have
// dialled with.
func (d *dialer) wrap(o *nats.Options) {
	switch {
	case o.CustomDialer != nil:
		d.inner = o.CustomDialer
	case o.Dialer != nil:
		c := *o.Dialer
		d.inner = &c
	default:
		d.inner = &net.Dialer{Timeout: o.Timeout}
	}
}

func (d *dialer) Dial(network, address string) (net.Conn, error) {
	c, err := d.inner.Dial(network, address)
	if err != nil {
		return nil, err
	}
	w := &watched{Conn: c}
	d.cur.Store(w)
	return w, nil
}

// SkipTLSHandshake passes on the inner dialer's answer (nats.go asks a
// custom dialer whether it does TLS itself).
func (d *dialer) SkipTLSHandshake() bool {
	s, ok := d.inner.(interface{ SkipTLSHandshake() bool })
	return ok && s.SkipTLSHandshake()
}

// watched is a socket to a server that counts its reads that returned
// bytes, and says when it was closed.
type watched struct {
	net.Conn
	reads  atomic.Uint64
	closed atomic.Bool
}

// received grows with what the server sent: the reads that returned bytes,
// plus, where the system tells (kernelReceived), the bytes the kernel took
// in on the socket, which count also while the library's reader waits on
// its lock behind a blocked write.
func (w *watched) received() uint64 {
	n := w.reads.Load()
	if k, ok := kernelReceived(w.Conn); ok {
		n += k
	}
	return n
}

func (w *watched) Read(b []byte) (int, error) {
	n, err := w.Conn.Read(b)
	if n > 0 {
		w.reads.Add(1)
	}
	return n, err
}

func (w *watched) Close() error {
	w.closed.Store(true)
	return w.Conn.Close()
}
