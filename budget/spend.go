package budget

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/table"
)

// The spend of a budget's period is one key of the budgets bucket
// (subjects.BudgetsBucket), "<kind>.<name>.<period id>", holding a record:
// the money settled (spent) and the leases deciders hold on the rest. A
// decider reserves a request's worst case from its own lease, in memory;
// when its lease cannot cover a reservation it takes a larger one with a
// compare-and-set on the key (one JetStream round trip, more on a
// conflict), which moves what its settled requests cost from its lease to
// spent on the way. Spent plus every lease never exceeds the limit, so the
// settled spend of a period never exceeds it by more than what requests
// cost beyond their reservations, whatever the number of deciders.
//
// A lease names its decider and expires LeaseTTL after its last renewal
// (every FlushEvery while the decider lives). A live decider finding
// another's lease expired moves the whole lease to spent at once: what the
// dead decider's open requests cost is not known yet, only that it is at
// most the lease, so the budget is never exceeded. It notes the dead
// holder in the record's expired list with what spent holds of it (what it
// moved there, and the lease), and once the latest deadline of the
// holder's reservations has passed (and settleGrace for their records to
// land), a decider sums the ledger's records of that holder charged to the
// key and corrects spent by the difference: the ledger, written by the
// adapters that served the requests, is the truth of what they cost.

// Defaults of Config.
const (
	DefaultLeaseTTL   = 30 * time.Second
	DefaultFlushEvery = time.Second
	// opTimeout bounds one JetStream operation on the request path.
	opTimeout = 2 * time.Second
	// settleGrace is how long after a dead holder's last deadline its
	// requests' ledger records are waited for; maxExpired bounds the dead
	// holders a record keeps for correction (past it, a lease is charged
	// whole).
	settleGrace = 5 * time.Second
	maxExpired  = 64
	// holdGrace is how long after its request's deadline a hold whose
	// usage never came is released (the request was not recorded as
	// served either).
	holdGrace = time.Minute
	// ledgerTimeout bounds the ledger read of one correction; fixRetry is
	// when a correction that failed is tried again.
	ledgerTimeout = 30 * time.Second
	fixRetry      = 30 * time.Second
	// maxTries bounds the compare-and-set attempts of one reservation.
	maxTries = 16
	// sliceDiv sizes a lease beyond the reservation that needs it: a
	// 1/sliceDiv of the limit, so a decider with a steady stream of
	// requests renews rarely, and many deciders cannot hold it all.
	sliceDiv = 32
	// idleAfter is how long a lease goes unused before its unreserved
	// part goes back.
	idleAfter = 2 * time.Second
	// refuseOn is how recent a record read may be for a refusal to rest
	// on it without reading it again: a burst past the limit costs a
	// round trip per this long, not one per request refused.
	refuseOn = 250 * time.Millisecond
)

// record is the value of a budget's key.
type record struct {
	Spent  Micro            `json:"spent"`
	Leases map[string]lease `json:"leases,omitempty"`
	// Alerted is the highest share of the limit (80, 100) announced: 100
	// once the committed spend reaches the limit or a reservation is first
	// refused.
	Alerted int `json:"alerted,omitempty"`
	// Expired is the holders whose leases expired, with what spent holds
	// of them, until the ledger corrects it.
	Expired map[string]expired `json:"expired,omitempty"`
}

type lease struct {
	Amount  Micro `json:"amount"`
	Expires int64 `json:"expires_unix_ms"`
	// Moved is what the holder moved from the lease to spent since it took
	// it (Since); Until is the latest deadline of the reservations it took.
	Moved Micro `json:"moved,omitempty"`
	Since int64 `json:"since_unix_ms,omitempty"`
	Until int64 `json:"until_unix_ms,omitempty"`
}

// Config configures a Spender.
type Config struct {
	// KV is the budgets bucket.
	KV jetstream.KeyValue
	// Holder names this decider's leases: unique to the process, so a
	// decider restarted under its id never takes its old lease for its
	// own (that one expires and is charged whole).
	Holder   string
	LeaseTTL time.Duration
	// FlushEvery is how often Run settles spend and renews leases.
	FlushEvery time.Duration
	Now        func() time.Time
	// OnCross, when set, is told (once per budget and period, by the
	// decider whose write crossed it) that the committed spend of a
	// budget (settled, and leased to deciders) reached 80% of its limit,
	// and 100% of it, or a reservation was first refused.
	OnCross func(Crossing)
	// OnError, when set, is told of a correction that failed (tried
	// again at the next flush).
	OnError func(error)
	// Served, when set, sums the ledger: what the requests of a holder
	// charged to a budget's key cost. Without it a dead holder's lease
	// stays charged whole.
	Served func(context.Context, ServedQuery) (Micro, error)
}

