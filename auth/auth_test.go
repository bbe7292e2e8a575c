package auth_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/auth"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/natsconn/natstest"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table/kv"
)

// serveConfig starts a nats-server from a configuration that includes the
// fragment Init wrote, as deploy/nats/nats-server.conf does.
func serveConfig(t *testing.T, dir string) string {
	t.Helper()
	conf := filepath.Join(dir, "nats.conf")
	body := fmt.Sprintf("host: 127.0.0.1\nport: -1\njetstream: {store_dir: %q}\ninclude %q\n", t.TempDir(), auth.ServerConfigFile)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("the generated configuration does not load: %v", err)
	}
	return natstest.RunServer(t, opts).ClientURL()
}

// serveInit runs Init with cfg, writes every identity's creds and starts
// a server from the configuration; it returns the server's URL and the
// path of an identity's creds file by its name.
func serveInit(t *testing.T, cfg auth.Config) (string, func(name string) string) {
	t.Helper()
	url, file, _ := serveStore(t, cfg)
	return url, file
}

// serveStore is serveInit that also returns the store, to mint more creds.
func serveStore(t *testing.T, cfg auth.Config) (string, func(name string) string, *auth.Store) {
	t.Helper()
	dir := t.TempDir()
	store, err := auth.Init(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	creds := filepath.Join(dir, "creds")
	if err := store.WriteAllCreds(creds, cfg.Replicas); err != nil {
		t.Fatal(err)
	}
	return serveConfig(t, dir), func(name string) string { return filepath.Join(creds, name+".creds") }, store
}

func connect(t *testing.T, url, creds string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.UserCredentials(creds), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatalf("connecting with %s: %v", filepath.Base(creds), err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestServerConfigAndTheDirectPath runs a server from the generated
// configuration and walks a direct tenant's request through it the way the
// broker and an adapter do: the reply a service import hands the broker
// cannot be a forwarded message's reply, so it travels in Llm-Reply and the
// adapter streams to it.
func TestServerConfigAndTheDirectPath(t *testing.T) {
	url, file := serveInit(t, auth.Config{Tenants: []string{"acme", "trial"}, Replicas: []string{"r1"}})

	if nc, err := nats.Connect(url); err == nil {
		nc.Close()
		t.Fatal("an anonymous client connected")
	}

	broker := connect(t, url, file("broker"))
	adapter := connect(t, url, file("adapter-r1"))
	refused := make(chan error, 1)
	if _, err := broker.Subscribe("llm.route.*", func(m *nats.Msg) {
		if !subjects.IsServiceReply(m.Reply) {
			refused <- fmt.Errorf("reply %q is not a service-import reply", m.Reply)
			return
		}
		// What the server refuses whatever the permissions say...
		_ = broker.PublishMsg(&nats.Msg{Subject: "llm.replica.r1", Reply: m.Reply, Data: m.Data})
		// ...and what it takes.
		fwd := &nats.Msg{Subject: "llm.replica.r1", Header: nats.Header{subjects.HdrReply: {m.Reply}}, Data: m.Data}
		if err := broker.PublishMsg(fwd); err != nil {
			refused <- err
		}
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := adapter.Subscribe("llm.replica.r1", func(m *nats.Msg) {
		reply := m.Header.Get(subjects.HdrReply)
		if reply == "" {
			refused <- errors.New("a forward with the import's reply attached arrived")
			return
		}
		for i := 1; i <= 3; i++ {
			h := nats.Header{subjects.HdrSeq: {fmt.Sprint(i)}}
			if i == 3 {
				h.Set(subjects.HdrEOS, "1")
			}
			_ = adapter.PublishMsg(&nats.Msg{Subject: reply, Header: h, Data: []byte("chunk")})
		}
	}); err != nil {
		t.Fatal(err)
	}
	for _, nc := range []*nats.Conn{broker, adapter} {
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}

	acme := connect(t, url, file("tenant-acme"))
	inbox := nats.NewInbox()
	sub, err := acme.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := acme.PublishRequest("llm.route.acme", inbox, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			select {
			case e := <-refused:
				t.Fatalf("chunk %d: %v (%v)", i, err, e)
			default:
				t.Fatalf("chunk %d: %v", i, err)
			}
		}
		if m.Header.Get(subjects.HdrSeq) != fmt.Sprint(i) {
			t.Fatalf("chunk %d has seq %q", i, m.Header.Get(subjects.HdrSeq))
		}
	}
	select {
	case e := <-refused:
		t.Fatal(e)
	default:
	}

	// trial imports only its own subject: acme's does not exist for it.
	trial := connect(t, url, file("tenant-trial"))
	if _, err := trial.Request("llm.route.acme", []byte("x"), 500*time.Millisecond); err == nil {
		t.Error("tenant-trial was answered on llm.route.acme")
	}
	// The gateway sends on llm.gw.*, never on the direct subject.
	gw := connect(t, url, file("gateway"))
	if _, err := gw.Request("llm.route.acme", []byte("x"), 500*time.Millisecond); !errors.Is(err, nats.ErrPermissionViolation) && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("gateway on llm.route.acme: %v", err)
	}
}

func TestRevokeRefusesOldCredsAndMintsNew(t *testing.T) {
	dir := t.TempDir()
	store, err := auth.Init(dir, auth.Config{Tenants: []string{"acme"}})
	if err != nil {
		t.Fatal(err)
	}
	creds := filepath.Join(dir, "creds")
	if err := store.WriteAllCreds(creds, nil); err != nil {
		t.Fatal(err)
	}
	url := serveConfig(t, dir)
	sys := connect(t, url, store.SystemCredsPath())
	old := filepath.Join(creds, "observer.creds")
	connect(t, url, old)

	accountPub, accountJWT, err := store.Revoke(auth.Role{Kind: auth.RoleObserver})
	if err != nil {
		t.Fatal(err)
	}
	if err := auth.PushAccount(t.Context(), sys, accountPub, accountJWT); err != nil {
		t.Fatal(err)
	}
	if nc, err := nats.Connect(url, nats.UserCredentials(old)); err == nil {
		nc.Close()
		t.Fatal("revoked creds still connect")
	}
	// The revocation covers creds issued up to its second.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 10*time.Millisecond)))
	fresh, err := store.WriteCreds(t.TempDir(), auth.Role{Kind: auth.RoleObserver})
	if err != nil {
		t.Fatal(err)
	}
	connect(t, url, fresh)

	// The rewritten fragment carries the revocation to a fresh server.
	b, err := os.ReadFile(store.ServerConfigPath())
	if err != nil || !strings.Contains(string(b), accountJWT) {
		t.Fatalf("server.conf lacks the revoked account's JWT: %v", err)
	}
	url2 := serveConfig(t, dir)
	if nc, err := nats.Connect(url2, nats.UserCredentials(old)); err == nil {
		nc.Close()
		t.Fatal("revoked creds connect to a server started from the rewritten configuration")
	}
}

func TestRoles(t *testing.T) {
	for _, tc := range []struct {
		kind, id, name string
		ok             bool
	}{
		{"gateway", "", "gateway", true},
		{"operator", "", "operator", true},
		{"adapter", "l70-gen-0", "adapter-l70-gen-0", true},
		{"tenant", "acme", "tenant-acme", true},
		{"adapter", "", "", false},
		{"adapter", "a.b", "", false},
		{"tenant", "*", "", false},
		{"broker", "x", "", false},
		{"root", "", "", false},
	} {
		r, err := auth.ParseRole(tc.kind, tc.id)
		if (err == nil) != tc.ok {
			t.Errorf("ParseRole(%q, %q): %v", tc.kind, tc.id, err)
			continue
		}
		if tc.ok && r.Name() != tc.name {
			t.Errorf("ParseRole(%q, %q).Name() = %q, want %q", tc.kind, tc.id, r.Name(), tc.name)
		}
		if !tc.ok && !errors.Is(err, auth.ErrRole) {
			t.Errorf("ParseRole(%q, %q): %v is not ErrRole", tc.kind, tc.id, err)
		}
	}
	store, err := auth.Init(t.TempDir(), auth.Config{Tenants: []string{"acme"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Creds(auth.Role{Kind: auth.RoleTenant, ID: "nobody"}); !errors.Is(err, auth.ErrRole) {
		t.Errorf("creds for a tenant without an account: %v", err)
	}
	if _, err := auth.Open(t.TempDir()); !errors.Is(err, auth.ErrNoAuth) {
		t.Errorf("Open of an empty directory: %v", err)
	}
}

// TestDecidersPingTheAdapters: a broker and a deciding gateway may ping the
// adapters' micro service, and only that of $SRV (they time the answers by
// region); a relaying gateway may not.
func TestDecidersPingTheAdapters(t *testing.T) {
	url, file := serveInit(t, auth.Config{Replicas: []string{"r1"}})
	adapter := connect(t, url, file("adapter-r1"))
	ping := "$SRV.PING." + subjects.AdapterService
	for _, s := range []string{ping, "$SRV.INFO." + subjects.AdapterService} {
		if _, err := adapter.Subscribe(s, func(m *nats.Msg) { _ = m.Respond([]byte("{}")) }); err != nil {
			t.Fatal(err)
		}
	}
	if err := adapter.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		role    string
		subject string
		ok      bool
	}{
		{"broker", ping, true},
		{"gateway", ping, true},
		{"gateway-relay", ping, false},
		{"broker", "$SRV.INFO." + subjects.AdapterService, false},
		{"gateway", "$SRV.PING", false},
	} {
		nc := connect(t, url, file(tc.role))
		_, err := nc.Request(tc.subject, nil, time.Second)
		if (err == nil) != tc.ok {
			t.Errorf("%s asking %s: %v, want answered %v", tc.role, tc.subject, err, tc.ok)
		}
	}
}

// TestARegionsDecidersReadItsCopyOfTheTable: a broker's or gateway's creds
// made for a region may read that region's copy of the routing table, and
// not another region's; creds without a region read neither.
func TestARegionsDecidersReadItsCopyOfTheTable(t *testing.T) {
	url, file, store := serveStore(t, auth.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	js, err := jetstream.New(connect(t, url, file("operator")))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: subjects.DefaultBucket}); err != nil {
		t.Fatal(err)
	}
	for _, region := range []string{"europe-west-4b", "c"} {
		if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: subjects.TableCopy(subjects.DefaultBucket, region),
			Mirror: &jetstream.StreamSource{Name: subjects.DefaultBucket}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := (auth.Role{Kind: auth.RoleObserver}).InRegion("europe-west-4b"); !errors.Is(err, auth.ErrRole) {
		t.Errorf("an observer in a region: %v, want ErrRole", err)
	}
	for _, kind := range []string{auth.RoleBroker, auth.RoleGateway, auth.RoleGatewayRelay} {
		role, err := auth.Role{Kind: kind}.InRegion("europe-west-4b")
		if err != nil {
			t.Fatal(err)
		}
		regionFile, err := store.WriteCreds(t.TempDir(), role)
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			file, region string
			ok           bool
		}{
			{regionFile, "europe-west-4b", true},
			{regionFile, "c", false},
			{file(kind), "europe-west-4b", false},
		} {
			js, err := jetstream.New(connect(t, url, tc.file))
			if err != nil {
				t.Fatal(err)
			}
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			_, err = js.Stream(sctx, "KV_"+subjects.TableCopy(subjects.DefaultBucket, tc.region))
			cancel()
			if (err == nil) != tc.ok {
				t.Errorf("%s (%s) reading region %s's copy: %v, want read %v", kind, filepath.Base(tc.file), tc.region, err, tc.ok)
			}
		}
		// A watcher of the region on these creds watches the copy: the
		// grants cover its consumer.
		rjs, err := jetstream.New(connect(t, url, regionFile))
		if err != nil {
			t.Fatal(err)
		}
		w := kv.New(rjs, kv.Config{Bucket: subjects.DefaultBucket, Region: "europe-west-4b"})
		wctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- w.Run(wctx) }()
		copyStream := "KV_" + subjects.TableCopy(subjects.DefaultBucket, "europe-west-4b")
		testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
			s, err := js.Stream(ctx, copyStream)
			if err != nil || s.CachedInfo().State.Consumers != 1 {
				return fmt.Errorf("%s's watcher not on the copy (%v)", kind, err)
			}
			return nil
		})
		stop()
		if err := <-done; err != nil {
			t.Errorf("%s's watcher: %v", kind, err)
		}
	}
}
