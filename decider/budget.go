package decider

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-llm/switchyard/budget"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// budgets is the decider's side of spend budgets (package budget): the
// reservation of a request's worst case against its tenant's and its key's
// budgets once it is decided, its settlement when its usage comes, and the
// flush of the shared spend every second. The spender binds the budgets
// bucket the first time a request needs it.
type budgets struct {
	js      jetstream.JetStream
	prefix  string
	log     *slog.Logger
	bucket  string
	holder  string
	ttl     time.Duration
	now     func() time.Time
	onCross func(budget.Crossing)

	mu     sync.Mutex
	sp     *budget.Spender
	failed time.Time // when binding last failed: retried a second later

	spend     *prometheus.CounterVec
	remaining *prometheus.GaugeVec
	// Caches of the request path: each model's price and its header (by
	// the table's model value, dropped when they grow past maxCached), the
	// series by tenant and model.
	prices   sync.Map // *table.Model → priced
	nPrices  atomic.Int64
	spendBy  sync.Map // [2]string{tenant, model} → prometheus.Counter
	remainBy sync.Map // tenant → prometheus.Gauge
}

type priced struct {
	price  budget.Price
	header string
}

// maxCached bounds the prices cached: a table changed many times leaves
// models no decision reads.
const maxCached = 4096

// priceOf is the model's price and its Llm-Price header.
func (bg *budgets) priceOf(m *table.Model) priced {
	if m == nil || m.Price == nil {
		return priced{}
	}
	if v, ok := bg.prices.Load(m); ok {
		return v.(priced)
	}
	p := budget.PriceOf(m)
	v := priced{p, p.Header()}
	if bg.nPrices.Add(1) > maxCached {
		bg.prices.Clear()
		bg.nPrices.Store(1)
	}
	bg.prices.Store(m, v)
	return v
}

func (bg *budgets) spent(tenant, model string, cost budget.Micro) {
	k := [2]string{tenant, model}
	c, ok := bg.spendBy.Load(k)
	if !ok {
		c, _ = bg.spendBy.LoadOrStore(k, bg.spend.WithLabelValues(tenant, model))
	}
	c.(prometheus.Counter).Add(cost.Amount())
}

func (bg *budgets) left(tenant string, m budget.Micro) {
	g, ok := bg.remainBy.Load(tenant)
	if !ok {
		g, _ = bg.remainBy.LoadOrStore(tenant, bg.remaining.WithLabelValues(tenant))
	}
	g.(prometheus.Gauge).Set(m.Amount())
}

func newBudgets(js jetstream.JetStream, cfg *Config, log *slog.Logger, reg prometheus.Registerer, onCross func(budget.Crossing)) *budgets {
	bg := &budgets{
		js: js, prefix: cfg.Prefix, log: log, bucket: cfg.BudgetsBucket, holder: cfg.ID + "-" + nuid.Next(), ttl: cfg.LeaseTTL, now: cfg.Now, onCross: onCross,
		spend: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_spend_total", Help: "Money the requests this decider admitted cost, settled on their usage, in the table's currency.",
		}, []string{"tenant", "model"}),
		remaining: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_budget_remaining", Help: "What is left of each tenant's budget for its period, as this decider last saw it, in the table's currency.",
		}, []string{"tenant"}),
	}
	if bg.bucket == "" {
		bg.bucket = subjects.BudgetsBucket
	}
	if reg != nil {
		reg = prometheus.WrapRegistererWith(prometheus.Labels{"broker": cfg.ID}, reg)
		reg.MustRegister(bg.spend, bg.remaining)
	}
	return bg
}

// spender is the bound spender, binding the bucket when it is not yet.
func (bg *budgets) spender(ctx context.Context) (*budget.Spender, error) {
	bg.mu.Lock()
	defer bg.mu.Unlock()
	if bg.sp != nil {
		return bg.sp, nil
	}
	now := bg.now()
	if now.Sub(bg.failed) < time.Second {
		return nil, budget.ErrUnavailable
	}
	bctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	kv, err := bg.js.KeyValue(bctx, bg.bucket)
	if err != nil {
		bg.failed = now
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return nil, errNoBucket
		}
		return nil, err
	}
	bg.sp = budget.NewSpender(budget.Config{KV: kv, Holder: bg.holder, LeaseTTL: bg.ttl, Now: bg.now, OnCross: bg.onCross,
		Served: budget.Served(bg.js, bg.prefix), OnError: bg.onError})
	return bg.sp, nil
}

// bound is the spender if it is bound (nil otherwise).
func (bg *budgets) bound() *budget.Spender {
	bg.mu.Lock()
	defer bg.mu.Unlock()
	return bg.sp
}