// Crossing is a budget whose spend reached a share of its limit.
type Crossing struct {
	Need  Need
	Share int // 80 or 100
	Spent Micro
}

// Need is one budget a request is charged to: its tenant's or its key's.
type Need struct {
	Kind   string // "tenant" or "key"
	Name   string // the tenant, or the key's id
	Tenant string
	Budget table.Budget
}

// Kinds of budgets.
const (
	KindTenant = "tenant"
	KindKey    = "key"
)

// Spender shares the spend of budgets between deciders. Create it with
// NewSpender and run Run until the decider stops.
type Spender struct {
	cfg Config

	mu     sync.Mutex
	scopes map[string]*scope
	// current is the scope of each budget's current period, found without
	// building its key (a request's path).
	current map[currentKey]*scope
	holds   map[string]Hold

	// JetStream round trips, reservations asked for and reservations
	// held (under mu).
	ops, asked, requests uint64
}

// scope is one budget's period as this decider sees it.
type scope struct {
	io    sync.Mutex // one compare-and-set at a time per key
	key   string
	tag   string // "<holder> <key>"
	ck    currentKey
	need  Need
	reset time.Time
	// Under Spender.mu: the lease held (as the bucket has it), what open
	// reservations take of it, and what settled requests cost from it and
	// is not yet moved to spent.
	held, open, done Micro
	used             time.Time
	// pins counts the reservations working on the scope: Flush forgets
	// only a scope none is, so two never stand for one key.
	pins int
	// until is the latest deadline of the reservations taken (unix ms),
	// and untilWritten the lease's until as the bucket has it: a
	// reservation whose deadline is past it writes the lease first, so a
	// dead holder's correction waits for all its requests. fixAfter is
	// when a correction that failed is tried again.
	until, untilWritten int64
	fixAfter            time.Time
	// The last record read or written (set), its revision (0: none), the
	// sum of the other holders' leases in it, and when it was last read.
	rec    record
	rev    uint64
	others Micro
	readAt time.Time
}

// Hold is one request's reservation, settled once by Settle or released
// when it expires.
type Hold struct {
	scopes [2]*scope
	n      int
	Amount Micro
	Price  Price
	Batch  bool
	Tenant string
	Model  string
	// expires is when the hold is released unless settled (unix ms): a
	// Hold of at most 128 bytes is kept in the holds map without an
	// allocation of its own.
	expires int64
}

// Key is the key of the budget of kind the hold reserved from ("" when
// none).
func (h *Hold) Key(kind string) string {
	for _, sc := range h.scopes[:h.n] {
		if sc.ck.kind == kind {
			return sc.key
		}
	}
	return ""
}

// Tags are "<holder> <budget key>" of each budget the hold reserved from,
// in the order of the needs (n of them): the request's ledger record
// names them (Llm-Budget-Hold), which is what corrects the spend should
// this decider die with the request open.
func (h *Hold) Tags() (tags [2]string, n int) {
	for i, sc := range h.scopes[:h.n] {
		tags[i] = sc.tag
	}
	return tags, h.n
}

