package gateway

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-llm/switchyard/subjects"
)

// DefaultMaxConns bounds the open client connections when --max-conns is
// not given: far above what one gateway serves at once, far below the file
// descriptors and memory it has.
const DefaultMaxConns = 4096

// DefaultBodyTimeout is how long a request body may take to arrive in full.
const DefaultBodyTimeout = 30 * time.Second

// DefaultHeaderTimeout is how long a request's headers may take to arrive.
const DefaultHeaderTimeout = 10 * time.Second

// DefaultKeepAliveTimeout is how long a keep-alive connection may sit idle
// between requests.
const DefaultKeepAliveTimeout = 2 * time.Minute

// DefaultAdminListen is the address of `switchyard gateway`'s admin
// listener (the dashboard and /metrics): loopback, beside the broker's
// :9101 and the loader's :9103 metrics listeners.
const DefaultAdminListen = "127.0.0.1:9102"

// overLimit is the whole answer to a plain-HTTP connection past the
// connection limit: it is refused at once, never queued.
const overLimit = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: "

// maxRefusing bounds the refusals being written at once; past it a
// connection is closed without one.
const maxRefusing = 64

// limitListener accepts at most max connections at once. One past the
// limit is answered 503 (plain HTTP) or closed (TLS, where nothing can be
// said before the handshake) and counted, so clients holding connections
// open can use up the slots but not the gateway's memory or descriptors.
type limitListener struct {
	net.Listener
	slots    chan struct{}
	refusing chan struct{}
	plain    bool
	open     prometheus.Gauge
	refused  prometheus.Counter
	refusal  []byte
	wg       sync.WaitGroup // the refusals being written
}

func newLimitListener(ln net.Listener, max int, plain bool, m *metrics) *limitListener {
	body := subjects.NewError(503, subjects.CodeRouterUnavailable,
		"the gateway holds its limit of "+strconv.Itoa(max)+" open connections; retry").Body()
	return &limitListener{
		Listener: ln, slots: make(chan struct{}, max), refusing: make(chan struct{}, maxRefusing), plain: plain,
		open: m.openConns, refused: m.refusedConns,
		refusal: []byte(overLimit + strconv.Itoa(len(body)) + "\r\n\r\n" + string(body)),
	}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			l.open.Inc()
			return &limitedConn{Conn: c, l: l}, nil
		default:
		}
		l.refused.Inc()
		l.refuse(c)
	}
}

// refuse reads the request's head, answers 503 and reads what else the
// client sends until it closes (all within a second): an answer before the
// request confuses clients, and closing with the request unread would reset
// the connection and could destroy the answer before the client reads it.
func (l *limitListener) refuse(c net.Conn) {
	select {
	case l.refusing <- struct{}{}:
	default:
		_ = c.Close()
		return
	}
	if !l.plain {
		<-l.refusing
		_ = c.Close()
		return
	}
	l.wg.Go(func() {
		defer func() { <-l.refusing }()
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(time.Second))
		br := bufio.NewReaderSize(io.LimitReader(c, 64<<10), 4096)
		for {
			line, err := br.ReadSlice('\n')
			if err != nil {
				return
			}
			if len(line) <= 2 && strings.TrimSpace(string(line)) == "" {
				break
			}
		}
		if _, err := c.Write(l.refusal); err != nil {
			return
		}
		if cw, ok := c.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		_, _ = io.Copy(io.Discard, br)
	})
}

// Close stops accepting and waits for the refusals being written.
func (l *limitListener) Close() error {
	err := l.Listener.Close()
	l.wg.Wait()
	return err
}

// limitedConn gives its slot back on the first Close.
type limitedConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
}

// CloseWrite sends FIN while the client may still be sending: net/http
// does so before it closes a connection whose request it did not read in
// full, so the answer is read before the close resets the connection.
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		<-c.l.slots
		c.l.open.Dec()
	})
	return err
}

// receiveBody reads the whole body within BodyTimeout and no more than
// maxBody bytes. The deadline is on the connection (or HTTP/2 stream) and
// is cleared after the read, so it never cuts the response stream; a body
// that failed keeps it, and letGo bounds what net/http reads after it.
func (g *Gateway) receiveBody(w http.ResponseWriter, r *http.Request) ([]byte, *subjects.APIError) {
	rc := http.NewResponseController(w)
	deadline := rc.SetReadDeadline(time.Now().Add(g.cfg.BodyTimeout)) == nil
	body, err := readBody(http.MaxBytesReader(w, r.Body, g.maxBody), r.ContentLength, g.maxBody)
	if err == nil {
		if deadline {
			_ = rc.SetReadDeadline(time.Time{})
		}
		return body, nil
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return nil, subjects.NewError(http.StatusRequestEntityTooLarge, subjects.CodeRequestTooLarge,
			"request body is over the limit of "+strconv.FormatInt(g.maxBody, 10)+" bytes")
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		// HTTP/1 closes the connection; HTTP/2 resets the stream alone
		// (a Connection header there would send GOAWAY to every stream).
		if r.ProtoMajor == 1 {
			w.Header().Set("Connection", "close")
		}
		return nil, subjects.NewError(http.StatusRequestTimeout, subjects.CodeRequestTimeout,
			"the request body did not arrive within "+g.cfg.BodyTimeout.String())
	}
	return nil, subjects.NewError(400, subjects.CodeInvalidRequest, "could not read the request body: "+err.Error())
}

// drainGrace is the least time a client has, once answered, to send the
// rest of a body the gateway did not read before its connection is
// closed: long enough to read the answer before a close with unread data
// resets the connection (net/http waits as long before it closes).
const drainGrace = 500 * time.Millisecond

// watchedBody is a request body that notes whether it was read to its end.
type watchedBody struct {
	io.ReadCloser
	ended atomic.Bool
	// drainFor, when set, is how long net/http may wait for the rest of
	// the body once the answer is ready (refuseUnread), instead of
	// letGo's bound. Set and read by the handler's goroutine.
	drainFor time.Duration
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.ended.Store(true)
	}
	return n, err
}

// letGo bounds what is left of a request whose body was not read to its
// end (refused before it was read, or cut by the body deadline). net/http
// reads up to 256 KiB of such a body after the handler returns, to reuse
// the connection, and with no deadline of its own: a client that never
// sends it would hold the connection, and its --max-conns slot, for as
// long as it likes. letGo ends that read at the body's own deadline, and
// no sooner than drainGrace from now (refuseUnread asks for less); a body
// that is not in by then closes the connection (HTTP/1; an HTTP/2 stream
// is reset when its handler returns).
func (g *Gateway) letGo(w http.ResponseWriter, b *watchedBody, start time.Time) {
	if b.ended.Load() {
		return
	}
	deadline := start.Add(g.cfg.BodyTimeout)
	if soonest := time.Now().Add(drainGrace); deadline.Before(soonest) {
		deadline = soonest
	}
	if b.drainFor > 0 {
		deadline = time.Now().Add(b.drainFor)
	}
	_ = http.NewResponseController(w).SetReadDeadline(deadline)
}

// tlsErr is loadTLS's error: the files are read before anything connects.
func tlsErr(certFile, keyFile string) error {
	_, err := loadTLS(certFile, keyFile)
	return err
}

// loadTLS reads the certificate pair when both files are named.
func loadTLS(certFile, keyFile string) (*tls.Config, error) {
	if certFile == "" && keyFile == "" {
		return nil, nil
	}
	if certFile == "" || keyFile == "" {
		return nil, errors.New("--tls-cert and --tls-key go together")
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
	}
	// HTTP/2 first, as net/http negotiates it by ALPN.
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}, nil
}