// run flushes the spend every second until ctx ends, then gives back what
// this decider's leases do not need.
func (bg *budgets) run(ctx context.Context) {
	t := time.NewTicker(budget.DefaultFlushEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if sp := bg.bound(); sp != nil {
				fctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				sp.Flush(fctx, true)
				cancel()
			}
			return
		case <-t.C:
			if sp := bg.bound(); sp != nil {
				sp.Flush(ctx, false)
			}
		}
	}
}

// onError logs a correction of a dead decider's spend that failed: it is
// tried again later, and the spend stays charged whole until then.
func (bg *budgets) onError(err error) {
	bg.log.Warn("a dead decider's spend is not corrected from the ledger yet", "err", err)
}

// errNoBucket is a budget whose bucket was never created.
var errNoBucket = errors.New("no budgets bucket")

// defaultOutput is the output a request with no max_tokens, of a model
// with neither default_max_tokens nor max_context_tokens, is reserved
// for, and held to, when it is charged to a budget.
const defaultOutput = 4096

// charge prices the decided request s and reserves its worst case against
// its tenant's budget and its key's, setting the headers the replica and
// the answer carry (price, key id, remaining). A request under no budget,
// or of a model without a price, reserves nothing. A continuation is
// charged but never refused: it was admitted once.
func (dec *Decider) charge(s *Scratch, tenant string, h nats.Header) *subjects.APIError {
	d := &s.d
	snap := dec.router.Table()
	delete(h, subjects.HdrRouteBudget)
	delete(h, subjects.HdrPrice)
	delete(h, subjects.HdrKeyID)
	delete(h, subjects.HdrBudgetHold)
	if s.routed != nil {
		delete(s.routed, subjects.HdrRouteBudget)
	}
	if snap == nil {
		return nil
	}
	var key *table.Key
	var keyID string
	if hash := s.key; hash != "" {
		if k, ok := snap.Keys[hash]; ok && k.Tenant == tenant && len(hash) >= 12 {
			key, keyID = &k, hash[:12]
			s.setHeader(h, subjects.HdrKeyID, keyID)
		}
	}
	model := snap.Models[d.Model]
	pr := dec.budgets.priceOf(model)
	price := pr.price
	t, rules := snap.TenantRules(tenant)
	var needs [2]budget.Need
	n := 0
	if t != nil && t.Budget != nil {
		needs[n] = budget.Need{Kind: budget.KindTenant, Name: rules, Tenant: tenant, Budget: *t.Budget}
		n++
	}
	if key != nil && key.Budget != nil {
		needs[n] = budget.Need{Kind: budget.KindKey, Name: keyID, Tenant: tenant, Budget: *key.Budget}
		n++
	}
	if !price.Zero() {
		s.setHeader(h, subjects.HdrPrice, pr.header)
	}
	if n == 0 || price.Zero() {
		return nil
	}
	q := &s.req
	prompt := q.PromptTokens // a continuation's counts the text it carries
	output := q.MaxTokens
	if output == 0 && model != nil {
		output = model.DefaultMaxTokens
		if output == 0 && model.MaxContextTokens > prompt {
			output = model.MaxContextTokens - prompt
		}
	}
	if output == 0 {
		output = defaultOutput
	}
	if d.ReservedTokens <= q.PromptTokens {
		// The engine is held to what is reserved: decide sends it as
		// Llm-Max-Tokens.
		d.ReservedTokens = q.PromptTokens + output
	}
	batch := q.Priority == subjects.PriorityBatch
	worst := price.Cost(prompt, 0, output, batch)
	if q.ResumeFrom != "" {
		for i := range n {
			needs[i].Budget.AlertOnly = true
		}
	}
	sp, err := dec.budgets.spender(context.Background())
	var left budget.Micro
	var ref *budget.Refusal
	hold := budget.Hold{Amount: worst, Price: price, Batch: batch, Tenant: tenant, Model: d.Model}
	if err == nil {
		deadline := s.start.Add(time.Hour)
		if !q.Deadline.IsZero() {
			deadline = q.Deadline
		}
		left, ref, err = sp.Reserve(context.Background(), q.ID, needs[:n], &hold, deadline)
	}
	if err != nil {
		msg := "the spend of this request's budget could not be reached; try again"
		if errors.Is(err, errNoBucket) {
			msg = "this request is under a budget, and the budgets' bucket " + dec.budgets.bucket + " does not exist (switchyard table init creates it)"
		}
		if _, logged := dec.logged.LoadOrStore("budget-unavailable", true); !logged {
			dec.log.Warn("requests under a budget are refused: its spend cannot be reached (logged once)", "err", err)
		}
		e := subjects.NewError(503, subjects.CodeRouterUnavailable, msg)
		e.RetryAfter = time.Second
		return e
	}
	if ref != nil {
		// The policy charged the request's tokens to its quota and its
		// pool's in flight: nothing will be served, so a usage of nothing
		// settles them.
		dec.router.ObserveUsage(&subjects.Usage{RequestID: q.ID, Tenant: tenant}, s.start)
		return budgetRefusal(ref, worst, snap.Currency(), s.start)
	}
	if needs[0].Kind == budget.KindTenant {
		dec.budgets.left(tenant, left)
	}
	v := s.amount(left)
	s.setHeader(h, subjects.HdrRouteBudget, v)
	// The routed notice carries it too: the gateway answers it on an
	// error the replica never answers for (an accept timeout, a replica
	// gone, retries run out). Its value slice is the scratch's own.
	s.noticeBudget[0] = v
	s.NoticeHeader()[subjects.HdrRouteBudget] = s.noticeBudget[:]
	// The ledger record names the lease and the budgets: what corrects
	// this decider's spend should it die with the request open.
	tags, nt := hold.Tags()
	s.setHeaders(h, subjects.HdrBudgetHold, tags[:nt])
	return nil
}