// NewSpender returns a spender; cfg.KV and cfg.Holder are required.
func NewSpender(cfg Config) *Spender {
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.FlushEvery <= 0 {
		cfg.FlushEvery = DefaultFlushEvery
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Spender{cfg: cfg, scopes: map[string]*scope{}, current: map[currentKey]*scope{}, holds: map[string]Hold{}}
}

type currentKey struct{ kind, name, period string }

// Refusal says which budget a reservation did not fit in.
type Refusal struct {
	Need      Need
	Reset     time.Time // zero for a total budget
	Remaining Micro
}

// ErrUnavailable is a reservation that could not reach the bucket.
var ErrUnavailable = errors.New("budget spend unavailable")

// Reserve reserves h.Amount against every budget of needs for request
// id, which ends by deadline (its hold is released holdGrace after, unless
// settled), and returns what is left of the tightest budget after it. It
// refuses (a Refusal, nothing held) when the amount does not fit in one of
// them; an alert-only budget is charged and never refuses. h is the hold
// as kept, once held (h.Key).
func (s *Spender) Reserve(ctx context.Context, id string, needs []Need, h *Hold, deadline time.Time) (remaining Micro, ref *Refusal, err error) {
	now := s.cfg.Now()
	h.n = 0
	h.expires = deadline.Add(holdGrace).UnixMilli()
	until := deadline
	if left, ok := s.reserveNow(id, needs, h, now, until.UnixMilli()); ok {
		return left, nil, nil
	}
	s.mu.Lock()
	s.asked++
	s.mu.Unlock()
	remaining = -1
	for _, n := range needs[:min(len(needs), 2)] {
		sc := s.scope(n, now)
		left, ok, err := s.reserveIn(ctx, sc, h.Amount, now, until.UnixMilli())
		s.mu.Lock()
		sc.pins--
		s.mu.Unlock()
		if err != nil || !ok {
			s.release(h)
			if err != nil {
				return 0, nil, err
			}
			return 0, &Refusal{Need: n, Reset: sc.reset, Remaining: max(left, 0)}, nil
		}
		h.scopes[h.n] = sc
		h.n++
		if remaining < 0 || left < remaining {
			remaining = left
		}
	}
	if h.n == 0 {
		return 0, nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests++
	if old, ok := s.holds[id]; ok {
		s.releaseLocked(&old) // an id reused: the older hold goes
	}
	s.holds[id] = *h
	return max(remaining, 0), nil, nil
}

// reserveNow is Reserve when this decider's leases cover the reservation
// (the request path's common case): one lock, no round trip. ok is false
// when one of them does not, and nothing is held.
func (s *Spender) reserveNow(id string, needs []Need, h *Hold, now time.Time, until int64) (remaining Micro, ok bool) {
	k := min(len(needs), 2)
	if k == 0 {
		return 0, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var scs [2]*scope
	for i, n := range needs[:k] {
		sc := s.current[currentKey{n.Kind, n.Name, n.Budget.Period}]
		if sc == nil || !sc.reset.IsZero() && !now.Before(sc.reset) ||
			h.Amount > 0 && (sc.held-sc.open-sc.done < h.Amount || until > sc.untilWritten) {
			return 0, false
		}
		scs[i] = sc
	}
	remaining = -1
	for i, sc := range scs[:k] {
		sc.need = needs[i]
		sc.open += h.Amount
		sc.used = now
		h.scopes[i] = sc
		if left := sc.remaining(); remaining < 0 || left < remaining {
			remaining = left
		}
	}
	h.n = k
	s.asked++
	s.requests++
	if old, ok := s.holds[id]; ok {
		s.releaseLocked(&old) // an id reused: the older hold goes
	}
	s.holds[id] = *h
	return max(remaining, 0), true
}

// scope returns the scope of n's current period, creating it.
func (s *Spender) scope(n Need, now time.Time) *scope {
	ck := currentKey{n.Kind, n.Name, n.Budget.Period}
	s.mu.Lock()
	if sc := s.current[ck]; sc != nil && (sc.reset.IsZero() || now.Before(sc.reset)) {
		sc.need = n
		sc.pins++
		s.mu.Unlock()
		return sc
	}
	s.mu.Unlock()
	_, reset, pid := Bounds(n.Budget.Period, now)
	key := n.Kind + "." + n.Name + "." + pid
	s.mu.Lock()
	defer s.mu.Unlock()
	sc := s.scopes[key]
	if sc == nil {
		sc = &scope{key: key, reset: reset, ck: ck, tag: s.cfg.Holder + " " + key}
		s.scopes[key] = sc
	}
	s.current[ck] = sc
	sc.need = n
	sc.pins++
	return sc
}

// limit is what the budget refuses beyond: its limit, or for an
// alert-only budget the most any budget may be.
func (n *Need) limit() Micro {
	if n.Budget.AlertOnly {
		return Micro(table.MaxBudgetLimit * MicroPerUnit)
	}
	return LimitOf(&n.Budget)
}

// remaining is what is left of the budget as this decider last saw it,
// after its own reservations and settled costs. Under mu.
func (sc *scope) remaining() Micro {
	return LimitOf(&sc.need.Budget) - sc.rec.Spent - sc.others - sc.open - sc.done
}

// set makes rec, of revision rev, the record as last seen, and sums the
// leases of the other holders in it. Under mu.
func (sc *scope) set(rec record, rev uint64, holder string) {
	sc.rec, sc.rev, sc.others = rec, rev, 0
	for k, l := range rec.Leases {
		if k != holder {
			sc.others += l.Amount
		}
	}
}

// reserveIn takes amount from this decider's lease on sc, growing the
// lease when it cannot cover it, and writing it when the lease's until
// (in the bucket) is before the reservation's deadline. ok is false when
// the budget cannot cover it.
func (s *Spender) reserveIn(ctx context.Context, sc *scope, amount Micro, now time.Time, until int64) (left Micro, ok bool, err error) {
	if s.take(sc, amount, now, until) {
		return s.left(sc), true, nil
	}
	sc.io.Lock()
	defer sc.io.Unlock()
	for range maxTries {
		if s.take(sc, amount, now, until) {
			return s.left(sc), true, nil
		}
		s.mu.Lock()
		sc.until = max(sc.until, until)
		need := amount
		if sc.held-sc.open-sc.done >= amount {
			need = 0 // covered: only the until is written
		}
		s.mu.Unlock()
		grown, left, err := s.write(ctx, sc, need, now, false)
		if err != nil {
			return 0, false, err
		}
		if !grown && need > 0 {
			return left, false, nil
		}
	}
	return 0, false, fmt.Errorf("%w: %s: too many concurrent writers", ErrUnavailable, sc.key)
}

// take reserves amount from the lease in memory, if it covers it and the
// lease's until in the bucket covers the reservation's deadline.
func (s *Spender) take(sc *scope, amount Micro, now time.Time, until int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if amount > 0 && (sc.held-sc.open-sc.done < amount || until > sc.untilWritten) {
		return false
	}
	sc.open += amount
	sc.used = now
	return true
}

func (s *Spender) left(sc *scope) Micro {
	s.mu.Lock()
	defer s.mu.Unlock()
	return sc.remaining()
}

// write is one compare-and-set of sc's record, with sc.io held: what this
// decider's settled requests cost moves from its lease to spent, expired
// leases of others go to spent whole, and its lease becomes what it needs.
// With need > 0 (a reservation of need that the lease did not cover) the
// lease grows by at least what is missing, or grown is false and left is
// what the budget has left. With need == 0 (a flush) the lease keeps what
// is reserved and, unless idle, what it held. A conflict re-reads the
// record and reports grown true, so the caller tries again.
func (s *Spender) write(ctx context.Context, sc *scope, need Micro, now time.Time, idle bool) (grown bool, left Micro, err error) {
	s.mu.Lock()
	held, done, open, until := sc.held, sc.done, sc.open, sc.until
	rec, rev := sc.rec, sc.rev
	rec.Leases = maps.Clone(rec.Leases)
	rec.Expired = maps.Clone(rec.Expired)
	n := sc.need
	fresh := rev != 0 && now.Sub(sc.readAt) < refuseOn
	s.mu.Unlock()
	if rev == 0 {
		if rec, rev, err = s.read(ctx, sc.key); err != nil {
			return false, 0, err
		}
		fresh = true
		s.mu.Lock()
		sc.readAt = now
		s.mu.Unlock()
	}
	if rec.Leases == nil {
		rec.Leases = map[string]lease{}
	}
	holder := s.cfg.Holder
	prev, have := rec.Leases[holder]
	if !have && held > 0 {
		// Another decider found this lease expired and moved it to spent
		// whole: what it held is charged already.
		s.mu.Lock()
		sc.held, sc.done = 0, sc.done-done
		s.mu.Unlock()
		held, done = 0, 0
	}
	nowMS := now.UnixMilli()
	var others Micro
	for k, l := range rec.Leases {
		if k == holder {
			continue
		}
		if l.Expires < nowMS {
			rec.Spent += l.Amount
			delete(rec.Leases, k)
			if l.Amount > 0 && l.Since > 0 && len(rec.Expired) < maxExpired {
				if rec.Expired == nil {
					rec.Expired = map[string]expired{}
				}
				rec.Expired[k] = expired{Charged: l.Moved + l.Amount, Since: l.Since, Until: l.Until}
			}
			continue
		}
		others += l.Amount
	}
	rec.Spent += done
	mine := held - done // what is left of the lease once settled costs move out
	limit := n.limit()
	free := limit - rec.Spent - others - mine
	var grant Micro
	exhausted := false
	switch {
	case need > 0:
		missing := need - (mine - open)
		if missing > free {
			if !fresh {
				// Refused on the record this decider wrote last: others
				// may have given leases back since. Read it again.
				s.mu.Lock()
				sc.rev = 0
				s.mu.Unlock()
				return true, 0, nil
			}
			if rec.Alerted >= 100 || LimitOf(&n.Budget) == 0 {
				s.mu.Lock()
				sc.set(rec, rev, holder)
				sc.rec.Spent -= done // not written: still in this decider's lease
				left = sc.remaining()
				s.mu.Unlock()
				return false, left, nil
			}
			// The budget's first refusal: it is spent, for every practical
			// purpose, and the write that says so tells it once.
			exhausted = true
			break
		}
		grant = missing
		if !n.Budget.AlertOnly {
			grant = min(free, missing+LimitOf(&n.Budget)/sliceDiv)
		}
	case idle:
		grant = min(open-mine, 0) // back to what is reserved
	}
	mine += grant
	if mine > 0 {
		// The until runs ahead of the deadlines by half a lease's life, so
		// requests with like timeouts write it about as often as the lease
		// is renewed.
		l := lease{Amount: mine, Expires: now.Add(s.cfg.LeaseTTL).UnixMilli(), Moved: prev.Moved + done, Since: prev.Since,
			Until: max(prev.Until, until+(s.cfg.LeaseTTL/2).Milliseconds())}
		if !have {
			l.Moved, l.Since = done, nowMS
		}
		rec.Leases[holder] = l
	} else {
		// Nothing reserved and every settled cost in spent: the holder
		// owes no correction, and a lease it takes later starts afresh.
		delete(rec.Leases, holder)
	}
	var cross int
	if bl := LimitOf(&n.Budget); bl > 0 {
		committed := rec.Spent + others + mine
		for _, share := range [...]int{80, 100} {
			if rec.Alerted < share && (committed*100 >= bl*Micro(share) || exhausted) {
				rec.Alerted, cross = share, share
			}
		}
	}
	b, _ := json.Marshal(rec)
	wctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	var nrev uint64
	if rev == 0 {
		nrev, err = s.cfg.KV.Create(wctx, sc.key, b)
	} else {
		nrev, err = s.cfg.KV.Update(wctx, sc.key, b, rev)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ops++
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		sc.rev = 0 // read it again
		return true, 0, nil
	}
	if err != nil {
		return false, 0, fmt.Errorf("%w: %s: %v", ErrUnavailable, sc.key, err)
	}
	sc.set(rec, nrev, holder) // it was current: the write succeeded
	sc.readAt = now
	sc.held = mine
	sc.untilWritten = rec.Leases[holder].Until
	sc.done -= done
	if cross > 0 && s.cfg.OnCross != nil {
		s.cfg.OnCross(Crossing{Need: n, Share: cross, Spent: rec.Spent + others + mine})
	}
	return !exhausted, sc.remaining(), nil
}

// read is the record of key and its revision (0 when there is none).
func (s *Spender) read(ctx context.Context, key string) (record, uint64, error) {
	rctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	e, err := s.cfg.KV.Get(rctx, key)
	s.mu.Lock()
	s.ops++
	s.mu.Unlock()
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return record{}, 0, nil
	}
	if err != nil {
		return record{}, 0, fmt.Errorf("%w: %s: %v", ErrUnavailable, key, err)
	}
	var r record
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return record{}, 0, fmt.Errorf("%w: %s: %v", ErrUnavailable, key, err)
	}
	return r, e.Revision(), nil
}

// Settle settles the hold of request id at cost; the hold is gone (false
// when there was none: another decider's request, one settled already, a
// forgery).
func (s *Spender) Settle(id string, cost Micro) (Hold, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h, ok := s.holds[id]
	if !ok {
		return Hold{}, false
	}
	delete(s.holds, id)
	for _, sc := range h.scopes[:h.n] {
		sc.open -= h.Amount
		sc.done += cost
	}
	return h, true
}

// SettleUsage settles the hold of request id at what its usage costs at
// the price it was reserved at: the prompt tokens (cached ones at the
// cached price) and the output, at most twice the reservation (a claim is
// not a bill). ok is false when there was no hold.
func (s *Spender) SettleUsage(id string, prompt, cached, output int) (h Hold, cost Micro, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h, ok = s.holds[id]; !ok {
		return Hold{}, 0, false
	}
	delete(s.holds, id)
	cost = min(h.Price.Cost(prompt, cached, output, h.Batch), 2*h.Amount)
	for _, sc := range h.scopes[:h.n] {
		sc.open -= h.Amount
		sc.done += cost
	}
	return h, cost, true
}

// Held reports whether request id holds a reservation.
func (s *Spender) Held(id string) (Hold, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h, ok := s.holds[id]
	return h, ok
}

func (s *Spender) release(h *Hold) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.releaseLocked(h)
}

