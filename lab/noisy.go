package lab

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"strconv"
	"time"
)

// Noisy-neighbour arms. The reference is the well-behaved tenants' run
// without the noisy one, under today's policy: nothing of theirs is shed.
const (
	ArmNoisyAlone = "well-behaved alone"
	// ArmNoisyAloneFair is the reference run under the fair-shedding
	// table, which sheds some of the well-behaved tenants' own requests.
	ArmNoisyAloneFair = "well-behaved alone, fair shedding"
	ArmNoisyEqual     = "all three at their share"
	ArmNoisyToday     = "today's policy"
	ArmNoisySat       = "Switchyard fair shedding, saturation only"
	ArmNoisyFair      = "Switchyard fair shedding"
)

// Noisy-neighbour tenants: two well-behaved ones and the noisy one.
func noisyTenants() []string { return []string{"t00", "t01", "t02"} }

const noisyTenant = "t02"

// NoisyArm is one arm's outcome, per tenant and for the two well-behaved
// ones together.
type NoisyArm struct {
	Arm     string
	Tenants []Summary // by noisyTenants()
	Good    Summary   // t00 and t01 together
	// Refused is the requests that failed, per tenant (router refusals,
	// engine rejections and requests that never got a first token).
	Refused []int
}

// RefusedShare is the share of the refusals that fell on the noisy tenant.
func (a NoisyArm) RefusedShare() float64 {
	total := 0
	for _, n := range a.Refused {
		total += n
	}
	return ratio(float64(a.Refused[2]), float64(total))
}

// NoisyResult compares today's policy with fair shedding when one of three
// equal tenants sends three times its fair share.
type NoisyResult struct {
	Rate      float64 // each well-behaved tenant's requests per second
	ShedAfter time.Duration
	Arms      []NoisyArm // alone, all at their share, today, saturation only, fair
}

// Arm returns the arm called name.
func (r *NoisyResult) Arm(name string) NoisyArm {
	for _, a := range r.Arms {
		if a.Arm == name {
			return a
		}
	}
	panic("lab: no noisy-neighbour arm " + name)
}

// P99Ratio is the well-behaved tenants' p99 TTFT in arm over their run
// without the noisy tenant.
func (r *NoisyResult) P99Ratio(arm string) float64 {
	return r.Arm(arm).Good.P99 / r.Arm(ArmNoisyAlone).Good.P99
}

// Noisy runs three tenants with equal share weights on 4 replicas; the
// pool is sized so the three at their fair share run it at about 80%. Two
// tenants send their share; the third sends three times it, which
// overloads the pool. Today's policy is the same Router with every request
// as one tenant (without two tenants to compare, nothing is shed for its
// share: the policy before fair shedding); fair shedding runs with the
// pool's shed_after and, to show why it is there, without it.
func Noisy(o Options) *NoisyResult { return noisy(o, noisyRate, noisyShedAfter) }

func noisy(o Options, rate float64, shedAfter time.Duration) *NoisyResult {
	win := o.window(300*time.Second, 120*time.Second, 60*time.Second)
	reps := pick(o, 3, 1, 1)
	cluster := replicas("r", "general", 4, Profile())
	// Five equal streams: t00, t01, and three for the noisy t02.
	w := Workload{Rate: 5 * rate, Duration: win.horizon, UserTokens: 1000, OutputTokens: 200, SizeSigma: 0.6, Tenants: 5}
	work := o.workloads("noisy-neighbour", reps, func(int) Workload { return w })
	alone, equal := make([][]*Request, reps), make([][]*Request, reps)
	for k, reqs := range work {
		for i, q := range reqs {
			q.ID = "r" + strconv.Itoa(i)
			if q.Tenant <= noisyTenant {
				equal[k] = append(equal[k], q) // t02's own stream: its share
			}
			if q.Tenant < noisyTenant {
				alone[k] = append(alone[k], q)
			}
			q.Tenant = min(q.Tenant, noisyTenant)
		}
	}
	tenants := map[string]any{}
	for _, t := range noisyTenants() {
		tenants["tenants."+t] = map[string]any{"tier": "standard", "share_weight": 1}
	}
	fair := mustTable(cluster, withKeys(tenants, map[string]any{"pools.general": map[string]any{"shed_after": shedAfter.String()}}))
	sat := mustTable(cluster, tenants)
	arms := []string{ArmNoisyAlone, ArmNoisyAloneFair, ArmNoisyEqual, ArmNoisyToday, ArmNoisySat, ArmNoisyFair}
	res := o.runGrid(len(arms), reps, func(i, k int) *Scenario {
		sc := &Scenario{Replicas: cluster, Requests: work[k], Warmup: win.warmup, Horizon: win.horizon, SLO: 2 * time.Second,
			Seed: o.seed(hashName("noisy-neighbour"), uint64(k))}
		switch arms[i] {
		case ArmNoisyAlone:
			sc.Requests = alone[k]
			sc.NewPicker = func(int) Picker { return oneTenant{NewSwitchyard(sat, "broker-0")} }
		case ArmNoisyAloneFair:
			sc.Requests = alone[k]
			sc.NewPicker = func(int) Picker { return NewSwitchyard(fair, "broker-0") }
		case ArmNoisyEqual:
			sc.Requests = equal[k]
			sc.NewPicker = func(int) Picker { return oneTenant{NewSwitchyard(sat, "broker-0")} }
		case ArmNoisyToday:
			sc.NewPicker = func(int) Picker { return oneTenant{NewSwitchyard(sat, "broker-0")} }
		case ArmNoisySat:
			sc.NewPicker = func(int) Picker { return NewSwitchyard(sat, "broker-0") }
		default:
			sc.NewPicker = func(int) Picker { return NewSwitchyard(fair, "broker-0") }
		}
		return sc
	})
	out := &NoisyResult{Rate: rate, ShedAfter: shedAfter}
	for i, a := range arms {
		arm := NoisyArm{Arm: a, Good: Pool(res[i], func(q *Request) bool { return q.Tenant != noisyTenant })}
		for _, t := range noisyTenants() {
			s := Pool(res[i], func(q *Request) bool { return q.Tenant == t })
			arm.Tenants = append(arm.Tenants, s)
			arm.Refused = append(arm.Refused, s.Failed)
		}
		out.Arms = append(out.Arms, arm)
	}
	return out
}

