package test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/auth"
	"github.com/switchyard-llm/switchyard/budget"
	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects"
)

// budgetModel is the model chat-large resolves to in the dev table; the
// tests price it.
const budgetModel = "llama-3-70b-instruct"

// budgetBody asks for at most 8 tokens: at an output price of 1000 per
// million tokens and no input price, its worst case is 0.008.
const (
	budgetBody  = `{"model":"chat-large","max_tokens":8,"messages":[{"role":"user","content":"count to three"}]}`
	budgetWorst = budget.Micro(8_000)
)

// priceModel puts a price on budgetModel: inputs free, outputs 1000 per
// million tokens.
func priceModel(t *testing.T, kv jetstream.KeyValue) {
	t.Helper()
	ctx := context.Background()
	e, err := kv.Get(ctx, "models."+budgetModel)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(e.Value(), &m); err != nil {
		t.Fatal(err)
	}
	m["price"] = map[string]any{"input": 0, "output": 1000}
	if _, err := kv.Put(ctx, "models."+budgetModel, jsonMarshal(m)); err != nil {
		t.Fatal(err)
	}
}

// addKey writes an API key for tenant with value's budget (nil: none) and
// returns the key and its id.
func addKey(t *testing.T, kv jetstream.KeyValue, tenant string, b map[string]any) (key, id string) {
	t.Helper()
	key = "sk-budget-" + tenant + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	sum := sha256.Sum256([]byte(key))
	hash := hex.EncodeToString(sum[:])
	v := map[string]any{"tenant": tenant}
	if b != nil {
		v["budget"] = b
	}
	if _, err := kv.Put(context.Background(), "keys."+hash, jsonMarshal(v)); err != nil {
		t.Fatal(err)
	}
	return key, hash[:12]
}

// secondGateway runs another gateway on the stack's bus, deciding with
// decide, and returns its URL.
func secondGateway(t *testing.T, st *devstack.Stack, decide string) (*gateway.Gateway, string) {
	t.Helper()
	return gatewayOnStack(t, st, gateway.Config{ID: "gw-2", Decide: decide})
}

// gatewayOnStack runs a gateway of cfg on the stack's bus, under the identity
// its way of deciding needs, until the test ends, and returns its URL.
func gatewayOnStack(t *testing.T, st *devstack.Stack, cfg gateway.Config) (*gateway.Gateway, string) {
	t.Helper()
	role := auth.Role{Kind: auth.RoleGateway, Region: cfg.Region}
	if cfg.Decide == gateway.DecideBroker {
		role.Kind = auth.RoleGatewayRelay
	}
	nc, err := connectAs(st, role)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return gatewayOnConn(t, nc, cfg)
}

// gatewayOnConn serves a gateway of cfg on nc until the test ends, and
// returns it with its URL.
func gatewayOnConn(t *testing.T, nc *nats.Conn, cfg gateway.Config) (*gateway.Gateway, string) {
	t.Helper()
	g, err := gateway.New(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln := testkit.Listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return g, "http://" + ln.Addr().String()
}

// ledgerTotal sums the LEDGER records of tenant (and, when key is set, of
// that key) as an operator reads them.
func ledgerTotal(t *testing.T, st *devstack.Stack, tenant, key string) (records int, total budget.Micro) {
	t.Helper()
	nc, err := connectAs(st, auth.Role{Kind: auth.RoleOperator})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = budget.ReadLedger(ctx, js, "", tenant, time.Time{}, func(r *subjects.LedgerRecord) error {
		if key == "" || r.Key == key {
			records++
			total += budget.Micro(r.CostMicro)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return records, total
}

// burst sends n requests at once, spread over the urls, and counts the
// answers: every refusal must be a budget_exceeded 429 with its headers.
func burst(t *testing.T, urls []string, key string, n int) (served int) {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			status, h, body := chatOnce(t, urls[i%len(urls)], budgetBody, bearer(key))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case status == 200:
				served++
				if h.Get("X-Switchyard-Budget-Remaining") == "" {
					t.Errorf("a 200 under a budget without X-Switchyard-Budget-Remaining: %v", h)
				}
			case status == 429 && strings.Contains(body, `"budget_exceeded"`):
				if h.Get("Retry-After") == "" || h.Get("X-Switchyard-Budget-Remaining") == "" {
					t.Errorf("budget 429 without Retry-After or X-Switchyard-Budget-Remaining: %v", h)
				}
			default:
				t.Errorf("status %d: %s", status, body)
			}
		})
	}
	wg.Wait()
	return served
}