func (s *Spender) releaseLocked(h *Hold) {
	for _, sc := range h.scopes[:h.n] {
		sc.open -= h.Amount
	}
	h.n = 0
}

// Counts is the JetStream round trips made (reservations, flushes and
// renewals), the reservations asked for and those held so far.
func (s *Spender) Counts() (ops, asked, held uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ops, s.asked, s.requests
}

// Run settles and renews this decider's leases every FlushEvery until ctx
// ends, then once more, returning what is not reserved.
func (s *Spender) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.FlushEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), opTimeout)
			s.Flush(fctx, true)
			cancel()
			return
		case <-t.C:
			s.Flush(ctx, false)
		}
	}
}

// Flush expires the holds past their time (released: a request whose
// usage never came, as one whose replica died, was not recorded as served
// either), moves settled costs to spent, renews the leases, gives back
// what idle leases do not need, and forgets ended periods. final gives
// back everything unreserved.
func (s *Spender) Flush(ctx context.Context, final bool) {
	now := s.cfg.Now()
	type job struct {
		sc   *scope
		idle bool
	}
	var jobs []job
	type fix struct {
		sc     *scope
		holder string
		e      expired
	}
	var fixes []fix
	s.mu.Lock()
	for id, h := range s.holds {
		if now.UnixMilli() > h.expires {
			s.releaseLocked(&h)
			delete(s.holds, id)
		}
	}
	renewBy := now.Add(s.cfg.LeaseTTL / 2).UnixMilli()
	for k, sc := range s.scopes {
		for h, e := range sc.rec.Expired {
			if s.cfg.Served != nil && now.UnixMilli() > e.Until+settleGrace.Milliseconds() && !now.Before(sc.fixAfter) {
				fixes = append(fixes, fix{sc, h, e})
			}
		}
		idle := final || now.Sub(sc.used) > idleAfter
		expiring := sc.held > 0 && sc.rec.Leases[s.cfg.Holder].Expires < renewBy
		switch {
		case sc.done != 0 || expiring || (idle && sc.held > sc.open):
			jobs = append(jobs, job{sc, idle})
		case sc.pins > 0:
		case len(sc.rec.Expired) > 0 && s.cfg.Served != nil:
			// Kept until the ledger corrects what dead holders left.
		case sc.held == 0 && sc.open == 0 && sc.done == 0 && (idle || now.After(sc.reset) && !sc.reset.IsZero()):
			// Forgotten, and read afresh when next needed.
			delete(s.scopes, k)
			if s.current[sc.ck] == sc {
				delete(s.current, sc.ck)
			}
		}
	}
	s.mu.Unlock()
	for _, j := range jobs {
		j.sc.io.Lock()
		for range maxTries {
			retry, _, err := s.write(ctx, j.sc, 0, now, j.idle)
			if err != nil || !retry {
				break
			}
			s.mu.Lock()
			again := j.sc.rev == 0
			s.mu.Unlock()
			if !again {
				break
			}
		}
		j.sc.io.Unlock()
	}
	for _, f := range fixes {
		if err := s.correct(ctx, f.sc, f.holder, f.e); err != nil {
			s.mu.Lock()
			f.sc.fixAfter = now.Add(fixRetry)
			s.mu.Unlock()
			if s.cfg.OnError != nil {
				s.cfg.OnError(err)
			}
		}
	}
}

// Spend is a budget's period as the bucket has it: settled, and the
// leases deciders hold, which bound what their open requests may cost.
type Spend struct {
	Spent, Leased Micro
}

// Read is the spend of n's budget in the period holding now.
func Read(ctx context.Context, kv jetstream.KeyValue, n Need, now time.Time) (Spend, error) {
	_, _, pid := Bounds(n.Budget.Period, now)
	s := &Spender{cfg: Config{KV: kv}}
	rec, _, err := s.read(ctx, n.Kind+"."+n.Name+"."+pid)
	if err != nil {
		return Spend{}, err
	}
	sp := Spend{Spent: rec.Spent}
	for _, l := range rec.Leases {
		if l.Expires >= now.UnixMilli() {
			sp.Leased += l.Amount
		} else {
			sp.Spent += l.Amount
		}
	}
	return sp, nil
}
