package decider

import (
	"context"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// withBudget prices llama-3-70b-instruct (3 and 15 per million tokens) and
// gives tenant default a budget of limit per month, in b's table, with the
// budgets bucket on its server.
func withBudget(tb testing.TB, b *Decider, limit string) {
	tb.Helper()
	js, _ := jetstream.New(b.nc)
	if _, err := js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: subjects.BudgetsBucket}); err != nil {
		tb.Fatal(err)
	}
	snap := b.Table().Clone()
	for key, value := range map[string]string{
		"models.llama-3-70b-instruct": `{"versions":["v1.5.0","v1.6.0"],"tier":"hot","max_context_tokens":131072,"default_max_tokens":1024,"price":{"input":3,"output":15}}`,
		"tenants.default":             `{"tier":"standard","budget":{"limit":` + limit + `,"period":"month"}}`,
	} {
		v, err := table.Decode(key, []byte(value))
		if err != nil {
			tb.Fatal(err)
		}
		snap.Set(v, []byte(value))
	}
	b.SetTable(snap)
}

// BenchmarkRoutePathBudget is BenchmarkRoutePath among 64 replicas with
// and without a budget: the reservation against the budget and its
// settlement on the usage, from a lease this decider holds (the round
// trips to the bucket the lease takes are reported per request).
func BenchmarkRoutePathBudget(b *testing.B) {
	for _, on := range []bool{false, true} {
		b.Run("budget="+strconv.FormatBool(on), func(b *testing.B) {
			now := time.Unix(1_800_000_000, 0)
			br := newTestBroker(b, 64, now)
			if on {
				withBudget(b, br, "1000000000")
			}
			sent := gatewayHeaders()
			h := maps.Clone(sent)
			body := []byte(`{"model":"chat-large"}`)
			s := NewScratch()
			var u subjects.Usage
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				h[subjects.HdrConversation][0] = strconv.Itoa(i & 1023)
				h[subjects.HdrRequestID][0] = strconv.Itoa(i)
				a := br.Handle(s, "llm.gw.default", "_INBOX.gw.1", h, body)
				if a.Do != DoForward {
					b.Fatal("not forwarded: ", a.Err)
				}
				if on {
					u = subjects.Usage{RequestID: h[subjects.HdrRequestID][0], PromptTokens: 2048, CompletionTokens: 32}
					br.settleBudget(&u)
				}
				for k := range h {
					if sent[k] == nil {
						delete(h, k)
					}
				}
				for len(br.out) > 0 {
					<-br.out
				}
			}
			if sp := br.Spender(); on && sp != nil {
				ops, asked, _ := sp.Counts()
				b.ReportMetric(float64(ops)/float64(asked), "round-trips/req")
			}
		})
	}
}

// A decision over the budget is refused with budget_exceeded, names the
// tenant and the period, and says when the period resets; the remaining
// budget travels with a forwarded request and the price with it.
func TestHandleChargesTheBudget(t *testing.T) {
	now := time.Unix(1_800_000_000, 0) // 15 Jan 2027
	br := newTestBroker(t, 4, now)
	withBudget(t, br, "0.02") // 2048 prompt × 3 + 64 output × 15 per million: 0.00711 a request
	var refused *subjects.APIError
	forwarded := 0
	for i := range 4 {
		h := gatewayHeaders()
		h[subjects.HdrRequestID][0] = "r" + strconv.Itoa(i)
		a := br.Handle(NewScratch(), "llm.gw.default", "_INBOX.gw.1", h, []byte(`{}`))
		switch a.Do {
		case DoForward:
			forwarded++
			if a.Route.Msg.Header.Get(subjects.HdrRouteBudget) == "" || a.Route.Msg.Header.Get(subjects.HdrPrice) != "3000000,3000000,15000000,1000" {
				t.Fatalf("forwarded without the budget's headers: %v", a.Route.Msg.Header)
			}
		case DoRefuse:
			refused = a.Err
		}
	}
	if forwarded != 2 || refused == nil {
		t.Fatalf("forwarded %d of 4 under a budget of 2, refusal %v", forwarded, refused)
	}
	if refused.Status != 429 || refused.Code != subjects.CodeBudgetExceeded || refused.Headers[subjects.HdrBudgetRemaining] == "" {
		t.Fatalf("refusal %+v", refused)
	}
	wantReset := time.Date(2027, 2, 1, 0, 0, 0, 0, time.UTC).Sub(now)
	if refused.RetryAfter != wantReset {
		t.Fatalf("Retry-After %v, want %v (the month's end)", refused.RetryAfter, wantReset)
	}
	for _, says := range []string{"month budget of tenant default", "0.02 USD", "2027-02-01T00:00:00Z"} {
		if !strings.Contains(refused.Message, says) {
			t.Errorf("message %q does not say %q", refused.Message, says)
		}
	}
	// A usage of another broker's request, or a forged one, settles
	// nothing; the request's own settles once.
	br.settleBudget(&subjects.Usage{RequestID: "forged", CompletionTokens: 1 << 30})
	br.settleBudget(&subjects.Usage{RequestID: "r0", PromptTokens: 2048, CompletionTokens: 1 << 30})
	if _, held := br.Spender().Held("r0"); held {
		t.Fatal("r0 still held after its usage")
	}
}