// Two hundred requests at once through two gateways (one relaying to the
// two brokers, one deciding itself: three deciders) against a budget that
// covers ten: the ledger's total is at most the limit plus one request's
// worst case, every refusal is budget_exceeded, and each 200 is one record.
func TestBudgetHoldsUnderConcurrencyAcrossDeciders(t *testing.T) {
	st := startStack(t, devstack.Config{Brokers: 2, Replicas: devstack.ReplicasNamed("l70-gen-0", "l70-gen-1"),
		Gateway: gateway.Config{Decide: gateway.DecideBroker}})
	kv := kvBucket(t, st)
	priceModel(t, kv)
	limit := 10 * budgetWorst
	ctx := context.Background()
	if _, err := kv.Put(ctx, "tenants.spender", []byte(`{"tier":"standard","budget":{"limit":0.08,"period":"month"}}`)); err != nil {
		t.Fatal(err)
	}
	tenantKey, _ := addKey(t, kv, "spender", nil)
	keyed, keyID := addKey(t, kv, "acme", map[string]any{"limit": 0.08, "period": "day"})
	g2, url2 := secondGateway(t, st, gateway.DecideLocal)
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, testkit.Cond("the second gateway to hear the replicas", func() bool {
		resp, err := http.Get(url2 + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}))
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, testkit.Cond("every part to read the budgets", func() bool {
		for _, tb := range [...]func() bool{
			func() bool {
				t := st.Gateway().Table()
				return t != nil && hasKeys(t.Keys, tenantKey, keyed) && t.Tenants["spender"] != nil
			},
			func() bool {
				t := g2.Table()
				return t != nil && t.Tenants["spender"] != nil && hasKeys(t.Keys, tenantKey, keyed)
			},
			func() bool {
				t := st.Broker(0).Table()
				return t.Tenants["spender"] != nil && t.Models[budgetModel].Price != nil && hasKeys(t.Keys, tenantKey, keyed)
			},
			func() bool {
				t := st.Broker(1).Table()
				return t.Tenants["spender"] != nil && t.Models[budgetModel].Price != nil && hasKeys(t.Keys, tenantKey, keyed)
			},
			func() bool {
				t := g2.Decider().Table()
				return t.Models[budgetModel].Price != nil && hasKeys(t.Keys, tenantKey, keyed)
			},
		} {
			if !tb() {
				return false
			}
		}
		return true
	}))
	urls := []string{st.GatewayURL(), url2}
	for _, c := range []struct {
		name, key, tenant, keyID string
	}{
		{"tenant budget", tenantKey, "spender", ""},
		{"key budget", keyed, "acme", keyID},
	} {
		t.Run(c.name, func(t *testing.T) {
			served := burst(t, urls, c.key, 200)
			if served == 0 || served > 10 {
				t.Fatalf("%d of 200 served; the budget covers 10", served)
			}
			var records int
			var total budget.Micro
			testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
				records, total = ledgerTotal(t, st, c.tenant, c.keyID)
				if records != served {
					return fmt.Errorf("%d ledger records for %d served", records, served)
				}
				return nil
			})
			if total > limit+budgetWorst {
				t.Fatalf("the ledger holds %v for a limit of %v", total, limit)
			}
			t.Logf("%d served, ledger total %v of a limit of %v", served, total, limit)
		})
	}
	var ops, asked, held uint64
	for _, sp := range []*budget.Spender{st.Broker(0).Spender(), st.Broker(1).Spender(), g2.Decider().Spender()} {
		if sp != nil {
			o, a, h := sp.Counts()
			ops, asked, held = ops+o, asked+a, held+h
		}
	}
	t.Logf("shared spend: %d JetStream round trips for %d requests (%d admitted)", ops, asked, held)
	// The dashboard shows the tenant's spend against its budget.
	testkit.CheckFor(t, 10*time.Second, 100*time.Millisecond, func() error {
		resp, err := http.Get(st.GatewayURL() + "/ui/budgets")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var views []struct {
			Tenant       string
			Spent, Limit float64
			Currency     string
		}
		if err := json.NewDecoder(resp.Body).Decode(&views); err != nil {
			return err
		}
		for _, v := range views {
			if v.Tenant == "spender" && v.Spent > 0 && v.Spent <= 0.08 && v.Limit == 0.08 && v.Currency == "USD" {
				return nil
			}
		}
		return fmt.Errorf("the dashboard's budgets: %+v", views)
	})
}

// hasKeys reports whether a table's keys (by sha256 hex) hold every API
// key given: a part reads a key written a moment ago only once its table
// has it.
func hasKeys[V any](m map[string]V, keys ...string) bool {
	for _, k := range keys {
		sum := sha256.Sum256([]byte(k))
		if _, ok := m[hex.EncodeToString(sum[:])]; !ok {
			return false
		}
	}
	return true
}

