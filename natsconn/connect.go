// Package natsconn opens Switchyard's NATS connections (--nats, NATS_URL or a
// NATS CLI context) and runs the embedded nats-server of `switchyard dev`.
package natsconn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/jsm.go/natscontext"
	"github.com/nats-io/nats.go"
)

// EnvURL is the environment variable read when no --nats URL is given.
const EnvURL = "NATS_URL"

// EnvCreds is the environment variable read when no --creds file is given
// (the nats CLI reads it too).
const EnvCreds = "NATS_CREDS"

// ErrConfig reports unusable connection options.
var ErrConfig = errors.New("invalid NATS connection options")

// Options say where and as whom to connect. Every field is optional.
type Options struct {
	// URL is --nats: one or more comma-separated server URLs. Empty means
	// NATS_URL, then the context.
	URL string
	// Context is --context: a NATS CLI context name. Empty means the
	// selected context, consulted only when no URL is given.
	Context string
	// Name is the client name servers show in their connection lists
	// (default "switchyard").
	Name string
	// Creds is a credentials file (JWT and seed). Empty means NATS_CREDS,
	// then the context's, then none (a server that allows anonymous
	// clients).
	Creds string
	// TLSCert and TLSKey are a client certificate and its key; TLSCA the
	// roots that verify the server.
	TLSCert, TLSKey, TLSCA string
	// Logger receives connection events (nil: discarded).
	Logger *slog.Logger
	// PingInterval and MaxPingsOut tune the liveness check: a server that
	// gives no sign of life (nothing from it on its socket: no message, no
	// answer to a ping) for
	// MaxPingsOut intervals in a row is given up for another. Zero takes
	// DefaultPingInterval and DefaultMaxPingsOut; values outside
	// [MinPingInterval, MaxPingInterval] and [1, MaxMaxPingsOut] are
	// refused (ErrConfig).
	PingInterval time.Duration
	MaxPingsOut  int
}

// Reconnect defaults: a component keeps trying for as long as it runs, and
// starts even while its server is briefly away.
const (
	reconnectWait   = 250 * time.Millisecond
	reconnectJitter = 100 * time.Millisecond
)

// The client library's own pings are the liveness check's backstop
// (liveness.go): a server that goes silent without closing the connection
// is given up after maxPingsOut of them unanswered, within 20 s, rather than
// the library's four minutes, even if the check were stopped.
//
// A write the server does not take within writeTimeout fails the
// connection likewise: behind a cut link the socket's buffer fills, and the
// client library holds the connection's lock for the write (a minute by
// default), so that its pings, status and every publish wait with it.
const (
	pingInterval = 5 * time.Second
	maxPingsOut  = 3
	writeTimeout = 5 * time.Second
)