// A direct client's claims about price, key and request id are not
// believed: the decider writes the price it admits at, and removes a key
// and a client request id it did not set.
func TestDirectClientCannotForgeThePriceTheKeyOrTheLedgerID(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	br := newTestBroker(t, 4, now)
	withBudget(t, br, "100")
	h := nats.Header{
		subjects.HdrPrice:           {"0,0,0,0"},
		subjects.HdrKey:             {strings.Repeat("a", 64)},
		subjects.HdrKeyID:           {"aaaaaaaaaaaa"},
		subjects.HdrClientRequestID: {"victim-request"},
		subjects.HdrRouteBudget:     {"1000000"},
		subjects.HdrBudgetHold:      {"another-decider key.aaaaaaaaaaaa.total"},
	}
	a := br.Handle(NewScratch(), "llm.route.default", "_INBOX.x.1", h,
		[]byte(`{"model":"chat-large","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`))
	if a.Do != DoForward {
		t.Fatalf("not forwarded: %v", a.Err)
	}
	got := a.Route.Msg.Header
	if got.Get(subjects.HdrPrice) != "3000000,3000000,15000000,1000" || got.Get(subjects.HdrKey) != "" ||
		got.Get(subjects.HdrKeyID) != "" || got.Get(subjects.HdrClientRequestID) != "" || got.Get(subjects.HdrRouteBudget) == "1000000" ||
		len(got.Values(subjects.HdrBudgetHold)) != 1 || !strings.HasPrefix(got.Get(subjects.HdrBudgetHold), br.budgets.holder+" tenant.default.") {
		t.Fatalf("forwarded with the client's claims: %v", got)
	}
}

// BenchmarkCharge is what a budget adds to a decision alone: the
// reservation of a decided request against its tenant's budget, from the
// decider's lease, and its headers (the settlement, on the usage event,
// is the second half of each loop).
func BenchmarkCharge(b *testing.B) {
	now := time.Unix(1_800_000_000, 0)
	br := newTestBroker(b, 64, now)
	withBudget(b, br, "1000000000")
	h := gatewayHeaders()
	s := NewScratch()
	if a := br.Handle(s, "llm.gw.default", "_INBOX.gw.1", h, []byte(`{}`)); a.Do != DoForward {
		b.Fatal("not forwarded: ", a.Err)
	}
	var u subjects.Usage
	b.Run("reserve", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			s.req.ID = strconv.Itoa(i)
			if e := br.charge(s, "default", h); e != nil {
				b.Fatal(e)
			}
			b.StopTimer()
			u = subjects.Usage{RequestID: s.req.ID, PromptTokens: 2048, CompletionTokens: 32}
			br.settleBudget(&u)
			b.StartTimer()
		}
	})
	b.Run("reserve+settle", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			s.req.ID = strconv.Itoa(i)
			if e := br.charge(s, "default", h); e != nil {
				b.Fatal(e)
			}
			u = subjects.Usage{RequestID: s.req.ID, PromptTokens: 2048, CompletionTokens: 32}
			br.settleBudget(&u)
		}
	})
}