// A broker SIGKILLed with reservations open loses none of the money: the
// requests it admitted are served and recorded in the ledger by their
// adapter, whose total equals what the engine generated; its lease expires
// and the next writer moves it to spent whole, so the budget counts at
// least what the ledger holds; once the dead broker's last deadline has
// passed, the ledger corrects the spend to what the engine served.
func TestBudgetSurvivesADeciderSIGKILLedWithReservationsOpen(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs six processes")
	}
	bin := binary(t)
	natsURL := bareNATS(t)
	env := []string{"NATS_URL=" + natsURL, "HOME=" + t.TempDir()}
	tableFile := filepath.Join(repoRoot(), "deploy", "examples", "table.json")
	for _, args := range [][]string{{"table", "import", tableFile}, {"table", "init", "--ledger-max-age", "1d"}} {
		if out, errOut, code := sy(t, env, "", args...); code != 0 {
			t.Fatalf("%v: exit %d: %s %s", args, code, out, errOut)
		}
	}
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	routing, err := js.KeyValue(ctx, subjects.DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	// One unit of the currency per output token: the ledger's total in
	// units is the tokens the engine generated.
	e, _ := routing.Get(ctx, "models.qwen-coder-32b")
	var m map[string]any
	_ = json.Unmarshal(e.Value(), &m)
	m["price"] = map[string]any{"input": 0, "output": 1e6}
	if _, err := routing.Put(ctx, "models.qwen-coder-32b", jsonMarshal(m)); err != nil {
		t.Fatal(err)
	}
	if _, err := routing.Put(ctx, "tenants.default", []byte(`{"tier":"standard","budget":{"limit":1000000,"period":"month"}}`)); err != nil {
		t.Fatal(err)
	}
	brokerA := startProc(t, "broker-a", bin, "broker", "--nats", natsURL, "--id", "broker-a", "--budget-lease-ttl", "2s", "--metrics-listen", "", "--state-dir", t.TempDir())
	gwFile, gwAddr := listenFile(t)
	startProcWith(t, "gateway", []*os.File{gwFile}, bin, "gateway", "--nats", natsURL, "--decide", "broker", "--listen", "fd:3", "--admin-listen", "127.0.0.1:0", "--state-dir", t.TempDir())
	gw := "http://" + gwAddr
	engFile, engAddr := listenFile(t)
	engine := "http://" + engAddr
	startProcWith(t, "engine", []*os.File{engFile}, bin, "engine-sim", "--model", "qwen-coder-32b", "--listen", "fd:3")
	startProc(t, "adapter", bin, "adapter", "--nats", natsURL, "--engine", engine, "--replica", "coder-a",
		"--model", "qwen-coder-32b", "--version", "v1.0.0", "--pool", "general")
	// Every request through the broker that dies has a deadline 15 s away:
	// its reservations' last deadline.
	timed := func(body string) outcome {
		req, _ := http.NewRequestWithContext(ctx, "POST", gw+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Request-Timeout", "15")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return outcome{err: err}
		}
		defer resp.Body.Close()
		return readAnswer(resp)
	}
	testkit.CheckFor(t, 60*time.Second, 20*time.Millisecond, func() error {
		if o := timed(`{"model":"code","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`); o.status != 200 {
			return fmt.Errorf("not serving yet: %v", o)
		}
		return nil
	})
	// Requests in flight on the engine when their broker dies.
	results := make(chan outcome, 4)
	for range cap(results) {
		go func() {
			results <- timed(`{"model":"code","max_tokens":60,"messages":[{"role":"user","content":"write a function"}]}`)
		}()
	}
	testkit.CheckFor(t, 30*time.Second, 5*time.Millisecond, testkit.Cond("the engine to run the requests", func() bool { return running(engine) > 0 }))
	brokerA.kill()
	for range cap(results) {
		if o := <-results; o.status != 200 {
			t.Fatalf("a request whose broker was killed: %+v", o)
		}
	}
	var ledgerUnits float64
	ledger := func() (budget.Micro, error) {
		var total budget.Micro
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		err := budget.ReadLedger(rctx, js, "", "default", time.Time{}, func(r *subjects.LedgerRecord) error {
			total += budget.Micro(r.CostMicro)
			return nil
		})
		return total, err
	}
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		total, err := ledger()
		if err != nil {
			return err
		}
		ledgerUnits = total.Amount()
		if gen := engineMetric(engine, "vllm:generation_tokens_total"); ledgerUnits != gen {
			return fmt.Errorf("the ledger holds %v, the engine generated %v tokens", ledgerUnits, gen)
		}
		return nil
	})
	// A broker that lives sees the dead one's lease expire, and moves it to
	// spent whole the next time it writes the budget.
	startProc(t, "broker-b", bin, "broker", "--nats", natsURL, "--id", "broker-b", "--metrics-listen", "", "--state-dir", t.TempDir())
	budgets, err := js.KeyValue(ctx, subjects.BudgetsBucket)
	if err != nil {
		t.Fatal(err)
	}
	_, _, pid := budget.Bounds("month", time.Now())
	type spendRecord struct {
		Spent   budget.Micro               `json:"spent"`
		Leases  map[string]json.RawMessage `json:"leases"`
		Expired map[string]json.RawMessage `json:"expired"`
	}
	read := func() (rec spendRecord, raw []byte, err error) {
		e, err := budgets.Get(ctx, "tenant.default."+pid)
		if err != nil {
			return rec, nil, err
		}
		return rec, e.Value(), json.Unmarshal(e.Value(), &rec)
	}
	var whole budget.Micro
	testkit.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		if o := send(ctx, gw, `{"model":"code","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`); o.status != 200 {
			return fmt.Errorf("after the kill: %+v", o)
		}
		rec, raw, err := read()
		if err != nil {
			return err
		}
		for holder := range rec.Leases {
			if strings.HasPrefix(holder, "broker-a-") {
				return fmt.Errorf("the dead broker's lease is still there: %s", raw)
			}
		}
		if rec.Spent.Amount() < ledgerUnits {
			return fmt.Errorf("spent %v is less than the ledger's %v", rec.Spent.Amount(), ledgerUnits)
		}
		whole = rec.Spent
		return nil
	})
	// No more requests: once the dead broker's last deadline is 5 s past
	// and the live one has flushed what it settled, spent is the ledger's
	// total.
	var served budget.Micro
	testkit.CheckFor(t, 60*time.Second, 200*time.Millisecond, func() error {
		rec, raw, err := read()
		if err != nil {
			return err
		}
		if served, err = ledger(); err != nil {
			return err
		}
		if len(rec.Expired) > 0 || rec.Spent != served {
			return fmt.Errorf("spent %v, the ledger %v: %s", rec.Spent, served, raw)
		}
		return nil
	})
	t.Logf("the engine generated and the ledger held %v units when the broker died; the dead lease charged whole made spent %v, corrected to the ledger's %v", ledgerUnits, whole, served)
}

