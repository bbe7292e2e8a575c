package budget_test

import (
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/budget"
	"github.com/switchyard-llm/switchyard/table"
)

func TestCostIsIntegerMicroUnitsRoundedUp(t *testing.T) {
	cached := 0.5
	p := budget.PriceOf(&table.Model{Price: &table.Price{Input: 3, CachedInput: &cached, Output: 15}})
	// 1000 prompt tokens (400 cached) and 200 output: 600×3 + 400×0.5 +
	// 200×15 millionths of a unit per token.
	if got, want := p.Cost(1000, 400, 200, false), budget.Micro(1800+200+3000); got != want {
		t.Fatalf("cost = %d, want %d", got, want)
	}
	// One token at 0.000001 per million still costs a micro-unit.
	tiny := budget.PriceOf(&table.Model{Price: &table.Price{Input: 0.000001}})
	if got := tiny.Cost(1, 0, 0, false); got != 1 {
		t.Fatalf("a token at the smallest price cost %d, want 1 (rounded up)", got)
	}
	half := 0.5
	b := budget.PriceOf(&table.Model{Price: &table.Price{Input: 2, Batch: &half}})
	if got := b.Cost(1_000_000, 0, 0, true); got != 1_000_000 {
		t.Fatalf("batch cost = %d, want half of 2 units", got)
	}
	if got := (budget.PriceOf(nil)); !got.Zero() {
		t.Fatal("a model without a price must cost nothing")
	}
	// A forged count cannot overflow.
	big := budget.PriceOf(&table.Model{Price: &table.Price{Input: table.MaxPrice, Output: table.MaxPrice}})
	if c := big.Cost(1<<62, 0, 1<<62, false); c <= 0 {
		t.Fatalf("clamped cost = %d", c)
	}
}

func TestPriceHeaderRoundTripsAndRefusesForgeries(t *testing.T) {
	p := budget.Price{Input: 3_000_000, CachedInput: 1, Output: 15_000_000, BatchMilli: 500}
	got, ok := budget.ParsePriceHeader(p.Header())
	if !ok || got != p {
		t.Fatalf("round trip: %+v %v", got, ok)
	}
	for _, bad := range []string{"", "1,2,3", "1,2,3,-4", "a,b,c,d", "1,2,3,4,5", "1,2,99999999999999999,4"} {
		if _, ok := budget.ParsePriceHeader(bad); ok {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestPeriodsAreCalendarPeriodsInUTC(t *testing.T) {
	at := time.Date(2026, 12, 3, 23, 30, 0, 0, time.FixedZone("x", -5*3600)) // 4 Dec 04:30 UTC, a Friday
	for _, c := range []struct{ period, start, reset, id string }{
		{table.PeriodDay, "2026-12-04", "2026-12-05", "d20261204"},
		{table.PeriodWeek, "2026-11-30", "2026-12-07", "w20261130"},
		{table.PeriodMonth, "2026-12-01", "2027-01-01", "m202612"},
	} {
		s, r, id := budget.Bounds(c.period, at)
		if s.Format(time.DateOnly) != c.start || r.Format(time.DateOnly) != c.reset || id != c.id {
			t.Errorf("%s: %v %v %s", c.period, s, r, id)
		}
	}
	if s, r, id := budget.Bounds(table.PeriodTotal, at); !s.IsZero() || !r.IsZero() || id != "total" {
		t.Errorf("total: %v %v %s", s, r, id)
	}
	if got := budget.Micro(1_500_000).String(); got != "1.5" {
		t.Errorf("String = %s", got)
	}
}

func TestMicroString(t *testing.T) {
	for m, want := range map[budget.Micro]string{0: "0", 1: "0.000001", 1_500_000: "1.5", 10_020_000: "10.02", -2_000_001: "-2.000001", 123_456_789: "123.456789"} {
		if got := m.String(); got != want {
			t.Errorf("%d: %s, want %s", m, got, want)
		}
	}
}