// The noisy-neighbour load: each tenant's fair share, in requests per
// second (three of them run the 4 replicas at about 80%), and the pool's
// shed_after.
const (
	noisyRate      = 2.5
	noisyShedAfter = 250 * time.Millisecond
)

// oneTenant routes every request as one tenant: the policy's fair-share
// check then has no two tenants to compare, which is the policy before it.
type oneTenant struct{ *Switchyard }

func (p oneTenant) Pick(req *Request, now time.Time, rng *rand.Rand) Pick {
	q := *req
	q.Tenant = "default"
	return p.Switchyard.Pick(&q, now, rng)
}

func zeroNaN(v float64) float64 {
	if v != v {
		return 0
	}
	return v
}

// verdict says whether a must held.
func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "missed"
}

func withKeys(a, b map[string]any) map[string]any {
	out := map[string]any{}
	maps.Copy(out, a)
	maps.Copy(out, b)
	return out
}

func (r *NoisyResult) headline() string {
	f := r.Arm(ArmNoisyFair)
	return fmt.Sprintf("with one of three tenants sending three times its share, fair shedding keeps the others' p99 TTFT at %.2f× "+
		"their run without it (must ≤ 1.2×: %s; with all three at their share %.2f×; today's policy %.2f×) and puts %.1f%% of "+
		"the refusals on the noisy tenant (must ≥ 95%%: %s).",
		r.P99Ratio(ArmNoisyFair), verdict(r.P99Ratio(ArmNoisyFair) <= 1.2), r.P99Ratio(ArmNoisyEqual), r.P99Ratio(ArmNoisyToday),
		100*f.RefusedShare(), verdict(f.RefusedShare() >= 0.95))
}