// A reading whose replica fails mid-answer (its engine dies, or its
// adapter crashes) and resumes on the other replica is charged once: one
// record under the request's id, holding the output tokens the client got,
// each once, and the continuation's re-prefill as prompt.
func TestResumedRequestIsChargedOnce(t *testing.T) {
	for _, c := range []struct {
		name string
		fail func(st *devstack.Stack, id string) error
	}{
		{"engine dies", func(st *devstack.Stack, id string) error { st.Faults(id).Kill(); return nil }},
		{"adapter crashes", func(st *devstack.Stack, id string) error { return st.CrashReplica(id) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := startStack(t, devstack.Config{Replicas: l8(), Speed: 1, DeterministicText: true,
				Gateway: gateway.Config{ProbeAfter: 200 * time.Millisecond}})
			kv := kvBucket(t, st)
			ctx := context.Background()
			e, err := kv.Get(ctx, "models.llama-3-8b-instruct")
			if err != nil {
				t.Fatal(err)
			}
			var m map[string]any
			_ = json.Unmarshal(e.Value(), &m)
			m["price"] = map[string]any{"input": 1e6, "output": 1e6} // a unit per token
			if _, err := kv.Put(ctx, "models.llama-3-8b-instruct", jsonMarshal(m)); err != nil {
				t.Fatal(err)
			}
			if _, err := kv.Put(ctx, "tenants.default", []byte(`{"tier":"standard","budget":{"limit":100000,"period":"day"}}`)); err != nil {
				t.Fatal(err)
			}
			testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, testkit.Cond("the price in force", func() bool {
				return st.Broker(0).Table().Models["llama-3-8b-instruct"].Price != nil && st.Broker(0).Table().Tenants["default"].Budget != nil
			}))
			body := strings.Replace(resumeBody(true, ""), `,"stream_options":null`, `,"stream_options":{"include_usage":true}`, 1)
			got := askChat(t, st.GatewayURL(), body, 100, func() {
				for _, id := range []string{"l8-gen-0", "l8-gen-1"} {
					if st.Engine(id).InFlight() > 0 {
						if err := c.fail(st, id); err != nil {
							t.Error(err)
						}
						return
					}
				}
				t.Error("no engine works on the reading")
			})
			if !got.done || got.completed != 500 {
				t.Fatalf("resumed reading: done %v, %d tokens", got.done, got.completed)
			}
			if n := metric(st, "switchyard_gateway_resumes_total", map[string]string{"outcome": "completed"}); n != 1 {
				t.Fatalf("resumes completed: %v, want 1", n)
			}
			var recs []subjects.LedgerRecord
			read := func() error {
				recs = recs[:0]
				nc, err := connectAs(st, auth.Role{Kind: auth.RoleOperator})
				if err != nil {
					return err
				}
				defer nc.Close()
				js, _ := jetstream.New(nc)
				rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				return budget.ReadLedger(rctx, js, "", "default", time.Time{}, func(r *subjects.LedgerRecord) error {
					recs = append(recs, *r)
					return nil
				})
			}
			// The failed part ended long before the continuation: its record,
			// had it been written, would have taken the request's id first.
			testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
				if err := read(); err != nil {
					return err
				}
				if len(recs) == 0 {
					return errors.New("no ledger record yet")
				}
				return nil
			})
			if len(recs) != 1 {
				t.Fatalf("%d ledger records for one request: %+v", len(recs), recs)
			}
			r := recs[0]
			// The re-prefill reads the prompt and the carried text again: the
			// record's prompt is more than the carried text.
			if !r.Resumed || r.OutputTokens != 500 || r.PromptTokens <= 0 || budget.Micro(r.CostMicro).Amount() != float64(r.PromptTokens+r.OutputTokens) {
				t.Fatalf("the resumed request's record: %+v; the client got 500 tokens", r)
			}
			t.Logf("resumed request: one record, %d prompt tokens (the re-prefill included) and %d output, %v units", r.PromptTokens, r.OutputTokens, r.Cost)
		})
	}
}

