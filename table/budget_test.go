package table_test

import (
	"strings"
	"testing"

	"github.com/switchyard-llm/switchyard/table"
)

// Prices, budgets and the currency: each bad value is refused with its
// field named.
func TestDecodeRejectsBadMoney(t *testing.T) {
	for _, tc := range []bad{
		{name: "negative input price", key: "models.m", value: `{"price": {"input": -1, "output": 1}}`, field: "price.input", msg: "amount from 0"},
		{name: "negative output price", key: "models.m", value: `{"price": {"input": 1, "output": -0.5}}`, field: "price.output", msg: "amount from 0"},
		{name: "negative cached price", key: "models.m", value: `{"price": {"input": 1, "cached_input": -1, "output": 1}}`, field: "price.cached_input", msg: "amount from 0"},
		{name: "huge price", key: "models.m", value: `{"price": {"input": 1e300, "output": 1}}`, field: "price.input", msg: "amount from 0"},
		{name: "negative batch factor", key: "models.m", value: `{"price": {"input": 1, "output": 1, "batch": -0.5}}`, field: "price.batch", msg: "factor"},
		{name: "non-numeric price", key: "models.m", value: `{"price": {"input": "3", "output": 1}}`, msg: "price.input"},
		{name: "unknown price field", key: "models.m", value: `{"price": {"inputs": 3}}`, msg: `unknown field "inputs"`},
		{name: "negative limit", key: "tenants.t", value: `{"budget": {"limit": -5, "period": "month"}}`, field: "budget.limit", msg: "amount from 0"},
		{name: "non-numeric limit", key: "tenants.t", value: `{"budget": {"limit": "500", "period": "month"}}`, msg: "budget.limit"},
		{name: "unknown period", key: "tenants.t", value: `{"budget": {"limit": 5, "period": "fortnight"}}`, field: "budget.period", msg: "want day, week, month or total"},
		{name: "no period", key: "tenants.t", value: `{"budget": {"limit": 5}}`, field: "budget.period", msg: "want day"},
		{name: "key budget limit", key: "keys." + strings.Repeat("a", 64), value: `{"tenant": "t", "budget": {"limit": -1, "period": "day"}}`, field: "budget.limit", msg: "amount"},
		{name: "key budget period", key: "keys." + strings.Repeat("a", 64), value: `{"tenant": "t", "budget": {"limit": 1, "period": "year"}}`, field: "budget.period", msg: "want day"},
		{name: "currency", key: "billing", value: `{"currency": "US$"}`, field: "currency", msg: "letters"},
		{name: "billing unknown field", key: "billing", value: `{"currency": "EUR", "vat": 1}`, msg: `unknown field "vat"`},
	} {
		t.Run(tc.name, func(t *testing.T) { checkRejected(t, tc) })
	}
}

func TestDecodeAcceptsMoney(t *testing.T) {
	v, err := table.Decode("models.m", []byte(`{"price": {"input": 3, "cached_input": 0.3, "output": 15, "batch": 0.5}}`))
	if err != nil {
		t.Fatal(err)
	}
	if p := v.V.(table.Model).Price; p == nil || p.Input != 3 || *p.CachedInput != 0.3 || p.Output != 15 || *p.Batch != 0.5 {
		t.Fatalf("price %+v", p)
	}
	v, err = table.Decode("tenants.t", []byte(`{"budget": {"limit": 500, "period": "month", "alert_only": true}}`))
	if err != nil {
		t.Fatal(err)
	}
	if b := v.V.(table.Tenant).Budget; b == nil || b.Limit != 500 || b.Period != table.PeriodMonth || !b.AlertOnly {
		t.Fatalf("budget %+v", b)
	}
	s := table.NewSnapshot()
	if s.Currency() != "USD" {
		t.Fatalf("default currency %s", s.Currency())
	}
	v, err = table.Decode("billing", []byte(`{"currency": "EUR"}`))
	if err != nil {
		t.Fatal(err)
	}
	s.Set(v, []byte(`{"currency": "EUR"}`))
	if s.Currency() != "EUR" {
		t.Fatalf("currency %s", s.Currency())
	}
	s.Delete("billing")
	if s.Currency() != "USD" {
		t.Fatalf("currency after delete %s", s.Currency())
	}
}