// Connect opens a connection. The URL comes from opts.URL, else NATS_URL,
// else the named context, else the selected context, else nats.DefaultURL.
// A named context also supplies credentials and TLS; opts.Creds and the
// TLS files apply on top of it.
//
// The connection retries forever: when no server answers at start, Connect
// still returns the connection, which connects in the background (use
// WaitConnected to wait for it, or pass nats.RetryOnFailedConnect(false) in
// extra to fail at once). extra options are applied last and win. ctx only
// guards the start: the connection lives until the caller closes it.
func Connect(ctx context.Context, opts Options, extra ...nats.Option) (*nats.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	name := opts.Name
	if name == "" {
		name = "switchyard"
	}

	url, nopts, err := resolve(opts)
	if err != nil {
		return nil, err
	}
	creds := opts.Creds
	if creds == "" {
		creds = os.Getenv(EnvCreds)
	}
	if creds != "" {
		nopts = append(nopts, nats.UserCredentials(creds))
	}
	switch {
	case opts.TLSCert != "" && opts.TLSKey != "":
		nopts = append(nopts, nats.ClientCert(opts.TLSCert, opts.TLSKey))
	case opts.TLSCert != "" || opts.TLSKey != "":
		return nil, fmt.Errorf("%w: a TLS certificate needs its key and the key its certificate", ErrConfig)
	}
	if opts.TLSCA != "" {
		nopts = append(nopts, nats.RootCAs(opts.TLSCA))
	}

	interval, maxOut := opts.PingInterval, opts.MaxPingsOut
	switch {
	case interval == 0:
		interval = DefaultPingInterval
	case interval < MinPingInterval || interval > MaxPingInterval:
		return nil, fmt.Errorf("%w: ping interval %v, want %v to %v", ErrConfig, interval, MinPingInterval, MaxPingInterval)
	}
	switch {
	case maxOut == 0:
		maxOut = DefaultMaxPingsOut
	case maxOut < 1 || maxOut > MaxMaxPingsOut:
		return nil, fmt.Errorf("%w: max pings out %d, want 1 to %d", ErrConfig, maxOut, MaxMaxPingsOut)
	}
	live := newLiveness(interval, maxOut, log)
	nopts = append(nopts,
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(reconnectWait),
		nats.ReconnectJitter(reconnectJitter, reconnectJitter),
		nats.PingInterval(pingInterval),
		nats.MaxPingsOutstanding(maxPingsOut),
		nats.FlusherTimeout(writeTimeout),
		nats.RetryOnFailedConnect(true),
		nats.ConnectHandler(func(nc *nats.Conn) {
			live.up.Store(true)
			log.Info("NATS connected", "url", nc.ConnectedUrlRedacted())
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			live.up.Store(false)
			log.Warn("NATS disconnected", "err", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			live.up.Store(true)
			log.Info("NATS reconnected", "url", nc.ConnectedUrlRedacted())
		}),
		nats.ClosedHandler(func(nc *nats.Conn) {
			live.closed()
			log.Debug("NATS connection closed", "err", nc.LastError())
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			if sub != nil {
				log.Error("NATS asynchronous error", "subject", sub.Subject, "err", err)
				return
			}
			log.Error("NATS asynchronous error", "err", err)
		}),
	)
	nopts = append(nopts, extra...)
	// The liveness check dials through whatever dialer these options
	// choose, counting what the server sends on each socket.
	o := nats.GetDefaultOptions()
	for _, opt := range nopts {
		if opt == nil {
			continue
		}
		if err := opt(&o); err != nil {
			return nil, fmt.Errorf("connecting to NATS at %s: %w", url, err)
		}
	}
	live.dial.wrap(&o)
	nopts = append(nopts, nats.SetCustomDialer(live.dial))

	nc, err := nats.Connect(url, nopts...)
	if err != nil {
		return nil, fmt.Errorf("connecting to NATS at %s: %w", url, err)
	}
	// The check lives as long as the connection: it returns within an
	// interval of its close.
	live.nc = nc
	go live.run()
	if !nc.IsConnected() {
		log.Warn("NATS not reachable yet; retrying in the background", "url", url)
	}
	return nc, nil
}

// resolve picks the server URL and the options a context contributes.
func resolve(opts Options) (string, []nats.Option, error) {
	url := opts.URL
	if url == "" {
		url = os.Getenv(EnvURL)
	}
	name := opts.Context
	if name == "" && url == "" {
		// The selected context is a user's default; an explicit URL must not
		// pick up its credentials, so it is consulted only without one.
		name = natscontext.SelectedContext()
	}
	if name == "" {
		if url == "" {
			url = nats.DefaultURL
		}
		return url, nil, nil
	}

	var copts []natscontext.Option
	if url != "" {
		copts = append(copts, natscontext.WithServerURL(url))
	}
	nctx, err := natscontext.New(name, true, copts...)
	if err != nil {
		return "", nil, fmt.Errorf("%w: NATS context %q: %w", ErrConfig, name, err)
	}
	nopts, err := nctx.NATSOptions()
	if err != nil {
		return "", nil, fmt.Errorf("%w: NATS context %q: %w", ErrConfig, name, err)
	}
	return nctx.ServerURL(), nopts, nil
}

// WaitConnected waits until nc is connected, or ctx is done.
func WaitConnected(ctx context.Context, nc *nats.Conn) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for !nc.IsConnected() {
		if nc.IsClosed() {
			return nats.ErrConnectionClosed
		}
		select {
		case <-ctx.Done():
			if err := nc.LastError(); err != nil {
				return fmt.Errorf("%w (last error: %w)", ctx.Err(), err)
			}
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}