// An operator gives a key a budget from the command line; bad amounts,
// periods and keys are refused with what is wrong named; the key's
// requests stop at its budget; GET /v1/usage shows the key its spend;
// `switchyard usage` reads it back from the ledger.
func TestKeyBudgetsFromTheCommandLineAndUsage(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: devstack.ReplicasNamed("l70-gen-0")})
	env := []string{"NATS_URL=" + st.NATSURL(), "NATS_CREDS=" + st.Creds(auth.Role{Kind: auth.RoleOperator}), "HOME=" + t.TempDir()}
	kv := kvBucket(t, st)
	// A model without a price is never refused for budget, and its
	// answers carry no budget header, even under a budget of zero.
	if _, err := kv.Put(context.Background(), "tenants.spender", []byte(`{"budget":{"limit":0,"period":"total"}}`)); err != nil {
		t.Fatal(err)
	}
	zeroKey, _ := addKey(t, kv, "spender", nil)
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, testkit.Cond("the gateway to read the key", func() bool {
		return st.Broker(0).Table().Tenants["spender"] != nil && len(st.Gateway().Table().Keys) > 5
	}))
	if status, h, body := chatOnce(t, st.GatewayURL(), budgetBody, bearer(zeroKey)); status != http.StatusOK || h.Get("X-Switchyard-Budget-Remaining") != "" {
		t.Fatalf("unpriced model under a zero budget: %d %v %s", status, h, body)
	}
	priceModel(t, kv)
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, testkit.Cond("the price in force", func() bool {
		if d := st.Gateway().Decider(); d != nil && d.Table().Models[budgetModel].Price == nil {
			return false
		}
		return st.Broker(0).Table().Models[budgetModel].Price != nil
	}))
	if status, h, body := chatOnce(t, st.GatewayURL(), budgetBody, bearer(zeroKey)); status != 429 || !strings.Contains(body, "budget_exceeded") ||
		!strings.Contains(body, "tenant spender") || h.Get("Retry-After") != "" {
		t.Fatalf("priced model under a zero total budget: %d %v %s", status, h, body)
	}
	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"key", "add", "--tenant", "acme", "--budget", "-1"}, 2, "budget.limit"},
		{[]string{"key", "add", "--tenant", "acme", "--budget", "fifty"}, 2, "not a number"},
		{[]string{"key", "add", "--tenant", "acme", "--budget", "5", "--budget-period", "year"}, 2, "budget.period"},
		{[]string{"key", "budget", "0123456789ab", "5", "day"}, 1, "no API key has id 0123456789ab"},
		{[]string{"key", "budget", "0123456789ab", "5", "fortnight"}, 2, "budget.period"},
		{[]string{"usage", "--by", "week"}, 2, "--by"},
	} {
		if out, errOut, code := sy(t, env, "", c.args...); code != c.code || !strings.Contains(out+errOut, c.says) {
			t.Errorf("%v: exit %d, want %d saying %q: %s%s", c.args, code, c.code, c.says, out, errOut)
		}
	}
	for key, value := range map[string]string{
		"tenants.x":             `{"budget":{"limit":5,"period":"fortnight"}}`,
		"models." + budgetModel: `{"price":{"input":-3,"output":1}}`,
		"tenants.y":             `{"budget":{"limit":"5","period":"day"}}`,
	} {
		out, errOut, code := sy(t, env, value, "table", "put", key, "-")
		field := map[bool]string{true: "budget.", false: "price.input"}[strings.HasPrefix(key, "tenants.")]
		if code == 0 || !strings.Contains(out+errOut, field) {
			t.Errorf("table put %s %s: exit %d: %s%s", key, value, code, out, errOut)
		}
	}
	// The last good price stays in force.
	if p := st.Broker(0).Table().Models[budgetModel].Price; p == nil || p.Output != 1000 {
		t.Fatalf("the price in force after a bad put: %+v", p)
	}

	op, err := connectAs(st, auth.Role{Kind: auth.RoleOperator})
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	events, err := op.SubscribeSync("llm.events.budget.acme")
	if err != nil {
		t.Fatal(err)
	}
	_ = op.Flush()
	out, errOut, code := sy(t, env, "", "key", "add", "--tenant", "acme", "--budget", "0.02", "--budget-period", "day")
	key := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(key, "sk-") {
		t.Fatalf("key add --budget: exit %d: %s%s", code, out, errOut)
	}
	sum := sha256.Sum256([]byte(key))
	id := hex.EncodeToString(sum[:])[:12]
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, testkit.Cond("the key in force", func() bool {
		k, ok := st.Broker(0).Table().Keys[hex.EncodeToString(sum[:])]
		return ok && k.Budget != nil
	}))
	ledgerJS, _ := jetstream.New(op)
	ledgerStream, err := ledgerJS.Stream(context.Background(), subjects.LedgerStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := ledgerStream.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	before := info.State.Msgs
	served := 0
	for range 5 {
		status, h, body := chatOnce(t, st.GatewayURL(), budgetBody, bearer(key))
		if status == 200 {
			served++
			if served == 1 {
				// How long after the answer's end its record is on the
				// stream (logged: a figure, not a check).
				ended := time.Now()
				took := testkit.CheckFor(t, 10*time.Second, 2*time.Millisecond, func() error {
					info, err := ledgerStream.Info(context.Background())
					if err != nil {
						return err
					}
					if info.State.Msgs <= before {
						return errors.New("no record yet")
					}
					return nil
				})
				t.Logf("the ledger record was on the stream within %v of the answer's end (%v polling)", took, time.Since(ended))
			}
			continue
		}
		if status != 429 || !strings.Contains(body, "API key "+id) || !strings.Contains(body, "day budget") || h.Get("Retry-After") == "" {
			t.Fatalf("over the key's budget: %d %v %s", status, h, body)
		}
	}
	if served != 2 {
		t.Fatalf("%d of 5 served under a budget of 2", served)
	}
	for _, share := range []int{80, 100} {
		m, err := events.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("no %d%% event: %v", share, err)
		}
		var ev struct {
			Tenant, Key, Period string
			Share               int
			Limit               float64
		}
		if err := json.Unmarshal(m.Data, &ev); err != nil || ev.Tenant != "acme" || ev.Key != id || ev.Share != share || ev.Limit != 0.02 || ev.Period != "day" {
			t.Fatalf("budget event %s: %v", m.Data, err)
		}
	}
	if got := testkit.Sum(st.Registry(), "switchyard_spend_total", map[string]string{"tenant": "acme", "model": budgetModel}); !(got > 0 && got <= 0.02) {
		t.Errorf("switchyard_spend_total{tenant=acme} = %v after two requests", got)
	}
	// The key's usage, spent as settled and flushed (within a second).
	var u struct {
		Tenant struct {
			Limit *float64 `json:"limit"`
		} `json:"tenant"`
		Key struct {
			Spent, Limit, Remaining *float64
			Period                  *string
			ResetsAt                *string `json:"resets_at"`
		} `json:"key"`
	}
	testkit.CheckFor(t, 10*time.Second, 100*time.Millisecond, func() error {
		req, _ := http.NewRequest("GET", st.GatewayURL()+"/v1/usage", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		if err := json.NewDecoder(resp.Body).Decode(&u); err != nil {
			return err
		}
		if u.Key.Spent == nil || *u.Key.Spent <= 0 {
			return errors.New("no spend yet")
		}
		return nil
	})
	if u.Tenant.Limit != nil || u.Key.Limit == nil || *u.Key.Limit != 0.02 || u.Key.Remaining == nil || *u.Key.Remaining > 0.02-*u.Key.Spent || u.Key.ResetsAt == nil {
		t.Fatalf("GET /v1/usage: %+v %+v", u.Tenant, u.Key)
	}
	// A raised budget admits again.
	if out, errOut, code := sy(t, env, "", "key", "budget", id, "1", "day"); code != 0 || !strings.Contains(out, "budget 1 per day") {
		t.Fatalf("key budget: exit %d: %s%s", code, out, errOut)
	}
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		if status, _, body := chatOnce(t, st.GatewayURL(), budgetBody, bearer(key)); status != 200 {
			return fmt.Errorf("after raising the budget: %d %s", status, body)
		}
		return nil
	})
	testkit.CheckFor(t, 10*time.Second, 100*time.Millisecond, func() error {
		out, errOut, code := sy(t, env, "", "usage", "--json", "--by", "key,model", "--tenant", "acme")
		if code != 0 {
			return fmt.Errorf("usage: exit %d: %s", code, errOut)
		}
		var rep struct {
			Rows []struct {
				Key, Model   string
				Requests     int
				Tenant       *string
				OutputTokens int     `json:"output_tokens"`
				Cost         float64 `json:"cost"`
			} `json:"rows"`
			TotalCost float64 `json:"total_cost"`
		}
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			return err
		}
		for _, r := range rep.Rows {
			if r.Key == id && r.Model == budgetModel && r.Requests == 3 && r.Cost > 0 && r.Tenant == nil && rep.TotalCost >= r.Cost {
				return nil
			}
		}
		return fmt.Errorf("no row of 3 requests for key %s: %s", id, out)
	})
	if out, _, code := sy(t, env, "", "usage", "--by", "day"); code != 0 || !strings.Contains(out, "TOTAL") || !strings.Contains(out, time.Now().UTC().Format(time.DateOnly)) {
		t.Errorf("usage --by day: exit %d:\n%s", code, out)
	}
}

