package budget_test

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/budget"
	"github.com/switchyard-llm/switchyard/natsconn/natstest"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

func bucket(t *testing.T) jetstream.KeyValue {
	t.Helper()
	_, url := natstest.Start(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	kv, err := js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: subjects.BudgetsBucket})
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// Four deciders reserve 200 requests at once against a budget that covers
// ten: exactly ten fit, and the spend settled never exceeds the limit.
func TestConcurrentReservationsAcrossDecidersNeverExceedTheLimit(t *testing.T) {
	kv := bucket(t)
	const worst = budget.Micro(100_000) // 0.1 a request
	need := budget.Need{Kind: budget.KindTenant, Name: "acme", Tenant: "acme", Budget: table.Budget{Limit: 1, Period: table.PeriodMonth}}
	var spenders []*budget.Spender
	for i := range 4 {
		spenders = append(spenders, budget.NewSpender(budget.Config{KV: kv, Holder: "d" + strconv.Itoa(i)}))
	}
	var admitted, refused atomic.Int64
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Go(func() {
			sp := spenders[i%4]
			id := "r" + strconv.Itoa(i)
			_, ref, err := sp.Reserve(context.Background(), id, []budget.Need{need}, &budget.Hold{Amount: worst}, time.Now().Add(time.Minute))
			switch {
			case err != nil:
				t.Error(err)
			case ref != nil:
				if ref.Need.Kind != budget.KindTenant || ref.Need.Name != "acme" {
					t.Errorf("refusal names %+v", ref.Need)
				}
				refused.Add(1)
			default:
				admitted.Add(1)
				sp.Settle(id, worst)
			}
		})
	}
	wg.Wait()
	if admitted.Load() > 10 || admitted.Load()+refused.Load() != 200 {
		t.Fatalf("admitted %d, refused %d: a budget of 10 requests", admitted.Load(), refused.Load())
	}
	for _, sp := range spenders {
		sp.Flush(context.Background(), true)
	}
	sp, err := budget.Read(context.Background(), kv, need, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if sp.Spent != budget.Micro(admitted.Load())*worst || sp.Leased != 0 {
		t.Fatalf("bucket says %+v after %d settled at %d", sp, admitted.Load(), worst)
	}
	if admitted.Load() < 5 {
		t.Fatalf("only %d of 10 admitted: the leases held the budget back", admitted.Load())
	}
}

// A decider that dies with reservations open leaves a lease that expires;
// the next writer moves it to spent whole, so nothing it may have served
// is lost to the budget.
func TestADeadDecidersLeaseExpiresIntoSpent(t *testing.T) {
	kv := bucket(t)
	now := time.Now()
	clock := func() time.Time { return now }
	need := budget.Need{Kind: budget.KindKey, Name: "abcdef012345", Tenant: "acme", Budget: table.Budget{Limit: 1, Period: table.PeriodTotal}}
	dead := budget.NewSpender(budget.Config{KV: kv, Holder: "dead", Now: clock, LeaseTTL: time.Second})
	if _, ref, err := dead.Reserve(context.Background(), "a", []budget.Need{need}, &budget.Hold{Amount: 300_000}, now.Add(time.Hour)); err != nil || ref != nil {
		t.Fatal(err, ref)
	}
	now = now.Add(2 * time.Second) // past its lease
	live := budget.NewSpender(budget.Config{KV: kv, Holder: "live", Now: clock})
	left, ref, err := live.Reserve(context.Background(), "b", []budget.Need{need}, &budget.Hold{Amount: 100_000}, now.Add(time.Hour))
	if err != nil || ref != nil {
		t.Fatal(err, ref)
	}
	sp, _ := budget.Read(context.Background(), kv, need, now)
	if sp.Spent < 300_000 {
		t.Fatalf("the dead lease was not charged: %+v", sp)
	}
	if left > 700_000-100_000 {
		t.Fatalf("remaining %v counts the dead decider's reservation as free", left)
	}
	// Settling a request this decider never held is refused.
	if _, ok := live.Settle("a", 1); ok {
		t.Fatal("settled another decider's reservation")
	}
}

