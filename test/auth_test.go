package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/auth"
	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects"
)

// connectAs connects to the stack's server with role's creds file.
func connectAs(st *devstack.Stack, role auth.Role) (*nats.Conn, error) {
	// The refusals these tests provoke are expected: keep them off stderr.
	return nats.Connect(st.NATSURL(), nats.UserCredentials(st.Creds(role)), nats.Name("test-"+role.Name()),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
}

func mustConnectAs(t *testing.T, st *devstack.Stack, role auth.Role) *nats.Conn {
	t.Helper()
	nc, err := connectAs(st, role)
	if err != nil {
		t.Fatalf("connecting as %s: %v", role.Name(), err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// natsAs runs the nats CLI with role's creds and returns its output and
// whether it succeeded.
func natsAs(t *testing.T, cli string, st *devstack.Stack, role auth.Role, args ...string) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	base := []string{"--server", st.NATSURL(), "--no-context", "--creds", st.Creds(role), "--timeout", "2s"}
	cmd := exec.CommandContext(ctx, cli, append(base, args...)...)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	return string(out), err == nil
}

var (
	roleOperator = auth.Role{Kind: auth.RoleOperator}
	roleGateway  = auth.Role{Kind: auth.RoleGateway}
	roleRelay    = auth.Role{Kind: auth.RoleGatewayRelay}
	roleBroker   = auth.Role{Kind: auth.RoleBroker}
	roleObserver = auth.Role{Kind: auth.RoleObserver}
)

func tenant(t string) auth.Role      { return auth.Role{Kind: auth.RoleTenant, ID: t} }
func adapterRole(r string) auth.Role { return auth.Role{Kind: auth.RoleAdapter, ID: r} }

// TestAuthorization checks each row of docs/security.md against the dev
// stack's server, which runs with the authorization `switchyard auth` makes.
func TestAuthorization(t *testing.T) {
	cli := natsCLI(t)
	st := startStack(t, devstack.Config{Replicas: devstack.ReplicasNamed("l70-gen-0", "l70-gen-1", "l70-long-0", "l70-prem-0")}) // l70: gen ×2, long, prem
	body := `{"model":"chat-large","max_tokens":3,"messages":[{"role":"user","content":"hello from a direct client"}]}`

	t.Run("a tenant's creds get answers on its route subject", func(t *testing.T) {
		out, ok := natsAs(t, cli, st, tenant("acme"), "req", "--raw", "--replies", "0", "--reply-timeout", "2s", "llm.route.acme", body)
		if !ok || !strings.Contains(out, `"chat.completion"`) || !strings.Contains(out, `"completion_tokens":3`) {
			t.Fatalf("nats req llm.route.acme as tenant-acme: ok=%v\n%s", ok, out)
		}
	})

	t.Run("a streamed answer comes back through the import", func(t *testing.T) {
		nc := mustConnectAs(t, st, tenant("acme"))
		inbox := nats.NewInbox()
		sub, err := nc.SubscribeSync(inbox)
		if err != nil {
			t.Fatal(err)
		}
		stream := `{"model":"chat-large","stream":true,"max_tokens":6,"messages":[{"role":"user","content":"stream to me"}]}`
		if err := nc.PublishRequest("llm.route.acme", inbox, []byte(stream)); err != nil {
			t.Fatal(err)
		}
		// A singleton import lets only the first message of an answer
		// through: the end of the stream arrives only through a streamed
		// one. How many messages the chunks come in depends on how the
		// adapter's reads fall, so what is counted is the chunks.
		var msgs int
		var answer []byte
		for {
			m, err := sub.NextMsg(30 * time.Second)
			if err != nil {
				t.Fatalf("after %d messages: %v", msgs, err)
			}
			if m.Header.Get(subjects.HdrStatus) != "" && m.Header.Get(subjects.HdrStatus) != "200" {
				t.Fatalf("status %s: %s", m.Header.Get(subjects.HdrStatus), m.Data)
			}
			msgs++
			answer = append(answer, m.Data...)
			if m.Header.Get(subjects.HdrEOS) != "" {
				break
			}
		}
		chunks := strings.Count(string(answer), `"chat.completion.chunk"`)
		if msgs < 2 || chunks < 6 || !strings.Contains(string(answer), "data: [DONE]") {
			t.Errorf("a 6-token stream arrived as %d messages holding %d chunks:\n%s", msgs, chunks, answer)
		}
		t.Logf("a 6-token stream arrived as %d messages holding %d chunks", msgs, chunks)
	})

	t.Run("another tenant's route is never served", func(t *testing.T) {
		out, _ := natsAs(t, cli, st, tenant("trial"), "req", "--raw", "llm.route.acme", body)
		if strings.Contains(out, "chat.completion") || !strings.Contains(out, "Permissions Violation") {
			t.Errorf("tenant-trial on llm.route.acme was not refused:\n%s", out)
		}
		nc := mustConnectAs(t, st, tenant("trial"))
		if _, err := nc.Request("llm.route.acme", []byte(body), time.Second); err == nil {
			t.Error("a request of tenant-trial on llm.route.acme got an answer")
		}
	})

	t.Run("a tenant sees nothing of another tenant's traffic", func(t *testing.T) {
		spy := mustConnectAs(t, st, tenant("trial"))
		errs := make(chan error, 4)
		spy.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err })
		seen := make(chan *nats.Msg, 64)
		for _, subj := range []string{"llm.replica.>", "_INBOX.>", ">"} {
			if _, err := spy.ChanSubscribe(subj, seen); err != nil {
				t.Fatal(err)
			}
		}
		if err := spy.Flush(); err != nil {
			t.Fatal(err)
		}
		// The gateway serves acme, and acme asks directly.
		if status, _ := post(t, st.GatewayURL(), "sk-acme-dev", body); status != 200 {
			t.Fatalf("gateway request for acme: %d", status)
		}
		direct := mustConnectAs(t, st, tenant("acme"))
		if _, err := direct.Request("llm.route.acme", []byte(body), 5*time.Second); err != nil {
			t.Fatalf("direct request for acme: %v", err)
		}
		// Whatever the server delivered to the spy is in before this pong.
		if err := spy.Flush(); err != nil {
			t.Fatal(err)
		}
		if len(seen) > 0 {
			t.Errorf("tenant-trial saw %s", (<-seen).Subject)
		}
		select {
		case err := <-errs:
			if !errors.Is(err, nats.ErrPermissionViolation) {
				t.Errorf("subscribing llm.replica.>: %v, want a permissions violation", err)
			}
		default:
			t.Error("subscribing llm.replica.> as a tenant was not refused")
		}
		// With the CLI too: it is refused outright.
		if out, ok := natsAs(t, cli, st, tenant("trial"), "sub", "--count", "1", "llm.replica.>"); ok {
			t.Errorf("nats sub llm.replica.> as tenant-trial succeeded:\n%s", out)
		}
	})

	t.Run("only the operator writes the table", func(t *testing.T) {
		key := "keys.0000000000000000000000000000000000000000000000000000000000000000"
		value := `{"tenant":"acme"}`
		// A refused put waits for its acknowledgement: try them together.
		var wg sync.WaitGroup
		for _, r := range []auth.Role{tenant("acme"), roleGateway, roleObserver, roleBroker, adapterRole("l70-gen-0")} {
			wg.Go(func() {
				if out, ok := natsAs(t, cli, st, r, "kv", "put", "llm-routing", key, value); ok {
					t.Errorf("kv put as %s succeeded:\n%s", r.Name(), out)
				}
			})
		}
		// An adapter writes its own replicas key, not another replica's.
		wg.Go(func() {
			if out, ok := natsAs(t, cli, st, adapterRole("l70-gen-0"), "kv", "put", "llm-routing", "replicas.l70-prem-0", `{"state":"disabled"}`); ok {
				t.Errorf("adapter-l70-gen-0 wrote replicas.l70-prem-0:\n%s", out)
			}
		})
		wg.Wait()
		if out, ok := natsAs(t, cli, st, roleObserver, "kv", "get", "llm-routing", "tenants.acme"); !ok || !strings.Contains(out, "premium") {
			t.Errorf("the observer cannot read the table:\n%s", out)
		}
		// switchyard table as the observer: it reads (writes are refused above).
		observerEnv := []string{"NATS_URL=" + st.NATSURL(), "NATS_CREDS=" + st.Creds(roleObserver), "HOME=" + t.TempDir()}
		if out, errOut, code := sy(t, observerEnv, "", "table", "get", "tenants.acme"); code != 0 || !strings.Contains(out, "premium") {
			t.Errorf("switchyard table get as the observer: exit %d: %s %s", code, out, errOut)
		}
		if _, err := kvBucket(t, st).Get(context.Background(), key); err == nil {
			t.Fatal("a refused put reached the table")
		}
		if out, ok := natsAs(t, cli, st, roleOperator, "kv", "put", "llm-routing", key, value); !ok {
			t.Errorf("kv put as operator: %s", out)
		}
		if err := kvBucket(t, st).Delete(context.Background(), key); err != nil {
			t.Error(err)
		}
	})

	t.Run("a forged heartbeat changes nothing", func(t *testing.T) {
		watch := mustConnectAs(t, st, roleObserver)
		hbs, err := watch.SubscribeSync("llm.heartbeat.l70-prem-0")
		if err != nil {
			t.Fatal(err)
		}
		if err := watch.Flush(); err != nil {
			t.Fatal(err)
		}
		forged, _ := json.Marshal(subjects.Heartbeat{Replica: "l70-prem-0", State: subjects.StateDisabled, SentUnixMillis: time.Now().UnixMilli()})
		for _, r := range []auth.Role{tenant("acme"), adapterRole("l70-gen-0")} {
			nc := mustConnectAs(t, st, r)
			_ = nc.Publish("llm.heartbeat.l70-prem-0", forged)
			_ = nc.Flush()
		}
		if err := watch.Flush(); err != nil {
			t.Fatal(err)
		}
		for {
			m, err := hbs.NextMsg(0)
			if err != nil {
				break
			}
			var hb subjects.Heartbeat
			if json.Unmarshal(m.Data, &hb) == nil && hb.State != subjects.StateReady {
				t.Errorf("a heartbeat for l70-prem-0 said %q", hb.State)
			}
		}
		if r := st.Broker(0).Table().Replicas["l70-prem-0"]; r == nil || r.State != subjects.StateReady {
			t.Errorf("l70-prem-0 in the broker's table: %+v", r)
		}
	})

	t.Run("an adapter speaks only for its own replica's cache", func(t *testing.T) {
		watch := mustConnectAs(t, st, roleBroker)
		updates, err := watch.SubscribeSync("llm.kv.l70-prem-0")
		if err != nil {
			t.Fatal(err)
		}
		if err := watch.Flush(); err != nil {
			t.Fatal(err)
		}
		const forgedKey = 0xf0f0f0f0
		forged, _ := json.Marshal(subjects.KVUpdate{Replica: "l70-prem-0", Model: "llama-3-70b-instruct", Seq: 1, Reset: true,
			KVBlocks: 8192, Stored: []uint64{forgedKey}})
		nc := mustConnectAs(t, st, adapterRole("l70-gen-0"))
		_ = nc.Publish("llm.kv.l70-prem-0", forged)
		_ = nc.Flush()
		if err := watch.Flush(); err != nil {
			t.Fatal(err)
		}
		for {
			m, err := updates.NextMsg(200 * time.Millisecond)
			if err != nil {
				break
			}
			var u subjects.KVUpdate
			if json.Unmarshal(m.Data, &u) == nil && len(u.Stored) == 1 && u.Stored[0] == forgedKey {
				t.Fatal("adapter-l70-gen-0 published on llm.kv.l70-prem-0")
			}
		}
	})

	t.Run("an adapter speaks only for its own replica's load", func(t *testing.T) {
		watch := mustConnectAs(t, st, roleBroker)
		deltas, err := watch.SubscribeSync("llm.load.*")
		if err != nil {
			t.Fatal(err)
		}
		if err := watch.Flush(); err != nil {
			t.Fatal(err)
		}
		// Marked by a count no honest delta of the dev stack reaches.
		const mark = 4242
		forged, _ := json.Marshal(subjects.LoadDelta{Replica: "l70-prem-0", Seq: 1 << 40, Inflight: mark})
		own, _ := json.Marshal(subjects.LoadDelta{Replica: "l70-gen-0", Seq: 1 << 40, Inflight: mark})
		for _, r := range []auth.Role{adapterRole("l70-gen-0"), tenant("acme"), roleGateway, roleObserver} {
			nc := mustConnectAs(t, st, r)
			_ = nc.Publish("llm.load.l70-prem-0", forged)
			if r.Kind == auth.RoleAdapter {
				_ = nc.Publish("llm.load.l70-gen-0", own)
			}
			_ = nc.Flush()
		}
		if err := watch.Flush(); err != nil {
			t.Fatal(err)
		}
		var marked []string
		for {
			m, err := deltas.NextMsg(200 * time.Millisecond)
			if err != nil {
				break
			}
			var d subjects.LoadDelta
			if json.Unmarshal(m.Data, &d) == nil && d.Inflight == mark {
				marked = append(marked, m.Subject)
			}
		}
		if len(marked) != 1 || marked[0] != "llm.load.l70-gen-0" {
			t.Fatalf("marked deltas on %v, want only adapter-l70-gen-0's own on llm.load.l70-gen-0", marked)
		}
	})

	t.Run("an adapter sends prefill legs only, in its own name", func(t *testing.T) {
		witness := mustConnectAs(t, st, adapterRole("l70-gen-1"))
		legs, err := witness.SubscribeSync("llm.replica.l70-gen-1.prefill.*")
		if err != nil {
			t.Fatal(err)
		}
		whole, err := witness.SubscribeSync("llm.replica.l70-gen-1")
		if err != nil {
			t.Fatal(err)
		}
		if err := witness.Flush(); err != nil {
			t.Fatal(err)
		}
		for _, r := range []auth.Role{adapterRole("l70-gen-0"), tenant("acme"), roleBroker, roleGateway, roleObserver} {
			nc := mustConnectAs(t, st, r)
			// In the adapter's name, and in another replica's.
			_ = nc.Publish("llm.replica.l70-gen-1.prefill.l70-gen-0", []byte("leg-"+r.Name()))
			_ = nc.Publish("llm.replica.l70-gen-1.prefill.l70-prem-0", []byte("forged-leg-"+r.Name()))
			if r.Kind == auth.RoleAdapter {
				_ = nc.Publish("llm.replica.l70-gen-1", []byte("whole-"+r.Name()))
			}
			_ = nc.Flush()
		}
		if err := witness.Flush(); err != nil {
			t.Fatal(err)
		}
		var got []string
		for {
			m, err := legs.NextMsg(0)
			if err != nil {
				break
			}
			got = append(got, m.Subject+" "+string(m.Data))
		}
		if len(got) != 1 || got[0] != "llm.replica.l70-gen-1.prefill.l70-gen-0 leg-adapter-l70-gen-0" {
			t.Errorf("prefill legs that went through: %q, want only the adapter's, in its own name", got)
		}
		if m, err := whole.NextMsg(0); err == nil {
			t.Errorf("an adapter sent another replica a whole request: %s", m.Data)
		}
	})

	t.Run("only deciders and gateways ask the adapters to resend their keys", func(t *testing.T) {
		// A resend is every key an engine holds: llm.kvsync is for the
		// parts that keep an index of them (brokers, gateways that decide,
		// every gateway's dashboard), and each adapter answers it at most
		// once a second whoever asks.
		witness := mustConnectAs(t, st, adapterRole("l70-gen-1"))
		asks, err := witness.SubscribeSync("llm.kvsync")
		if err != nil {
			t.Fatal(err)
		}
		if err := witness.Flush(); err != nil {
			t.Fatal(err)
		}
		for _, r := range []auth.Role{roleBroker, roleGateway, roleRelay, roleObserver, roleOperator, {Kind: auth.RoleLoader}, {Kind: auth.RoleBatcher},
			adapterRole("l70-gen-0"), tenant("acme")} {
			nc := mustConnectAs(t, st, r)
			_ = nc.Publish("llm.kvsync", []byte(r.Name()))
			_ = nc.Flush()
		}
		if err := witness.Flush(); err != nil {
			t.Fatal(err)
		}
		var got []string
		for {
			m, err := asks.NextMsg(0)
			if err != nil {
				break
			}
			if len(m.Data) > 0 { // the stack's own asks are empty
				got = append(got, string(m.Data))
			}
		}
		slices.Sort(got)
		if want := []string{"broker", "gateway", "gateway-relay"}; !slices.Equal(got, want) {
			t.Errorf("asks to resend that went through: %q, want %q", got, want)
		}
	})

	t.Run("only deciders announce presence: brokers and gateways", func(t *testing.T) {
		witness := mustConnectAs(t, st, roleBroker)
		pres, err := witness.SubscribeSync("llm.broker.presence")
		if err != nil {
			t.Fatal(err)
		}
		if err := witness.Flush(); err != nil {
			t.Fatal(err)
		}
		// A gateway decides its HTTP requests and takes its share of the
		// quotas: it announces itself as brokers do. No other part may.
		gw := mustConnectAs(t, st, roleGateway)
		_ = gw.Publish("llm.broker.presence", []byte("decider-gateway"))
		_ = gw.Flush()
		for _, r := range []auth.Role{roleObserver, roleOperator, adapterRole("l70-gen-0"), tenant("acme")} {
			nc := mustConnectAs(t, st, r)
			_ = nc.Publish("llm.broker.presence", []byte("fake-"+r.Name()))
			_ = nc.Flush()
		}
		if err := witness.Flush(); err != nil {
			t.Fatal(err)
		}
		gatewayHeard := false
		for {
			m, err := pres.NextMsg(0)
			if err != nil {
				break
			}
			gatewayHeard = gatewayHeard || string(m.Data) == "decider-gateway"
			if strings.HasPrefix(string(m.Data), "fake-") {
				t.Errorf("presence from %s went through", m.Data)
			}
		}
		if !gatewayHeard {
			t.Error("a gateway's presence did not go through")
		}
		// The broker counts itself and the stack's gateway, which decides
		// (and, for a few seconds, the announcement above); never a fake.
		testkit.CheckFor(t, 5*time.Second, 50*time.Millisecond, func() error {
			if n := st.Broker(0).LiveBrokers(); n < 2 || n > 3 {
				return fmt.Errorf("the broker counts %d live deciders, want 2 or 3", n)
			}
			return nil
		})
	})

	t.Run("a gateway that decides through the brokers holds no decider's subject", func(t *testing.T) {
		// What a deciding gateway may publish, each heard by a part
		// allowed to hear it.
		heard := map[string]auth.Role{
			"llm.replica.l70-gen-1": adapterRole("l70-gen-1"),
			"llm.placement.x":       roleBroker,
			"llm.broker.presence":   roleBroker,
			"llm.decision.x":        roleOperator,
			"llm.eject.l70-gen-1":   roleOperator,
			"llm.control.load":      roleOperator,
			"llm.route.acme":        roleBroker,
			"llm.explain.acme":      roleBroker,
		}
		got := make(chan string, 64)
		for subject, r := range heard {
			w := mustConnectAs(t, st, r)
			if _, err := w.Subscribe(subject, func(m *nats.Msg) {
				if strings.HasPrefix(string(m.Data), "probe-") {
					got <- m.Subject + " " + string(m.Data)
				}
			}); err != nil {
				t.Fatal(err)
			}
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
		}
		for _, r := range []auth.Role{roleRelay, roleGateway} {
			nc := mustConnectAs(t, st, r)
			for subject := range heard {
				_ = nc.Publish(subject, []byte("probe-"+r.Name()))
			}
			_ = nc.Flush()
		}
		// A deciding gateway's messages arrive (the route and explain
		// subjects excepted); the relay's never do.
		want := map[string]bool{}
		for subject := range heard {
			if !strings.HasPrefix(subject, "llm.route.") && !strings.HasPrefix(subject, "llm.explain.") {
				want[subject+" probe-gateway"] = true
			}
		}
		testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
			for {
				select {
				case m := <-got:
					if !want[m] {
						t.Errorf("went through: %s", m)
					}
					delete(want, m)
					continue
				default:
				}
				if len(want) > 0 {
					return fmt.Errorf("the deciding gateway's messages not heard yet: %v", want)
				}
				return nil
			}
		})
		// Nor may the relay hear what only deciders hear.
		for _, subject := range []string{"llm.usage.*", "llm.placement.*", "llm.broker.presence", "llm.load.*", "llm.route.*"} {
			denied := make(chan error, 1)
			nc, err := nats.Connect(st.NATSURL(), nats.UserCredentials(st.Creds(roleRelay)),
				nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
					select {
					case denied <- err:
					default:
					}
				}))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := nc.SubscribeSync(subject); err != nil {
				t.Fatal(err)
			}
			_ = nc.Flush()
			select {
			case err := <-denied:
				if !errors.Is(err, nats.ErrPermissionViolation) {
					t.Errorf("subscribing %s as the relay: %v, want a permissions violation", subject, err)
				}
			case <-time.After(5 * time.Second):
				t.Errorf("the relay subscribed %s", subject)
			}
			nc.Close()
		}
	})

	t.Run("anonymous connections are refused", func(t *testing.T) {
		nc, err := nats.Connect(st.NATSURL())
		if err == nil {
			nc.Close()
			t.Fatal("an anonymous client connected")
		}
		if !errors.Is(err, nats.ErrAuthorization) {
			t.Errorf("anonymous connect: %v, want an authorization violation", err)
		}
	})

	t.Run("an engine of your own gets adapter creds from auth creds", func(t *testing.T) {
		f := t.TempDir() + "/extra.creds"
		if _, errOut, code := sy(t, nil, "", "auth", "creds", st.Auth().Dir(), "--role", "adapter", "--replica", "extra-0", "--out", f); code != 0 {
			t.Fatalf("auth creds: exit %d: %s", code, errOut)
		}
		nc, err := nats.Connect(st.NATSURL(), nats.UserCredentials(f), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		if _, err := nc.SubscribeSync("llm.replica.extra-0"); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil || nc.LastError() != nil {
			t.Errorf("subscribing its own replica subject: %v %v", err, nc.LastError())
		}
		if _, err := nc.SubscribeSync("llm.replica.l70-prem-0"); err != nil {
			t.Fatal(err)
		}
		_ = nc.Flush()
		if !errors.Is(nc.LastError(), nats.ErrPermissionViolation) {
			t.Errorf("subscribing another replica's subject: %v, want a permissions violation", nc.LastError())
		}
	})

	t.Run("a revoked creds file is refused", func(t *testing.T) {
		// intern is revoked last: nothing after this subtest uses it.
		old, err := os.ReadFile(st.Creds(tenant("intern")))
		if err != nil {
			t.Fatal(err)
		}
		before := mustConnectAs(t, st, tenant("intern"))
		if _, err := before.Request("llm.route.intern", []byte(`{"model":"chat-small","max_tokens":1,"messages":[{"role":"user","content":"x"}]}`), 5*time.Second); err != nil {
			t.Fatalf("intern before revocation: %v", err)
		}
		out, errOut, code := sy(t, nil, "", "auth", "revoke", st.Auth().Dir(), "--role", "tenant", "--tenant", "intern", "--nats", st.NATSURL())
		if code != 0 || !strings.Contains(out, "pushed") {
			t.Fatalf("auth revoke: exit %d: %s %s", code, out, errOut)
		}
		f := t.TempDir() + "/old.creds"
		if err := os.WriteFile(f, old, 0o600); err != nil {
			t.Fatal(err)
		}
		testkit.CheckFor(t, 5*time.Second, 50*time.Millisecond, func() error {
			nc, err := nats.Connect(st.NATSURL(), nats.UserCredentials(f))
			if err == nil {
				nc.Close()
				return errors.New("the revoked creds still connect")
			}
			return nil
		})
	})

	t.Run("a gateway may ask whether a broker answers, for /readyz; only a deciding one pings the adapters", func(t *testing.T) {
		gw := mustConnectAs(t, st, roleGateway)
		if _, err := gw.Request("$SRV.PING."+subjects.BrokerService, nil, 5*time.Second); err != nil {
			t.Errorf("$SRV.PING.%s as the gateway: %v", subjects.BrokerService, err)
		}
		// A deciding gateway times the adapters' answers by region.
		if _, err := gw.Request("$SRV.PING."+subjects.AdapterService, nil, 5*time.Second); err != nil {
			t.Errorf("$SRV.PING.%s as the deciding gateway: %v", subjects.AdapterService, err)
		}
		relay := mustConnectAs(t, st, roleRelay)
		if _, err := relay.Request("$SRV.PING."+subjects.AdapterService, nil, time.Second); err == nil {
			t.Errorf("the relaying gateway pinged the adapters")
		}
	})
}