// Only deciders write the spend, only adapters the ledger: a tenant can
// neither read them nor write them; a relaying gateway, an adapter, a
// batcher, an observer and a loader are refused the spend; a broker, a
// gateway, a batcher and a loader the ledger, which the deciders read.
func TestOnlyDecidersWriteTheSpendAndOnlyAdaptersTheLedger(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: devstack.ReplicasNamed("l8-gen-0")})
	refused := func(role auth.Role, subject string) {
		t.Helper()
		nc, err := connectAs(st, role)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		errs := make(chan error, 4)
		nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err })
		_ = nc.Publish(subject, []byte(`{"spent":0}`))
		_ = nc.Flush()
		select {
		case err := <-errs:
			if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
				t.Errorf("%s on %s: %v", role.Name(), subject, err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("%s may publish %s", role.Name(), subject)
		}
	}
	spend := "$KV." + subjects.BudgetsBucket + ".tenant.acme.total"
	tenantCannotReadOrWrite(t, st)
	for _, r := range []auth.Role{{Kind: auth.RoleGatewayRelay}, {Kind: auth.RoleAdapter, ID: "l8-gen-0"}, {Kind: auth.RoleBatcher}, {Kind: auth.RoleObserver}, {Kind: auth.RoleLoader}} {
		refused(r, spend)
	}
	for _, r := range []auth.Role{{Kind: auth.RoleBroker}, {Kind: auth.RoleGateway}, {Kind: auth.RoleBatcher}, {Kind: auth.RoleLoader}} {
		refused(r, "llm.ledger.acme")
	}
	// Deciders read the ledger: its records correct the spend of a decider
	// that died with reservations open.
	if status, _, body := chatOnce(t, st.GatewayURL(), `{"model":"chat-small","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`, nil); status != 200 {
		t.Fatalf("%d: %s", status, body)
	}
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, testkit.Cond("a record on the ledger", func() bool {
		n, _ := ledgerTotal(t, st, "", "")
		return n > 0
	}))
	for _, r := range []auth.Role{{Kind: auth.RoleBroker}, {Kind: auth.RoleGateway}} {
		nc, err := connectAs(st, r)
		if err != nil {
			t.Fatal(err)
		}
		js, _ := jetstream.New(nc)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err = budget.Served(js, "")(ctx, budget.ServedQuery{Key: "tenant.acme.total", Holder: "gone"})
		cancel()
		nc.Close()
		if err != nil {
			t.Errorf("%s reading the ledger: %v", r.Name(), err)
		}
	}
}