// An alert-only budget never refuses, and a crossing of 80% and of 100% is
// told once each.
func TestAlertOnlyBudgetWarnsAndNeverRefuses(t *testing.T) {
	kv := bucket(t)
	var mu sync.Mutex
	var shares []int
	sp := budget.NewSpender(budget.Config{KV: kv, Holder: "d", OnCross: func(c budget.Crossing) {
		mu.Lock()
		shares = append(shares, c.Share)
		mu.Unlock()
	}})
	need := budget.Need{Kind: budget.KindTenant, Name: "acme", Tenant: "acme", Budget: table.Budget{Limit: 1, Period: table.PeriodDay, AlertOnly: true}}
	for i := range 15 {
		_, ref, err := sp.Reserve(context.Background(), strconv.Itoa(i), []budget.Need{need}, &budget.Hold{Amount: 100_000}, time.Now().Add(time.Hour))
		if err != nil || ref != nil {
			t.Fatalf("request %d: %v %+v", i, err, ref)
		}
		sp.Settle(strconv.Itoa(i), 100_000)
		sp.Flush(context.Background(), false)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(shares) != 2 || shares[0] != 80 || shares[1] != 100 {
		t.Fatalf("crossings told: %v, want [80 100]", shares)
	}
}

// With a budget large beside a request, a lease covers many reservations:
// three deciders reserving 1,500 requests at once make far fewer than one
// round trip to the bucket a request.
func TestLeasesCostLessThanARoundTripARequest(t *testing.T) {
	kv := bucket(t)
	need := budget.Need{Kind: budget.KindTenant, Name: "acme", Tenant: "acme", Budget: table.Budget{Limit: 3, Period: table.PeriodMonth}}
	const worst = budget.Micro(1000) // 1/3000 of the limit
	var spenders []*budget.Spender
	for i := range 3 {
		spenders = append(spenders, budget.NewSpender(budget.Config{KV: kv, Holder: "d" + strconv.Itoa(i)}))
	}
	var wg sync.WaitGroup
	for w := range 30 {
		wg.Go(func() {
			sp := spenders[w%3]
			for i := range 50 {
				id := strconv.Itoa(w) + "-" + strconv.Itoa(i)
				_, ref, err := sp.Reserve(context.Background(), id, []budget.Need{need}, &budget.Hold{Amount: worst}, time.Now().Add(time.Minute))
				if err != nil || ref != nil {
					t.Errorf("%v %+v", err, ref)
					return
				}
				sp.Settle(id, worst/2)
			}
		})
	}
	wg.Wait()
	var ops, asked uint64
	for _, sp := range spenders {
		sp.Flush(context.Background(), true)
		o, a, _ := sp.Counts()
		ops, asked = ops+o, asked+a
	}
	t.Logf("%d round trips for %d requests: %.3f a request", ops, asked, float64(ops)/float64(asked))
	if asked != 1500 || ops*10 > asked {
		t.Fatalf("%d round trips for %d requests", ops, asked)
	}
	sp, _ := budget.Read(context.Background(), kv, need, time.Now())
	if sp.Spent != 1500*worst/2 || sp.Leased != 0 {
		t.Fatalf("spend %+v, want %d settled and nothing leased", sp, 1500*worst/2)
	}
}

// A decider that dies with reservations open: its lease is charged whole
// at once, and once its last deadline has passed the ledger corrects the
// spend to what its requests' records say they cost: one settled before
// it died, one served after, one never served.
func TestADeadDecidersSpendIsCorrectedFromTheLedger(t *testing.T) {
	_, url := natstest.Start(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	if _, err := budget.Ensure(ctx, js, "", 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, subjects.BudgetsBucket)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	need := budget.Need{Kind: budget.KindKey, Name: "abcdef012345", Tenant: "acme", Budget: table.Budget{Limit: 1, Period: table.PeriodTotal}}
	dead := budget.NewSpender(budget.Config{KV: kv, Holder: "dead", Now: clock, LeaseTTL: time.Second})
	var key string
	for _, id := range []string{"a", "b", "c"} {
		h := &budget.Hold{Amount: 300_000}
		if _, ref, err := dead.Reserve(ctx, id, []budget.Need{need}, h, clock().Add(time.Second)); err != nil || ref != nil {
			t.Fatal(err, ref)
		}
		key = h.Key(budget.KindKey)
	}
	if key != "key.abcdef012345.total" {
		t.Fatalf("the hold's key: %q", key)
	}
	dead.Settle("a", 100_000)
	dead.Flush(ctx, false) // a's cost moves to spent; b and c stay open
	for _, r := range []subjects.LedgerRecord{
		{RequestID: "a", Tenant: "acme", CostMicro: 100_000, Holder: "dead", Budgets: [2]string{"", key}},
		{RequestID: "b", Tenant: "acme", CostMicro: 50_000, Holder: "dead", Budgets: [2]string{"", key}},
		// Another decider's request, and one of another budget.
		{RequestID: "x", Tenant: "acme", CostMicro: 7, Holder: "other", Budgets: [2]string{"", key}},
		{RequestID: "y", Tenant: "acme", CostMicro: 9, Holder: "dead", Budgets: [2]string{"tenant.acme.total", ""}},
	} {
		if _, err := js.Publish(ctx, subjects.New("").Ledger("acme"), jsonOf(t, r)); err != nil {
			t.Fatal(err)
		}
	}
	advance(2 * time.Second) // the dead lease expires
	live := budget.NewSpender(budget.Config{KV: kv, Holder: "live", Now: clock, Served: budget.Served(js, "")})
	if _, ref, err := live.Reserve(ctx, "d", []budget.Need{need}, &budget.Hold{Amount: 50_000}, clock().Add(time.Hour)); err != nil || ref != nil {
		t.Fatal(err, ref)
	}
	sp, _ := budget.Read(ctx, kv, need, clock())
	if sp.Spent < 100_000+800_000 {
		t.Fatalf("the dead lease was not charged whole at once: %+v", sp)
	}
	live.Flush(ctx, false)
	if sp, _ = budget.Read(ctx, kv, need, clock()); sp.Spent < 900_000 {
		t.Fatalf("corrected before the dead decider's last deadline: %+v", sp)
	}
	advance(10 * time.Second) // its deadlines and the grace pass
	live.Flush(ctx, false)
	if sp, _ = budget.Read(ctx, kv, need, clock()); sp.Spent != 150_000 {
		t.Fatalf("spent %v after the correction; the ledger holds 0.15 of the dead decider's requests", sp.Spent)
	}
}

func jsonOf(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