// budgetRefusal is the 429 of a request whose worst case does not fit.
func budgetRefusal(r *budget.Refusal, worst budget.Micro, currency string, now time.Time) *subjects.APIError {
	who := "tenant " + r.Need.Name
	if r.Need.Kind == budget.KindKey {
		who = "API key " + r.Need.Name
	}
	e := subjects.NewError(429, subjects.CodeBudgetExceeded, "Budget exceeded: the "+r.Need.Budget.Period+" budget of "+who+
		" ("+strconv.FormatFloat(r.Need.Budget.Limit, 'f', -1, 64)+" "+currency+") has "+r.Remaining.String()+" "+currency+
		" left, and this request may cost up to "+worst.String()+" "+currency+".")
	if !r.Reset.IsZero() {
		e.RetryAfter = r.Reset.Sub(now)
		e.Message += " It resets at " + r.Reset.UTC().Format(time.RFC3339) + "."
	}
	e.Headers = map[string]string{subjects.HdrBudgetRemaining: r.Remaining.String()}
	return e
}

// settleBudget settles the reservation of the request u reports, at the
// price it was admitted at: the prompt as the engine counted it (its
// cached part at the cached price) and the output. A usage claiming more
// than twice the reservation is charged twice the reservation: only
// adapters publish usage, but a claim is not a bill.
func (dec *Decider) settleBudget(u *subjects.Usage) {
	sp := dec.budgets.bound()
	if sp == nil || u.RequestID == "" {
		return
	}
	prompt := u.EnginePromptTokens
	if prompt == 0 {
		prompt = u.PromptTokens
	}
	if h, cost, ok := sp.SettleUsage(u.RequestID, prompt, u.CachedTokens, u.CompletionTokens); ok && cost > 0 {
		dec.budgets.spent(h.Tenant, h.Model, cost)
	}
}

// BudgetEvent is what a decider publishes on llm.events.budget.<tenant>
// when a budget's committed spend crosses 80% and 100% of its limit.
type BudgetEvent struct {
	Tenant string `json:"tenant"`
	// Key is the key's id for a key's budget ("" for the tenant's).
	Key       string  `json:"key,omitempty"`
	Share     int     `json:"share"`
	Spent     float64 `json:"spent"`
	Limit     float64 `json:"limit"`
	Period    string  `json:"period"`
	AlertOnly bool    `json:"alert_only,omitempty"`
	At        int64   `json:"at_unix_ms"`
}

func (dec *Decider) budgetCrossed(c budget.Crossing) {
	ev := &BudgetEvent{Tenant: c.Need.Tenant, Share: c.Share, Spent: c.Spent.Amount(), Limit: c.Need.Budget.Limit,
		Period: c.Need.Budget.Period, AlertOnly: c.Need.Budget.AlertOnly, At: dec.cfg.Now().UnixMilli()}
	if c.Need.Kind == budget.KindKey {
		ev.Key = c.Need.Name
	}
	dec.enqueue(dec.subj.BudgetEvent(c.Need.Tenant), ev)
}

// Spender is the bound budget spender (nil until a request needed one),
// for tests and the dashboard.
func (dec *Decider) Spender() *budget.Spender { return dec.budgets.bound() }