// A batch is charged line by line at the model's batch factor, to its
// tenant's budget and to the budget of the key that created it; a line
// refused for budget is a line error in the batch's error file, and the
// batch goes on to its end.
func TestBatchLinesAreChargedAndALineOverBudgetFails(t *testing.T) {
	for _, c := range []struct {
		name   string
		tenant string // acme's value in the table
		budget map[string]any
	}{
		{"tenant budget", `{"tier":"premium","budget":{"limit":0.006,"period":"week"}}`, nil},
		{"key budget", `{"tier":"premium","budget":{"limit":1000,"period":"week"}}`, map[string]any{"limit": 0.006, "period": "week"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := startStack(t, devstack.Config{Replicas: devstack.ReplicasNamed("l70-gen-0", "l70-gen-1")})
			kv := kvBucket(t, st)
			ctx := context.Background()
			e, _ := kv.Get(ctx, "models."+budgetModel)
			var m map[string]any
			_ = json.Unmarshal(e.Value(), &m)
			m["price"] = map[string]any{"input": 0, "output": 1000, "batch": 0.5} // a line of 3 tokens: 0.0015 at most
			if _, err := kv.Put(ctx, "models."+budgetModel, jsonMarshal(m)); err != nil {
				t.Fatal(err)
			}
			if _, err := kv.Put(ctx, "tenants.acme", []byte(c.tenant)); err != nil {
				t.Fatal(err)
			}
			key, keyID := "sk-acme-dev", ""
			if c.budget != nil {
				key, keyID = addKey(t, kv, "acme", c.budget)
			}
			testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, testkit.Cond("the budget in force", func() bool {
				tb := st.Broker(0).Table()
				return tb.Tenants["acme"].Budget != nil && tb.Models[budgetModel].Price != nil && (keyID == "" || hasKeys(tb.Keys, key) && hasKeys(st.Gateway().Table().Keys, key))
			}))
			sum := sha256.Sum256([]byte(key))
			creator := hex.EncodeToString(sum[:])[:12] // every line's record names the key
			cl := client(st, key)
			b := runBatch(t, cl, batchLines(10, "chat-large"))
			b = awaitBatch(t, cl, b.ID, 60*time.Second)
			if b.Status != "completed" || b.RequestCounts.Total != 10 || b.RequestCounts.Completed == 0 || b.RequestCounts.Completed > 4 ||
				b.RequestCounts.Failed != 10-b.RequestCounts.Completed {
				t.Fatalf("batch over its budget: status %s counts %+v (the budget covers 4 lines)", b.Status, b.RequestCounts)
			}
			for id, l := range fileLines(t, cl, b.ErrorFileID) {
				resp, _ := l["response"].(map[string]any)
				body, _ := json.Marshal(resp["body"])
				if resp["status_code"] != 429.0 || !strings.Contains(string(body), "budget_exceeded") {
					t.Errorf("%s: %v", id, l)
				}
				if keyID != "" && !strings.Contains(string(body), "API key "+keyID) {
					t.Errorf("%s: refused for another budget than the key's: %s", id, body)
				}
			}
			var lines int
			testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
				nc, err := connectAs(st, auth.Role{Kind: auth.RoleOperator})
				if err != nil {
					return err
				}
				defer nc.Close()
				js, _ := jetstream.New(nc)
				lines = 0
				return budget.ReadLedger(ctx, js, "", "acme", time.Time{}, func(r *subjects.LedgerRecord) error {
					if r.Priority != subjects.PriorityBatch || r.CostMicro != int64((r.OutputTokens*1000+1)/2) || r.Key != creator {
						return fmt.Errorf("a batch line's record: %+v", r)
					}
					lines++
					return nil
				})
			})
			if lines != int(b.RequestCounts.Completed) {
				t.Fatalf("%d ledger records for %d lines served", lines, b.RequestCounts.Completed)
			}
		})
	}
}

