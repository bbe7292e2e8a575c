package lab

// Experiment is one of the lab's experiments.
type Experiment struct {
	Name  string
	Title string
	Run   func(Options) *Section
}

// Experiments lists the experiments in report order.
func Experiments() []Experiment {
	return []Experiment{
		{"threshold", "affinity release threshold sweep", func(o Options) *Section { return Threshold(o).Section() }},
		{"cascade", "exclude vs deprioritize saturated replicas", func(o Options) *Section { return Cascade(o).Section() }},
		{"staleness", "load-aware routing on stale load data", func(o Options) *Section { return Staleness(o).Section() }},
		{"longctx", "long-context segregation", func(o Options) *Section { return LongCtx(o).Section() }},
		{"lora", "LoRA adapter affinity", func(o Options) *Section { return Lora(o).Section() }},
		{"herding", "global least-loaded vs power of two across routers", func(o Options) *Section { return Herding(o).Section() }},
		{"baselines", "every baseline and Switchyard on one workload", func(o Options) *Section { return Baselines(o).Section() }},
		{"prefix-bench", "llm-d's prefix benchmark against an oracle", func(o Options) *Section { return PrefixBench(o).Section() }},
		{"pd", "aggregated against disaggregated prefill and decode", func(o Options) *Section { return PD(o).Section() }},
		{"noisy-neighbour", "fair shedding when one tenant floods a pool", func(o Options) *Section { return Noisy(o).Section() }},
		{"objectives", "TTFT objectives over a load ramp", func(o Options) *Section { return Objectives(o).Section() }},
		{"replay", "trace replay: the peers' routers side by side", func(o Options) *Section { return ReplayGenerated(o).Section() }},
	}
}

// Lookup returns the experiment called name.
func Lookup(name string) (Experiment, bool) {
	for _, e := range Experiments() {
		if e.Name == name {
			return e, true
		}
	}
	return Experiment{}, false
}
