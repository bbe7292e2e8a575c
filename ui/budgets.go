package ui

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/budget"
	"github.com/switchyard-llm/switchyard/subjects"
)

// budgetView is one tenant's budget on the dashboard: the spend settled in
// its current period against its limit, and what the deciders hold leased
// for requests in flight.
type budgetView struct {
	Tenant    string  `json:"tenant"`
	Spent     float64 `json:"spent"`
	Leased    float64 `json:"leased"`
	Limit     float64 `json:"limit"`
	Period    string  `json:"period"`
	AlertOnly bool    `json:"alert_only,omitempty"`
	Currency  string  `json:"currency"`
}

// serveBudgets is GET /ui/budgets: every tenant with a budget in the
// table, with its spend read from the llm-budgets bucket (none when the
// bucket does not exist yet).
func (u *UI) serveBudgets(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	views := []budgetView{}
	t := u.tableSnapshot()
	if t != nil && u.nc != nil {
		js, err := jetstream.New(u.nc)
		var kv jetstream.KeyValue
		if err == nil {
			kv, err = js.KeyValue(ctx, subjects.BudgetsBucket)
		}
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			kv, err = nil, nil
		}
		if err != nil {
			http.Error(w, "budgets: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		now := time.Now()
		for name, tn := range t.Tenants {
			if tn.Budget == nil {
				continue
			}
			v := budgetView{Tenant: name, Limit: tn.Budget.Limit, Period: tn.Budget.Period, AlertOnly: tn.Budget.AlertOnly, Currency: t.Currency()}
			if kv != nil {
				sp, err := budget.Read(ctx, kv, budget.Need{Kind: budget.KindTenant, Name: name, Tenant: name, Budget: *tn.Budget}, now)
				if err != nil {
					http.Error(w, "budgets: "+err.Error(), http.StatusServiceUnavailable)
					return
				}
				v.Spent, v.Leased = sp.Spent.Amount(), sp.Leased.Amount()
			}
			views = append(views, v)
		}
		slices.SortFunc(views, func(a, b budgetView) int {
			if a.Tenant < b.Tenant {
				return -1
			}
			return 1
		})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-cache")
	_ = json.NewEncoder(w).Encode(views)
}