// tenantCannotReadOrWrite checks that a tenant's identity has none of the
// ledger's and the spend's subjects.
func tenantCannotReadOrWrite(t *testing.T, st *devstack.Stack) {
	t.Helper()
	nc, err := connectAs(st, auth.Role{Kind: auth.RoleTenant, ID: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	errs := make(chan error, 8)
	nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err })
	js, _ := jetstream.New(nc)
	for _, read := range []func(context.Context) error{
		func(ctx context.Context) error { _, err := js.Stream(ctx, subjects.LedgerStream); return err },
		func(ctx context.Context) error { _, err := js.KeyValue(ctx, subjects.BudgetsBucket); return err },
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := read(ctx); err == nil {
			t.Fatal("a tenant read the ledger or the budgets")
		}
		cancel()
	}
	for len(errs) > 0 {
		<-errs // the reads' own refusals
	}
	// A forged record or spend is refused by the server.
	if err := nc.Publish("$KV."+subjects.BudgetsBucket+".tenant.acme.total", []byte(`{"spent":0}`)); err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish("llm.ledger.acme", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	for _, what := range []string{"spend", "ledger"} {
		select {
		case err := <-errs:
			if !errors.Is(err, nats.ErrPermissionViolation) && !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
				t.Fatalf("want a permissions violation, got %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("the server did not refuse a tenant's write to the %s", what)
		}
	}
}

// Every answer to a request under a budget carries what is left of it: a
// 200, and each error after the reservation (an engine's own error passed
// on, engines that turn the request away, an engine that is gone).
func TestEveryAnswerUnderABudgetSaysWhatIsLeft(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: devstack.ReplicasNamed("l70-gen-0")})
	kv := kvBucket(t, st)
	priceModel(t, kv)
	if _, err := kv.Put(context.Background(), "tenants.default", []byte(`{"tier":"standard","budget":{"limit":1000,"period":"month"}}`)); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, testkit.Cond("the budget in force", func() bool {
		tb := st.Broker(0).Table()
		return tb.Tenants["default"].Budget != nil && tb.Models[budgetModel].Price != nil
	}))
	f := st.Faults("l70-gen-0")
	for _, c := range []struct {
		name   string
		set    func()
		status int
	}{
		{"served", func() {}, 200},
		{"the engine's 400", func() { f.SetReject(400) }, 400},
		{"the engine's 500", func() { f.SetReject(500) }, 500},
		{"the engine turns it away", func() { f.SetReject(503) }, 503},
		{"the engine is gone", func() { f.SetReject(0); f.Kill() }, 503},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.set()
			status, h, body := chatOnce(t, st.GatewayURL(), budgetBody, nil)
			if status != c.status {
				t.Fatalf("status %d, want %d: %s", status, c.status, body)
			}
			left, err := strconv.ParseFloat(h.Get("X-Switchyard-Budget-Remaining"), 64)
			if err != nil || left <= 0 || left >= 1000 {
				t.Fatalf("status %d without what is left of the budget (%q): %s", status, h.Get("X-Switchyard-Budget-Remaining"), body)
			}
			t.Logf("%d, %v left: %s", status, left, strings.TrimSpace(body))
		})
	}
}
