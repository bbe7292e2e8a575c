package natsconn_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/natsconn"
)

func startEmbedded(t *testing.T, cfg natsconn.EmbeddedConfig) *natsconn.Embedded {
	t.Helper()
	e, err := natsconn.StartEmbedded(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Shutdown)
	return e
}

// isolate keeps the tests away from the user's own NATS contexts.
func isolate(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", dir)
	t.Setenv(natsconn.EnvURL, "")
	return dir
}

func writeContext(t *testing.T, root, name, url string, selected bool) {
	t.Helper()
	dir := filepath.Join(root, "nats", "context")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`{"description": "test", "url": %q}`, url)
	if err := os.WriteFile(filepath.Join(dir, name+".json"), []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if selected {
		if err := os.WriteFile(filepath.Join(root, "nats", "context.txt"), []byte(name), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func TestEmbeddedServesJetStreamOverTCP(t *testing.T) {
	e := startEmbedded(t, natsconn.EmbeddedConfig{Listen: "127.0.0.1:-1", ServerName: "dev"})
	if !strings.HasPrefix(e.ClientURL(), "nats://127.0.0.1:") || strings.HasSuffix(e.ClientURL(), ":-1") {
		t.Fatalf("ClientURL = %q, want the bound loopback port", e.ClientURL())
	}
	if got := e.Server().Name(); got != "dev" {
		t.Errorf("server name = %q, want dev", got)
	}
	nc, err := nats.Connect(e.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if got := nc.MaxPayload(); got != int64(natsconn.DefaultMaxPayload) {
		t.Errorf("max payload = %d, want %d", got, natsconn.DefaultMaxPayload)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "probe"})
	if err != nil {
		t.Fatalf("JetStream not usable: %v", err)
	}
	if _, err := kv.PutString(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
}

func TestEmbeddedOwnsOnlyItsTempStore(t *testing.T) {
	e, err := natsconn.StartEmbedded(natsconn.EmbeddedConfig{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Dir(e.Server().StoreDir())
	if _, err := os.Stat(tmp); err != nil {
		t.Fatalf("temp store: %v", err)
	}
	e.Shutdown()
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temp store %s still there after Shutdown (err %v)", tmp, err)
	}

	dir := t.TempDir()
	e, err = natsconn.StartEmbedded(natsconn.EmbeddedConfig{Listen: "127.0.0.1:-1", StoreDir: dir, MaxPayload: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	e.Shutdown()
	if _, err := os.Stat(filepath.Join(dir, "jetstream")); err != nil {
		t.Errorf("a given store dir must be kept: %v", err)
	}
}

func TestEmbeddedRejectsBadListen(t *testing.T) {
	for _, listen := range []string{"nohost", "127.0.0.1:http", "127.0.0.1:70000"} {
		if _, err := natsconn.StartEmbedded(natsconn.EmbeddedConfig{Listen: listen}); !errors.Is(err, natsconn.ErrConfig) {
			t.Errorf("Listen %q: err = %v, want ErrConfig", listen, err)
		}
	}
}

func connect(t *testing.T, opts natsconn.Options, extra ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := natsconn.Connect(context.Background(), opts, extra...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func waitConnected(t *testing.T, nc *nats.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := natsconn.WaitConnected(ctx, nc); err != nil {
		t.Fatal(err)
	}
}

func TestConnectPicksTheURL(t *testing.T) {
	a := startEmbedded(t, natsconn.EmbeddedConfig{Listen: "127.0.0.1:-1", ServerName: "a"})
	b := startEmbedded(t, natsconn.EmbeddedConfig{Listen: "127.0.0.1:-1", ServerName: "b"})
	c := startEmbedded(t, natsconn.EmbeddedConfig{Listen: "127.0.0.1:-1", ServerName: "c"})

	tests := []struct {
		name     string
		env      string
		selected string // URL of the selected context
		opts     natsconn.Options
		want     string // server name
	}{
		{name: "flag", opts: natsconn.Options{URL: a.ClientURL()}, want: "a"},
		{name: "flag beats env", env: b.ClientURL(), opts: natsconn.Options{URL: a.ClientURL()}, want: "a"},
		{name: "env", env: b.ClientURL(), want: "b"},
		{name: "env beats selected context", env: b.ClientURL(), selected: c.ClientURL(), want: "b"},
		{name: "selected context", selected: c.ClientURL(), want: "c"},
		{name: "named context", opts: natsconn.Options{Context: "named"}, want: "a"},
		{name: "flag overrides a named context's URL", opts: natsconn.Options{Context: "named", URL: b.ClientURL()}, want: "b"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := isolate(t)
			t.Setenv(natsconn.EnvURL, tc.env)
			writeContext(t, root, "named", a.ClientURL(), false)
			if tc.selected != "" {
				writeContext(t, root, "sel", tc.selected, true)
			}
			nc := connect(t, tc.opts)
			waitConnected(t, nc)
			if got := nc.ConnectedServerName(); got != tc.want {
				t.Errorf("connected to %q, want %q", got, tc.want)
			}
		})
	}
}

func TestConnectRejectsBadOptions(t *testing.T) {
	isolate(t)
	for name, opts := range map[string]natsconn.Options{
		"cert without key": {URL: "nats://127.0.0.1:1", TLSCert: "c.pem"},
		"key without cert": {URL: "nats://127.0.0.1:1", TLSKey: "k.pem"},
		"unknown context":  {Context: "nope"},
	} {
		if _, err := natsconn.Connect(context.Background(), opts); !errors.Is(err, natsconn.ErrConfig) {
			t.Errorf("%s: err = %v, want ErrConfig", name, err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := natsconn.Connect(ctx, natsconn.Options{URL: "nats://127.0.0.1:1"}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: err = %v", err)
	}
}

// A component starts while its server is away and connects when it comes;
// it logs losing and regaining the server.
func TestConnectStartsBeforeTheServerAndReconnects(t *testing.T) {
	isolate(t)
	// The server the component is configured with has gone away; it comes
	// back on the port it had bound.
	e, err := natsconn.StartEmbedded(natsconn.EmbeddedConfig{Listen: "127.0.0.1:-1"})
	if err != nil {
		t.Fatal(err)
	}
	listen := e.Server().Addr().String()
	e.Shutdown()
	var logs testkit.SyncBuffer
	nc := connect(t, natsconn.Options{URL: "nats://" + listen, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if nc.IsConnected() {
		t.Fatal("connected with no server")
	}
	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := natsconn.WaitConnected(short, nc); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitConnected with no server: %v", err)
	}

	e, err = natsconn.StartEmbedded(natsconn.EmbeddedConfig{Listen: listen})
	if err != nil {
		t.Fatal(err)
	}
	waitConnected(t, nc)
	e.Shutdown()
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, testkit.Cond("the disconnect log", func() bool { return strings.Contains(logs.String(), "NATS disconnected") }))

	e = startEmbedded(t, natsconn.EmbeddedConfig{Listen: listen})
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, testkit.Cond("the reconnect log", func() bool { return strings.Contains(logs.String(), "NATS reconnected") }))
	if !nc.IsConnected() {
		t.Error("not connected after the reconnect log")
	}
}

func TestConnectFailFastWhenAsked(t *testing.T) {
	isolate(t)
	url := "nats://" + testkit.Refusing(t)
	_, err := natsconn.Connect(context.Background(), natsconn.Options{URL: url}, nats.RetryOnFailedConnect(false))
	if err == nil {
		t.Fatal("want an error with no server and RetryOnFailedConnect(false)")
	}
}
