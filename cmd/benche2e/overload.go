package main

import (
	"context"
	"fmt"
	"os"
	"slices"

	"github.com/switchyard-llm/switchyard/loadgen"
)

// The overload phase: Switchyard alone at twice the highest rate it held
// (its capacity, from the steps), as a gateway that is itself the
// bottleneck meets it. The adaptive concurrency limit should refuse what
// exceeds it early and cheaply (503 gateway_overloaded), so the requests
// it admits keep about the latency they had at capacity.

// Targets of the phase.
const (
	overloadFactor      = 2
	overloadP99Ratio    = 1.5  // admitted p99 against the p99 at capacity
	overloadMinServed   = 0.8  // admitted throughput against the capacity: refusing everything is no answer
	overloadRefusalP99  = 5.0  // ms
	overloadMinCapacity = 50.0 // requests/s: below it the steps said nothing
)

type overloadPhase struct {
	Capacity    float64         `json:"capacity_rate"`
	CapacityP99 loadgen.Dur     `json:"capacity_p99_ms"`
	Rate        float64         `json:"rate"`
	Load        float64         `json:"loadavg_start"`
	Report      *loadgen.Report `json:"report"`
	// Lost counts requests that got no explicit answer: no HTTP status
	// (transport errors, timeouts) or a stream cut without its end.
	Lost int    `json:"lost"`
	Met  bool   `json:"met"`
	Why  string `json:"why,omitempty"`
}

// overload runs the phase after the steps, when Switchyard held a rate.
func (b *bench) overload(ctx context.Context) (*overloadPhase, error) {
	capacity := b.results.MaxHeld["switchyard"]
	if capacity < overloadMinCapacity {
		return nil, nil
	}
	ph := &overloadPhase{Capacity: capacity, Rate: overloadFactor * capacity}
	for _, s := range b.results.Steps {
		if s.Path == "switchyard" && s.Rate == capacity {
			ph.CapacityP99 = s.P99
		}
	}
	ph.Load = b.settle(ctx)
	i := slices.Index(pathNames, "switchyard")
	rep, err := b.load(ctx, b.urls[i:i+1], []string{"switchyard"}, ph.Rate, b.cfg.stepDuration, b.cfg.stepWarmup, false, nil)
	if err != nil {
		return nil, err
	}
	ph.Report = rep
	t := &rep.Targets[0]
	refused := 0
	if t.Refused != nil {
		refused = t.Refused.N
	}
	// Explicit failures are refusals (the phase is not streamed); the
	// generator's own in-flight cap is not the system's.
	ph.Lost = t.Errors - refused - t.ErrorsBy["in-flight cap"]
	ph.Met, ph.Why = judgeOverload(ph)
	fmt.Fprintf(os.Stderr, "overload %6g/s switchyard: admitted %d p99 %.2fms (at capacity %.2fms), refused %d %v p99 %s, lost %d %s\n",
		ph.Rate, t.OK, t.Latency.P99.Ms(), ph.CapacityP99.Ms(), refused, t.CodesBy, refusalP99(t), ph.Lost, ph.Why)
	return ph, nil
}

// refusalP99 is the refusals' p99 from the scheduled send (what the
// target judges), and from the actual send, which leaves out the load
// generator's own lateness in sending on the cores it shares with the
// stack.
func refusalP99(t *loadgen.TargetReport) string {
	if t.Refused == nil {
		return "—"
	}
	s := f3(t.Refused.P99) + "ms"
	if t.RefusedService != nil {
		s += " (" + f3(t.RefusedService.P99) + "ms from the actual send)"
	}
	return s
}

// judgeOverload checks the phase against its targets.
func judgeOverload(ph *overloadPhase) (bool, string) {
	t := &ph.Report.Targets[0]
	var why []string
	if ratio := t.Latency.P99.Ms() / max(ph.CapacityP99.Ms(), 1e-9); ratio > overloadP99Ratio {
		why = append(why, fmt.Sprintf("admitted p99 %.2f× the p99 at capacity", ratio))
	}
	if t.Refused != nil && t.Refused.P99.Ms() >= overloadRefusalP99 {
		why = append(why, fmt.Sprintf("refusal p99 %.2fms", t.Refused.P99.Ms()))
	}
	if ph.Lost > 0 {
		why = append(why, fmt.Sprintf("%d lost %v", ph.Lost, t.ErrorsBy))
	}
	if t.OKRate < overloadMinServed*ph.Capacity {
		why = append(why, fmt.Sprintf("served %.0f/s, under %.0f%% of the capacity", t.OKRate, 100*overloadMinServed))
	}
	if len(why) == 0 {
		return true, ""
	}
	return false, fmt.Sprint(why)
}

func renderOverload(p func(string, ...any), ph *overloadPhase) {
	if ph == nil {
		return
	}
	t := &ph.Report.Targets[0]
	p("### Twice the capacity\n\n")
	p("Switchyard alone at %g requests/s, twice the highest rate it held above (%g/s, p99 %s ms), for the steps' length after their warmup; %s. "+
		"Targets: the admitted requests' p99 within %.1f× the p99 at capacity, refusals answered with p99 under %.0f ms, nothing lost "+
		"(every request answered, 200 or an explicit error), and at least %.0f%% of the capacity still served.\n\n",
		ph.Rate, ph.Capacity, f3(ph.CapacityP99), loadNote(ph.Load), overloadP99Ratio, overloadRefusalP99, 100*overloadMinServed)
	refused, codes := 0, "—"
	if t.Refused != nil {
		refused = t.Refused.N
	}
	if len(t.CodesBy) > 0 {
		codes = fmt.Sprint(t.CodesBy)
	}
	met := yes(ph.Met)
	if ph.Load > indicativeLoad {
		met += " (indicative)"
	}
	p("| sent | admitted | served/s | admitted p50 | admitted p99 | refused | refusals by code | refusal p99 | lost | met |\n|---:|---:|---:|---:|---:|---:|---|---:|---:|---|\n")
	p("| %d | %d | %.0f | %s | %s | %d | %s | %s | %d | %s |\n\n", t.Sent, t.OK, t.OKRate, f3(t.Latency.P50), f3(t.Latency.P99), refused, codes, refusalP99(t), ph.Lost, met)
	if ph.Why != "" {
		p("Not met: %s.\n\n", ph.Why)
	}
}
