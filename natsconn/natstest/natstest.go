// Package natstest starts real nats-servers with JetStream for tests: one
// server on a random loopback port, or a small JetStream cluster whose
// members can be stopped and restarted for fault tests.
package natstest

import (
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// readyTimeout bounds how long a server may take to accept clients.
const readyTimeout = 10 * time.Second

// Start runs a JetStream server on a random loopback port with its store in
// t.TempDir(), shut down when the test ends. It returns the server and its
// client URL.
func Start(t testing.TB) (*server.Server, string) {
	t.Helper()
	s := RunServer(t, &server.Options{
		Host:      "127.0.0.1",
		Port:      server.RANDOM_PORT,
		JetStream: true,
		StoreDir:  t.TempDir(),
		NoSigs:    true,
	})
	return s, s.ClientURL()
}

// RunServer runs a server with opts, shut down when the test ends. Fields
// left zero get nats-server's defaults; set Port to server.RANDOM_PORT for a
// free port.
func RunServer(t testing.TB, opts *server.Options) *server.Server {
	t.Helper()
	opts.NoSigs = true
	if opts.Host == "" {
		opts.Host = "127.0.0.1"
	}
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("nats-server: %v", err)
	}
	s.Start()
	t.Cleanup(func() { shutdown(s) })
	if !s.ReadyForConnections(readyTimeout) {
		t.Fatalf("nats-server not ready after %v", readyTimeout)
	}
	return s
}

// Restart shuts s down and starts a server on the same client port with the
// same JetStream store, as a process restart would. It is meant for servers
// made by Start.
func Restart(t testing.TB, s *server.Server) *server.Server {
	t.Helper()
	port := s.Addr().(*net.TCPAddr).Port
	opts := &server.Options{
		Host:       "127.0.0.1",
		Port:       port,
		ServerName: s.Name(),
		JetStream:  s.JetStreamEnabled(),
	}
	if dir := s.StoreDir(); dir != "" {
		// StoreDir reports the "jetstream" folder nats-server makes below
		// the configured directory.
		opts.StoreDir = filepath.Dir(dir)
	}
	shutdown(s)
	return RunServer(t, opts)
}

func shutdown(s *server.Server) {
	s.Shutdown()
	s.WaitForShutdown()
}
