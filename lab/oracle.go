package lab

import (
	"math/rand/v2"
	"time"

	"github.com/switchyard-llm/switchyard/enginesim"
	"github.com/switchyard-llm/switchyard/subjects"
)

// ReasonOracle is the oracle's reason.
const ReasonOracle = "oracle"

var _ Picker = (*Oracle)(nil)

// Oracle is the ceiling of cache-aware routing: at decision time it reads
// every replica's real prefix cache and queue from the engine model, which
// no router can, and sends the request where its estimated time to first
// token is lowest. A router fed by the engines' KV-cache events approaches
// its view of the cache; no router sees the queues without delay.
type Oracle struct {
	ids     []string
	engines []*enginesim.Engine
	// meanUncached is an average of the uncached prompt tokens the oracle
	// sends: the prefill a queued request ahead will cost.
	meanUncached float64
	meanOutput   float64
}

// NewOracle returns an oracle over the replicas ids (in Scenario order).
func NewOracle(ids []string) *Oracle { return &Oracle{ids: ids} }

func (p *Oracle) readEngines(engines []*enginesim.Engine) { p.engines = engines }

// ObserveHeartbeat implements Picker: the oracle needs none.
func (p *Oracle) ObserveHeartbeat(*subjects.Heartbeat, time.Time) {}

// Pick implements Picker.
func (p *Oracle) Pick(req *Request, _ time.Time, _ *rand.Rand) Pick {
	if len(p.engines) == 0 {
		return noReplica()
	}
	er := enginesim.Request{PromptTokens: req.PromptTokens, MaxTokens: req.MaxTokens, Prefix: req.Blocks, Lora: req.Lora}
	if p.meanUncached == 0 {
		p.meanUncached, p.meanOutput = float64(req.PromptTokens), float64(req.MaxTokens)
	}
	best, bestCost, bestUncached := -1, 0.0, 0
	for i, e := range p.engines {
		uncached := req.PromptTokens - e.CachedTokens(er)
		if c := p.cost(e, uncached, req); best < 0 || c < bestCost {
			best, bestCost, bestUncached = i, c, uncached
		}
	}
	p.meanUncached += 0.05 * (float64(bestUncached) - p.meanUncached)
	p.meanOutput += 0.05 * (float64(req.MaxTokens) - p.meanOutput)
	return Pick{Replica: p.ids[best], Reason: ReasonOracle}
}

// cost estimates the time to the request's first token on engine e, in
// seconds: its own prefill, the prefills of the requests waiting ahead of
// it, and, when the engine has no room for it (batch or KV blocks), the
// wait for running requests to finish. The uncached prefill counts twice:
// without chunked prefill it holds up the running batch and the queue as
// long as it holds up the request, and a greedy choice that ignores that
// spreads prefixes over replicas for a small gain now and evictions later.
func (p *Oracle) cost(e *enginesim.Engine, uncached int, req *Request) float64 {
	c := e.Config()
	st := e.Stats()
	step := c.TTFTBase.Seconds()
	ppt := c.PrefillPerToken.Seconds()
	// The step in progress grows with the batch; that also spreads the
	// requests that cost the same everywhere (a prefix no replica holds).
	cost := step + 2*ppt*float64(uncached) + c.ITLPerBatch.Seconds()*float64(st.Running)
	cost += float64(st.Waiting) * (step + ppt*p.meanUncached)
	need := (req.PromptTokens + req.MaxTokens + c.BlockTokens - 1) / c.BlockTokens
	perReq := max(1, (req.PromptTokens+int(p.meanOutput))/c.BlockTokens)
	slots := min(c.MaxBatch, max(1, c.KVBlocks/perReq))
	if ahead := st.Running + st.Waiting + 1 - slots; ahead > 0 || st.KVBlocksUsed+need > c.KVBlocks {
		// A running request holds its slot for its whole decode, so a slot
		// frees every service time / slots.
		service := p.meanOutput * (c.ITL.Seconds() + c.ITLPerBatch.Seconds()*float64(st.Running))
		cost += float64(max(ahead, 1)) * service / float64(slots)
	}
	return cost
}
