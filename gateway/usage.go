package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/budget"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// budgetUsage is one budget in GET /v1/usage: the spend settled in its
// current period and what is left once the reservations open on it are
// counted. Limit, Remaining, Period and ResetsAt are null without a
// budget, and so is Spent: only a budget's spend is counted here (the
// ledger has every request's, for operators).
type budgetUsage struct {
	Spent     *float64 `json:"spent"`
	Limit     *float64 `json:"limit"`
	Remaining *float64 `json:"remaining"`
	Period    *string  `json:"period"`
	ResetsAt  *string  `json:"resets_at"`
	AlertOnly bool     `json:"alert_only,omitempty"`
	Currency  string   `json:"currency"`
}

// serveUsage answers GET /v1/usage: the spend of the request's API key and
// of its tenant in their current periods. A key sees its own and its
// tenant's, nothing of another.
func (g *Gateway) serveUsage(w http.ResponseWriter, r *http.Request) {
	t := g.snapshot(w)
	if t == nil {
		return
	}
	tenant, hash, apiErr := g.keyOf(r, t)
	if apiErr != nil {
		writeError(w, apiErr)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	var kv jetstream.KeyValue
	bind := func() error {
		if kv != nil {
			return nil
		}
		js, err := jetstream.New(g.nc)
		if err != nil {
			return err
		}
		kv, err = js.KeyValue(ctx, subjects.BudgetsBucket)
		return err
	}
	now := time.Now()
	read := func(n *budget.Need) (budgetUsage, error) {
		u := budgetUsage{Currency: t.Currency()}
		if n == nil {
			return u, nil
		}
		if err := bind(); err != nil {
			return u, err
		}
		sp, err := budget.Read(ctx, kv, *n, now)
		if err != nil {
			return u, err
		}
		spent, limit := sp.Spent.Amount(), n.Budget.Limit
		remaining := max(budget.LimitOf(&n.Budget)-sp.Spent-sp.Leased, 0).Amount()
		period := n.Budget.Period
		u.Spent, u.Limit, u.Remaining, u.Period, u.AlertOnly = &spent, &limit, &remaining, &period, n.Budget.AlertOnly
		if _, reset, _ := budget.Bounds(period, now); !reset.IsZero() {
			s := reset.Format(time.RFC3339)
			u.ResetsAt = &s
		}
		return u, nil
	}
	var tn, kn *budget.Need
	if tr, rules := t.TenantRules(tenant); tr != nil && tr.Budget != nil {
		tn = &budget.Need{Kind: budget.KindTenant, Name: rules, Tenant: tenant, Budget: *tr.Budget}
	}
	var k table.Key
	if hash != "" {
		k = t.Keys[hash]
		if k.Budget != nil {
			kn = &budget.Need{Kind: budget.KindKey, Name: hash[:12], Tenant: tenant, Budget: *k.Budget}
		}
	}
	var out struct {
		Tenant budgetUsage  `json:"tenant"`
		Key    *budgetUsage `json:"key"`
	}
	var err error
	if out.Tenant, err = read(tn); err == nil && hash != "" {
		var ku budgetUsage
		ku, err = read(kn)
		out.Key = &ku
	}
	if err != nil {
		e := subjects.NewError(503, subjects.CodeRouterUnavailable, "the budgets' spend could not be read; try again")
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			e.Message = "the budgets' spend is not kept on this bus (switchyard table init creates its bucket)"
		}
		e.RetryAfter = time.Second
		writeError(w, e)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}
