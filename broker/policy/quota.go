package policy

import (
	"math"
	"strconv"
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// Tenant quotas are token buckets per tenant, one for requests (rpm) and
// one for tokens (tpm). Each of the n deciders sharing a tenant's requests
// enforces limit ÷ n (SetDeciders): the brokers of the queue group, which
// spreads a tenant's requests evenly over them, and the other deciders
// that admitted the tenant's requests lately. A bucket holds
// at most a minute's share and refills continuously. The tpm bucket is
// charged prompt + max_tokens at admission and credited back what the
// request did not use when its usage event arrives.

// quotas are the tenants' buckets by quota key, the tpm reservations held
// until usage events settle them, and how many deciders share each
// tenant's quota. Lock: Router.mu.
type quotas struct {
	tenants  map[string]*tenantQuota
	reserved map[string]reservation // by request id
	// brokers is how many deciders share every tenant's quota, this one
	// included; sharing, per quota key, how many more share that tenant's
	// (SetDeciders).
	brokers int
	sharing map[string]int
}

// deciders is how many deciders share tenant key's quota.
func (q *quotas) deciders(key string) float64 {
	return float64(max(q.brokers+q.sharing[key], 1))
}

type tenantQuota struct{ rpm, tpm bucket }

type bucket struct {
	tokens float64
	at     time.Time
	limit  int // the table limit the level was computed for
}

// level is the bucket's content at now for capacity; a new bucket, or one
// whose limit the table changed, starts full.
func (b *bucket) level(limit int, capacity float64, now time.Time) float64 {
	if b.at.IsZero() || b.limit != limit {
		return capacity
	}
	elapsed := max(now.Sub(b.at).Seconds(), 0)
	return min(b.tokens+elapsed*capacity/60, capacity)
}

func (b *bucket) set(limit int, tokens float64, now time.Time) {
	b.tokens, b.at, b.limit = tokens, now, limit
}

// quotaCheck is the state of a tenant's buckets for one request.
type quotaCheck struct {
	rpmLevel, tpmLevel float64
	cost               int
}

// checkQuota admits the request against the tenant's buckets without
// charging them (commit does).
func (st *decision) checkQuota() *subjects.APIError {
	st.d.ReservedTokens = st.req.PromptTokens + st.maxTokens()
	if st.res.tenant == nil {
		return nil
	}
	q := st.res.tenant.Quota
	if q.RPM == 0 && q.TPM == 0 {
		return nil
	}
	tq := st.r.quotas.tenants[st.res.tenantKey]
	if tq == nil {
		tq = &tenantQuota{} // not stored: only commit creates state
	}
	n := st.r.quotas.deciders(st.res.tenantKey)
	st.quota.cost = st.d.ReservedTokens
	var wait float64 // seconds until both buckets admit this request
	if q.RPM > 0 && !st.req.ColdWaited {
		capacity := float64(q.RPM) / n
		st.quota.rpmLevel = tq.rpm.level(q.RPM, capacity, st.now)
		// A share below one request (rpm 1 over 2 deciders) admits one
		// request whenever its bucket is full.
		need := min(1, capacity)
		if lvl := st.quota.rpmLevel; lvl < need {
			wait = max(wait, (need-lvl)/(capacity/60))
		}
	}
	if q.TPM > 0 {
		capacity := float64(q.TPM) / n
		st.quota.tpmLevel = tq.tpm.level(q.TPM, capacity, st.now)
		// A request larger than the whole share needs a full bucket, not
		// more than it can ever hold.
		need := min(float64(st.quota.cost), capacity)
		if lvl := st.quota.tpmLevel; lvl < need {
			wait = max(wait, (need-lvl)/(capacity/60))
		}
	}
	if wait <= 0 {
		return nil
	}
	e := subjects.NewError(429, subjects.CodeRateLimit, "Rate limit reached for tenant "+st.req.Tenant+": retry after the Retry-After delay.")
	e.RetryAfter = time.Duration(math.Ceil(wait*1000)) * time.Millisecond
	e.Headers = map[string]string{}
	if q.RPM > 0 {
		rateHeaders(e.Headers, subjects.HdrRateLimitLimitRequests, subjects.HdrRateLimitRemainingRequests,
			subjects.HdrRateLimitResetRequests, q.RPM, st.quota.rpmLevel, n)
	}
	if q.TPM > 0 {
		rateHeaders(e.Headers, subjects.HdrRateLimitLimitTokens, subjects.HdrRateLimitRemainingTokens,
			subjects.HdrRateLimitResetTokens, q.TPM, st.quota.tpmLevel, n)
	}
	return e
}

// rateHeaders fills OpenAI's x-ratelimit-* trio. The limit is the tenant's
// whole limit; remaining scales this broker's share back up, an estimate of
// what the tenant has left across brokers; reset is the time until the
// bucket is full again.
func rateHeaders(h map[string]string, limitH, remainingH, resetH string, limit int, level, n float64) {
	capacity := float64(limit) / n
	remaining := min(max(int(level*n), 0), limit)
	reset := time.Duration((capacity - max(level, 0)) / (capacity / 60) * float64(time.Second)).Round(time.Millisecond)
	h[limitH] = strconv.Itoa(limit)
	h[remainingH] = strconv.Itoa(remaining)
	h[resetH] = reset.String()
}

// maxTokens is the request's max_tokens, or the model's default.
func (st *decision) maxTokens() int {
	if st.req.MaxTokens > 0 {
		return st.req.MaxTokens
	}
	if m := st.snap.Models[st.res.target.Model]; m != nil {
		return m.DefaultMaxTokens
	}
	return 0
}

// buckets returns the tenant's buckets for a charge, creating them: only a
// commit creates quota state (checkQuota reads a missing tenant's as full).
func (st *decision) buckets() *tenantQuota {
	tq := st.r.quotas.tenants[st.res.tenantKey]
	if tq == nil {
		tq = &tenantQuota{}
		st.r.quotas.tenants[st.res.tenantKey] = tq
	}
	return tq
}

// chargeQuota takes the request out of the buckets checkQuota read.
func (st *decision) chargeQuota() {
	if st.res.tenant == nil {
		return
	}
	q := st.res.tenant.Quota
	if q.RPM == 0 && q.TPM == 0 {
		return
	}
	tq := st.buckets()
	if q.RPM > 0 && !st.req.ColdWaited {
		tq.rpm.set(q.RPM, st.quota.rpmLevel-1, st.now)
	}
	if q.TPM > 0 {
		tq.tpm.set(q.TPM, st.quota.tpmLevel-float64(st.quota.cost), st.now)
		st.r.quotas.reserve(st.req.ID, st.res.tenantKey, st.quota.cost, false, st.now)
	}
}

// chargeContinuation charges a continuation of an admitted request (a
// stream resumed on another replica). It was admitted once, so nothing
// here refuses it and the request quota is not charged again; the tokens it
// may generate are taken from the tpm bucket and reserved under its own
// request id, so its usage event settles them: the text it generates is
// charged once, with neither the prompt nor the carried text again.
func (st *decision) chargeContinuation() {
	if st.res.tenant == nil || st.res.tenant.Quota.TPM == 0 {
		return
	}
	q := st.res.tenant.Quota
	tq := st.buckets()
	capacity := float64(q.TPM) / st.r.quotas.deciders(st.res.tenantKey)
	cost := st.maxTokens()
	lvl := tq.tpm.level(q.TPM, capacity, st.now)
	tq.tpm.set(q.TPM, max(lvl-float64(cost), -capacity), st.now)
	st.r.quotas.reserve(st.req.ID, st.res.tenantKey, cost, true, st.now)
}

// chargeHeld counts a request the gateway will hold for its cold model
// (on_cold "wait") against the tenant's request quota, as an admitted one:
// holding it is service the tenant gets. Its tokens are reserved when it is
// admitted after the wait, and that admission does not count it again.
func (st *decision) chargeHeld() {
	m := st.snap.Models[st.res.primary.Model]
	if !st.commit || st.req.ColdWaited || st.d.Err == nil || st.d.Err.Code != subjects.CodeModelLoading || m == nil || m.OnCold != table.OnColdWait {
		return
	}
	if st.res.tenant == nil || st.res.tenant.Quota.RPM == 0 {
		return
	}
	tq := st.buckets()
	tq.rpm.set(st.res.tenant.Quota.RPM, st.quota.rpmLevel-1, st.now)
}

// A reservation is the tokens this broker took from a tenant's tpm bucket
// for one request, held under the request id until the adapter's usage
// event settles it. A usage event is the adapter's claim; the reservation
// is the broker's own record: the tenant and the most that can come back
// are taken from it, and it settles once.
type reservation struct {
	tenant string // the quota key charged
	tokens int
	at     time.Time
	// completionOnly marks a continuation's reservation: its prompt (the
	// original prompt plus the text carried over) was charged with the
	// first part, so only the tokens it generates count.
	completionOnly bool
}

// Reservations are bounded in number and age: one whose usage never came
// (an adapter that died) is forgotten after ReservationTTL, and past
// MaxReservations a new one is not recorded (its tokens stay spent).
const (
	MaxReservations = 1 << 17
	ReservationTTL  = time.Hour
)

// reserve records a reservation.
func (q *quotas) reserve(id, tenant string, tokens int, completionOnly bool, now time.Time) {
	if id == "" || tokens <= 0 {
		return
	}
	if q.reserved == nil {
		q.reserved = map[string]reservation{}
	}
	if len(q.reserved) >= MaxReservations {
		for k, v := range q.reserved {
			if now.Sub(v.at) > ReservationTTL {
				delete(q.reserved, k)
			}
		}
		if len(q.reserved) >= MaxReservations {
			return
		}
	}
	q.reserved[id] = reservation{tenant: tenant, tokens: tokens, at: now, completionOnly: completionOnly}
}

// Reservations is the number of reservations held.
func (r *Router) Reservations() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.quotas.reserved)
}

