package natsconn

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
)

// DefaultMaxPayload leaves 64 KiB of header room above the 8 MiB body limit
// (docs/protocol.md, "Errors", 413): nats.go counts headers against max payload.
const DefaultMaxPayload int32 = 8<<20 + 64<<10

// DefaultListen is the embedded server's address under `switchyard dev`.
const DefaultListen = "127.0.0.1:4222"

// EmbeddedConfig configures an in-process nats-server with JetStream.
type EmbeddedConfig struct {
	// Listen is host:port for clients (default DefaultListen); port -1 or 0
	// picks a free port.
	Listen string
	// StoreDir holds JetStream's files. Empty means a temporary directory,
	// removed on Shutdown.
	StoreDir string
	// MaxPayload is the largest message (default DefaultMaxPayload).
	MaxPayload int32
	// ServerName names the server (default: chosen by nats-server).
	ServerName string
	// Logger receives the server's log (nil: discarded).
	Logger *slog.Logger
	// Trust, when set, runs the server in operator mode: only users of the
	// trusted operator's accounts connect, nobody anonymously.
	Trust *Trust
}

// Trust is a decentralized authorization: the operator, the system account,
// and every account's JWT by public key (a memory resolver preloaded with
// them; updates pushed by the system account apply until a restart).
type Trust struct {
	Operator      *jwt.OperatorClaims
	SystemAccount string
	Accounts      map[string]string
}

// Embedded is a running in-process nats-server.
type Embedded struct {
	srv     *server.Server
	tempDir string // owned store dir, removed on Shutdown
}

// readyTimeout bounds how long StartEmbedded waits for the listener.
const readyTimeout = 10 * time.Second

// StartEmbedded starts a nats-server with JetStream enabled, listening on TCP
// so that the nats CLI can connect to it too.
func StartEmbedded(cfg EmbeddedConfig) (*Embedded, error) {
	listen := cfg.Listen
	if listen == "" {
		listen = DefaultListen
	}
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("%w: listen address %q: %w", ErrConfig, listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < -1 || port > 65535 {
		return nil, fmt.Errorf("%w: listen port %q", ErrConfig, portStr)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	maxPayload := cfg.MaxPayload
	if maxPayload <= 0 {
		maxPayload = DefaultMaxPayload
	}

	e := &Embedded{}
	storeDir := cfg.StoreDir
	if storeDir == "" {
		storeDir, err = os.MkdirTemp("", "switchyard-nats-")
		if err != nil {
			return nil, fmt.Errorf("JetStream store: %w", err)
		}
		e.tempDir = storeDir
	}

	opts := &server.Options{
		ServerName: cfg.ServerName,
		Host:       host,
		Port:       port,
		MaxPayload: maxPayload,
		JetStream:  true,
		StoreDir:   storeDir,
		NoSigs:     true, // the process owns its signals, not the library
	}
	if cfg.Trust != nil {
		if err := cfg.Trust.Apply(opts); err != nil {
			e.removeTemp()
			return nil, err
		}
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		e.removeTemp()
		return nil, fmt.Errorf("embedded NATS server: %w", err)
	}
	if cfg.Logger != nil {
		srv.SetLogger(serverLogger{cfg.Logger}, cfg.Logger.Enabled(context.Background(), slog.LevelDebug), false)
	}
	srv.Start()
	if !srv.ReadyForConnections(readyTimeout) {
		srv.Shutdown()
		srv.WaitForShutdown()
		e.removeTemp()
		return nil, fmt.Errorf("embedded NATS server on %s not ready after %v", listen, readyTimeout)
	}
	e.srv = srv
	return e, nil
}

// MaxControlLine is the control line a server with Switchyard's
// authorization accepts (nats-server's default is 4 KB). A client sends its
// user JWT, which carries its permissions, in its CONNECT line: a deciding
// gateway's, with a region's copy of the routing table (--region), is
// longer than 4 KB.
const MaxControlLine = 16 << 10

// Apply puts the authorization into server options: the trusted operator,
// the system account, a memory resolver preloaded with the accounts, and
// MaxControlLine.
func (t *Trust) Apply(opts *server.Options) error {
	resolver := &server.MemAccResolver{}
	for pub, token := range t.Accounts {
		if err := resolver.Store(pub, token); err != nil {
			return err
		}
	}
	opts.TrustedOperators = []*jwt.OperatorClaims{t.Operator}
	opts.SystemAccount = t.SystemAccount
	opts.AccountResolver = resolver
	opts.MaxControlLine = max(opts.MaxControlLine, MaxControlLine)
	return nil
}

// ClientURL is the URL clients connect to (nats://host:port), with the port
// actually bound.
func (e *Embedded) ClientURL() string { return e.srv.ClientURL() }

// Server is the running server, for tests and monitoring.
func (e *Embedded) Server() *server.Server { return e.srv }

// Shutdown stops the server, waits until it is down, and removes an owned
// temporary store.
func (e *Embedded) Shutdown() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
	e.removeTemp()
}

func (e *Embedded) removeTemp() {
	if e.tempDir != "" {
		_ = os.RemoveAll(e.tempDir)
	}
}

// serverLogger hands nats-server's log lines to slog. Notices (the start-up
// banner and routine events) go to Debug so that `switchyard dev` prints only
// what a user acts on.
type serverLogger struct{ l *slog.Logger }

func (s serverLogger) Noticef(format string, v ...any) { s.l.Debug(fmt.Sprintf(format, v...)) }
func (s serverLogger) Warnf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	// The 8 MiB + 64 KiB max payload is deliberate (the body limit plus
	// header room): the server's generic advice about it is only noise.
	if strings.HasPrefix(msg, "Maximum payloads over") {
		s.l.Debug(msg)
		return
	}
	s.l.Warn(msg)
}
func (s serverLogger) Fatalf(format string, v ...any) { s.l.Error(fmt.Sprintf(format, v...)) }
func (s serverLogger) Errorf(format string, v ...any) { s.l.Error(fmt.Sprintf(format, v...)) }
func (s serverLogger) Debugf(format string, v ...any) { s.l.Debug(fmt.Sprintf(format, v...)) }
func (s serverLogger) Tracef(format string, v ...any) { s.l.Debug(fmt.Sprintf(format, v...)) }

var _ server.Logger = serverLogger{}