// Section renders the comparison.
func (r *NoisyResult) Section() *Section {
	names := []string{"well-behaved (t00, t01)", "noisy (t02)"}
	p99 := &Chart{File: "noisy-neighbour-p99-ttft.png", Title: "p99 TTFT of the well-behaved tenants (t00, t01)",
		YLabel: "p99 TTFT (ms, log scale)", Bars: true, LogY: true, LegendRight: true}
	refused := &Chart{File: "noisy-neighbour-refused.png", Title: "Requests refused or failed, by tenant",
		YLabel: "refused or failed (% of the tenant's requests)", Bars: true, LegendRight: true}
	for _, a := range r.Arms {
		p99.Categories = append(p99.Categories, a.Arm)
		refused.Categories = append(refused.Categories, a.Arm)
	}
	var rows, md [][]string
	// The p99 chart shows the well-behaved tenants only: the noisy one has
	// no requests in the reference run, and its p99 is in the table.
	var yp []float64
	for _, a := range r.Arms {
		yp = append(yp, a.Good.P99)
	}
	p99.Series = []Series{{Name: names[0], Y: yp}}
	for j, name := range names {
		var yr []float64
		for _, a := range r.Arms {
			s := a.Good
			if j == 1 {
				s = a.Tenants[2]
			}
			yr = append(yr, 100*zeroNaN(s.FailShare()))
		}
		refused.Series = append(refused.Series, Series{Name: name, Y: yr})
	}
	for _, a := range r.Arms {
		for i, t := range noisyTenants() {
			s := a.Tenants[i]
			rows = append(rows, []string{a.Arm, t, fmt.Sprint(s.N), fmt.Sprint(s.Served), fmt.Sprint(s.Failed),
				fmt.Sprint(s.Failures["fair_share_exceeded"]), ms(s.P50), ms(s.P99), f2(s.Goodput), f2(s.Offered)})
		}
		ratio := "1.00 (reference)"
		if a.Arm != ArmNoisyAlone {
			ratio = f2(r.P99Ratio(a.Arm))
		}
		share := "—"
		if a.Arm != ArmNoisyAlone && a.Arm != ArmNoisyAloneFair {
			share = pct(a.RefusedShare())
		}
		md = append(md, []string{a.Arm, ms(a.Good.P50), ms(a.Good.P99), ratio, pct(a.Good.FailShare()),
			ms(a.Tenants[2].P99), pct(a.Tenants[2].FailShare()), share})
	}
	fair := r.Arm(ArmNoisyFair)
	text := fmt.Sprintf(`**Question.** Three tenants with equal share weights use one pool; one sends three times its
fair share. Does fair shedding keep the other two as they were without it, and who is refused?

**Setup.** 4 replicas (the lab's profile), single requests of about 1000 prompt and 200 answer
tokens. Each tenant's fair share is %.1f req/s; three of them run the pool at about two thirds of
what it serves. t00 and t01 send their share, t02 sends %.1f req/s: %.1f req/s in all, more than
the pool serves. *well-behaved alone* is t00 and t01 without t02 (the reference); *all three at
their share* is t02 sending only its share (what fairness can at best give the others), both
under today's policy, which sheds nothing; *today's
policy* routes every request as one tenant, so the fair-share check has nothing to compare (the
policy before it); *saturation only* sheds only when every replica is saturated (kv ≥
saturation_kv or a full queue); *fair shedding* also sheds when every replica's predicted TTFT
is above the pool's shed_after, %s (about twice a lone request's TTFT). Refused counts every
request that did not get a first token: the router's refusals, the engines' and time-outs.

%s%s
%s
**Findings.**

- The well-behaved tenants' p99 TTFT under fair shedding is %.2f× their run without the noisy
  tenant (the must: ≤ 1.2×, %s), and %.1f%% of the refusals fall on the noisy tenant (the must:
  ≥ 95%%, %s).
- Today's policy: %.2f×, and the noisy tenant's requests wait as long as everyone's: everyone
  degrades. Saturation only: %.2f×: a pool that waits for full queues sheds after every request
  already waits behind them.
- Against their run alone under fair shedding itself, which refuses %.1f%% of their requests
  when the pool sheds (the tenant holding more of two is above its half), fair shedding is at
  %.2f×.
- With t02 at its share, under today's policy, the others are at %.2f×: three tenants at their
  share load the pool more than two, and without chunked prefill each prefill stalls the batch,
  so TTFT grows with load before any queue forms. Fair shedding does better than that because
  shed_after bounds the load: a request goes to a replica predicted below it while there is one,
  and the pool sheds once there is none. Its cost is the well-behaved requests it refuses when
  one of them holds the most for a moment.
`, r.Rate, 3*r.Rate, 5*r.Rate, r.ShedAfter, img(p99), img(refused),
		mdTable([]string{"arm", "well-behaved p50 (ms)", "well-behaved p99 (ms)", "p99 vs alone", "well-behaved refused",
			"noisy p99 (ms)", "noisy refused", "refusals on the noisy tenant"}, md),
		r.P99Ratio(ArmNoisyFair), verdict(r.P99Ratio(ArmNoisyFair) <= 1.2), 100*fair.RefusedShare(), verdict(fair.RefusedShare() >= 0.95),
		r.P99Ratio(ArmNoisyToday), r.P99Ratio(ArmNoisySat), 100*r.Arm(ArmNoisyAloneFair).Good.FailShare(),
		fair.Good.P99/r.Arm(ArmNoisyAloneFair).Good.P99, r.P99Ratio(ArmNoisyEqual))
	return &Section{
		Name: "noisy-neighbour", Title: "10. Noisy neighbour: fair shedding", Text: text, Charts: []*Chart{p99, refused},
		Headline: r.headline(),
		Tables: []*Table{{File: "noisy-neighbour.csv", Header: []string{"arm", "tenant", "requests", "served", "refused",
			"fair_share_exceeded", "p50_ttft_ms", "p99_ttft_ms", "goodput_rps", "offered_rps"}, Rows: rows}},
	}
}