// ObserveUsage settles the tpm reservation held for u.RequestID: the
// tokens reserved and not used go back to the tenant's bucket (a request
// that used more than it reserved takes the difference, up to as much
// again). It reports false, changing nothing, when this broker holds no
// reservation for that id although the tenant has a token quota: another
// broker's, one already settled, or a forgery. Usage of a tenant without a
// token quota had nothing reserved and is not a refusal: it reports true
// and changes nothing. Of u only the request id and the token counts are
// believed, and the tenant only to tell that nothing was owed; no more
// than was reserved ever comes back. Whatever the quota, the request's
// tokens stop counting in its pool's in-flight ledger (fair shedding).
func (r *Router) ObserveUsage(u *subjects.Usage, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fair.land(u.RequestID)
	return r.quotas.settle(u, r.snap.Load(), now)
}

// settle settles the reservation u names, as ObserveUsage says, against
// the table s.
func (q *quotas) settle(u *subjects.Usage, s *table.Snapshot, now time.Time) bool {
	res, ok := q.reserved[u.RequestID]
	if !ok || u.RequestID == "" {
		return !metered(s, u.Tenant)
	}
	delete(q.reserved, u.RequestID)
	if s == nil {
		return true
	}
	t := s.Tenants[res.tenant]
	tq := q.tenants[res.tenant]
	if t == nil || t.Quota.TPM == 0 || tq == nil {
		return true
	}
	used := min(max(u.CompletionTokens, 0), 2*res.tokens)
	if !res.completionOnly {
		used += min(max(u.PromptTokens, 0), 2*res.tokens)
	}
	refund := float64(res.tokens - min(used, 2*res.tokens))
	capacity := float64(t.Quota.TPM) / q.deciders(res.tenant)
	lvl := tq.tpm.level(t.Quota.TPM, capacity, now)
	tq.tpm.set(t.Quota.TPM, max(min(lvl+refund, capacity), -capacity), now)
	return true
}

// metered reports whether usage of tenant could settle a reservation: the
// tenant (or, for one missing from the table s, the default tenant it is
// routed as) has a token quota.
func metered(s *table.Snapshot, tenant string) bool {
	if s == nil {
		return false
	}
	t, _ := s.TenantRules(tenant)
	return t != nil && t.Quota.TPM > 0
}