// TestAuthCommands drives `switchyard auth` without a server: init makes
// the configuration and a creds file per identity, creds mints one, and bad
// usage exits 2.
func TestAuthCommands(t *testing.T) {
	dir := t.TempDir()
	out, errOut, code := sy(t, nil, "", "auth", "init", dir, "--tenants", "acme,beta", "--replicas", "r-0")
	if code != 0 || !strings.Contains(out, "server.conf") {
		t.Fatalf("auth init: exit %d: %s %s", code, out, errOut)
	}
	for _, f := range []string{"server.conf", "creds/operator.creds", "creds/gateway.creds", "creds/gateway-relay.creds", "creds/broker.creds",
		"creds/observer.creds", "creds/adapter-r-0.creds", "creds/tenant-acme.creds", "creds/tenant-beta.creds"} {
		if _, err := os.Stat(dir + "/" + f); err != nil {
			t.Errorf("auth init: %v", err)
		}
	}
	conf, _ := os.ReadFile(dir + "/server.conf")
	if !strings.Contains(string(conf), "operator:") || !strings.Contains(string(conf), "resolver_preload") || !strings.Contains(string(conf), "max_control_line: 16384") {
		t.Errorf("server.conf:\n%s", conf)
	}
	if out, errOut, code := sy(t, nil, "", "auth", "creds", dir, "--role", "broker", "--region", "eu"); code != 0 || !strings.Contains(out, "BEGIN NATS USER JWT") {
		t.Errorf("auth creds --region: exit %d: %s %s", code, out, errOut)
	}
	out, _, code = sy(t, nil, "", "auth", "creds", dir, "--role", "tenant", "--tenant", "acme")
	if code != 0 || !strings.Contains(out, "BEGIN NATS USER JWT") || !strings.Contains(out, "BEGIN USER NKEY SEED") {
		t.Errorf("auth creds to stdout: exit %d: %s", code, out)
	}
	for _, args := range [][]string{
		{"auth", "creds", dir, "--role", "adapter"},
		{"auth", "creds", dir, "--role", "root"},
		{"auth", "creds", dir, "--role", "gateway", "--tenant", "acme"},
		{"auth", "creds", dir, "--role", "observer", "--region", "eu"},
		{"auth", "creds", dir, "--role", "broker", "--region", "e.u"},
		{"auth", "revoke", dir, "--role", "broker", "--region", "eu"},
		{"auth", "frobnicate"},
	} {
		if _, _, code := sy(t, nil, "", args...); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
	if _, errOut, code := sy(t, nil, "", "auth", "creds", dir, "--role", "tenant", "--tenant", "nobody"); code != 1 || !strings.Contains(errOut, "no account") {
		t.Errorf("creds for a tenant without an account: exit %d: %s", code, errOut)
	}
	if _, errOut, code := sy(t, nil, "", "auth", "creds", t.TempDir(), "--role", "gateway"); code != 1 || !strings.Contains(errOut, "auth init") {
		t.Errorf("creds from an empty directory: exit %d: %s", code, errOut)
	}
	// Again with another tenant: the existing creds stay valid (same keys).
	before, _ := os.ReadFile(dir + "/users/gateway.nk")
	if _, _, code := sy(t, nil, "", "auth", "init", dir, "--tenants", "gamma"); code != 0 {
		t.Fatalf("auth init again: exit %d", code)
	}
	after, _ := os.ReadFile(dir + "/users/gateway.nk")
	if string(before) != string(after) {
		t.Error("auth init again replaced the gateway's key")
	}
	if _, err := os.Stat(dir + "/creds/tenant-gamma.creds"); err != nil {
		t.Error(err)
	}
}
