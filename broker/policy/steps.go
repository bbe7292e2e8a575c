package policy

// step declares one replica-choice step. The pipeline walks steps in order
// and the first whose pick returns true decides; the last always does.
type step struct {
	// reason is Decision.Reason when the step decides, and its name.
	reason string
	// pick chooses st.chosen and returns true, or passes to the next step.
	pick func(st *decision) bool
	// why says why candidate i lost when this step decided; "" leaves it
	// to the load comparison (saturated, or a higher load_score).
	why func(st *decision, i int) string

	// The reason after one route modifier, joined once here so the hot
	// path does not allocate (see reasonOf).
	afterPoolFallback, afterCanaryGone string
}

// steps is the replica choice, in order. It is never written after
// initialisation.
//
// Each affinity step keeps its replica only while its kv_usage is below
// the pool's release threshold: the valve that stops one popular
// conversation, adapter or prefix from overloading a replica. Prefix
// affinity weighs a warm replica above the threshold against the
// power-of-two draw instead of dropping it (see prefix).
var steps = [...]step{
	newStep(ReasonResponse, (*decision).pinned, nil),
	newStep(ReasonSession, (*decision).session, func(*decision, int) string { return WhyNotAffine }),
	newStep(ReasonLora, (*decision).lora, (*decision).whyLora),
	newStep(ReasonPrefix, (*decision).prefix, (*decision).whyPrefix),
	newStep(ReasonOnly, (*decision).only, nil),
	newStep(ReasonStaleRandom, (*decision).staleRandom, func(*decision, int) string { return WhyNotDrawn }),
	newStep(ReasonPowerOfTwo, (*decision).powerOfTwo, (*decision).whyPowerOfTwo),
}

func newStep(reason string, pick func(*decision) bool, why func(*decision, int) string) step {
	return step{
		reason: reason, pick: pick, why: why,
		afterPoolFallback: ReasonPoolFallback + "+" + reason,
		afterCanaryGone:   ReasonCanaryGone + "+" + reason,
	}
}

// choose walks the steps; the one that picks is kept in st.step.
func (st *decision) choose() {
	st.chosen, st.released, st.other = -1, -1, -1
	for i := range steps {
		if steps[i].pick(st) {
			st.step = &steps[i]
			return
		}
	}
}

// why says why candidate i lost to the chosen one: the deadline or the
// release valve first, then the deciding step, then the load comparison.
func (st *decision) why(i int) string {
	switch {
	case i == st.deadlineLoser:
		return WhyDeadline
	case i == st.released:
		return WhyReleased
	}
	if st.step.why != nil {
		if w := st.step.why(st, i); w != "" {
			return w
		}
	}
	if st.cands[i].saturated {
		return WhySaturated
	}
	return WhyHigherLoad
}

// reasonOf joins the route modifiers and the deciding step. The common
// single-modifier cases are precomputed so the hot path does not allocate.
func reasonOf(fallback string, poolFallback, canaryGone, deadline bool, s *step) string {
	if fallback == "" && !deadline && !(poolFallback && canaryGone) {
		switch {
		case poolFallback:
			return s.afterPoolFallback
		case canaryGone:
			return s.afterCanaryGone
		}
		return s.reason
	}
	r := ""
	add := func(p string) {
		if r != "" {
			r += "+"
		}
		r += p
	}
	if fallback != "" {
		add(ReasonFallback + fallback)
	}
	if canaryGone {
		add(ReasonCanaryGone)
	}
	if poolFallback {
		add(ReasonPoolFallback)
	}
	add(s.reason)
	if deadline {
		add(ReasonDeadline)
	}
	return r
}
