package natsconn

import (
	"log/slog"
	"sync"
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
// server gave a sign of life since the last tick: a message received on
// the connection, or the answer to the ping it sent then. Traffic counts as
// proof of life as it does for the server, so a loaded machine whose pongs
// queue behind a stream of messages raises no false alarm. After maxOut
// intervals in a row without a sign, it forces a reconnect, which tries the
// other servers first.
//
// The client library's own pings (pingInterval, maxPingsOut) stay as a
// backstop: they take only a pong as proof and are slower. A write the
// server does not take holds the connection's lock for up to writeTimeout;
// the check waits behind it, so a cut link whose socket buffer is full is
// left at the write timeout (5 s), not within 2 s.
type liveness struct {
	nc       *nats.Conn
	interval time.Duration
	maxOut   int
	log      *slog.Logger
	stop     chan struct{}
	once     sync.Once
}

func newLiveness(interval time.Duration, maxOut int, log *slog.Logger) *liveness {
	return &liveness{interval: interval, maxOut: maxOut, log: log, stop: make(chan struct{})}
}

// closed stops the check: the connection's closed handler calls it.
func (l *liveness) closed() { l.once.Do(func() { close(l.stop) }) }

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
	var lastIn uint64
	answered, misses := false, 0
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		if l.nc.IsClosed() {
			return
		}
		if probing {
			select {
			case err := <-answer:
				probing, answered = false, err == nil
			default:
			}
		}
		in := l.nc.Stats().InMsgs
		alive := in != lastIn || answered
		lastIn, answered = in, false
		switch {
		case !l.nc.IsConnected():
			misses = 0 // reconnecting: the library's own wait and retries apply
		case alive:
			misses = 0
		default:
			misses++
		}
		if misses >= l.maxOut {
			l.log.Warn("NATS server silent: reconnecting to another", "url", l.nc.ConnectedUrlRedacted(),
				"silent_for", (time.Duration(misses) * l.interval).String())
			misses = 0
			_ = l.nc.ForceReconnect()
			continue
		}
		if !probing && l.nc.IsConnected() {
			probing = true
			go func() { answer <- l.nc.FlushTimeout(time.Duration(l.maxOut) * l.interval) }()
		}
	}
}
