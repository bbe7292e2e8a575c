package policy

import (
	"math/rand/v2"
	"time"

	"github.com/switchyard-llm/switchyard/broker/policy/kvindex"
)

// pick is the replica choice of one decision: the candidates of the group
// the resolution led to, the rows' own state, and the outcome. Filters,
// steps and checks (steps.go) are its methods; each keeps its state in its
// own field below and reads no other row's.
type pick struct {
	req     *Request
	rng     *rand.Rand
	now     time.Time
	nowNano int64
	adapter string     // the LoRA the request runs with
	holders *prefixMap // the model's prefix map, nil when none (or no prefix)
	pending *prefixMap // the model's pending blocks (loadView.pending), nil when none
	// kv is the exact prefix index when it holds any key, with the model
	// to look up and the replicas by their index id.
	kv      *kvindex.Index
	kvModel string
	byKV    []*replica
	// ttftObjective is the objective in force (the request's, the
	// tenant's or the model's), 0 when none.
	ttftObjective time.Duration

	// prof is the profile in force for the group's pool, and blockTokens
	// the prompt tokens of a prefix block.
	prof        *profile
	blockTokens int32

	// The group's candidates, set by the walk over the filters.
	cands               []cand
	epoch               uint64 // replica.mark of the candidates
	nfresh, nfull       int
	release, saturation float64
	dead, stale         int64 // dead_after, stale_after in ns (dead: no limit when panicked)
	deaf                int64 // this router's own deafness in ns (Router.deafness)
	// panicked: fewer than the pool's panic_below of the group's ready
	// replicas look alive (panics).
	panicked bool
	// alone: no other decider is live (Router.SetDeciders): nothing
	// herds with this one's choices.
	alone bool

	// The outcome.
	chosen   int // the candidate chosen, -1 before a step chose
	released int // the candidate an affinity step let go (the release valve, or prefix affinity's weighing), -1 when none
	// releasedWhy is why it was let go (Alternative.Why).
	releasedWhy string
	step        *step // the step that chose
	switched    uint8 // bit k: checks[k] switched the replica

	// The rows' own state.
	endpoint endpointFilter
	eject    ejectFilter
	region   regionFilter
	adapters loraStep
	warm     prefixStep
	pair     pairDraw
	pt       predictedStep
	dl       deadlineCheck
	obj      objectiveCheck
	fair     fairCheck
	room     batchRoomCheck
	pd       splitCheck
	peer     peerState
}

// start readies p for a decision of req.
func (p *pick) start(req *Request, rng *rand.Rand, now time.Time, nowNano int64) {
	p.req, p.rng, p.now, p.nowNano = req, rng, now, nowNano
	p.chosen, p.released = -1, -1
	p.endpoint.start(req)
}

// pairDraw is the pick's power-of-two pair: two distinct random
// candidates, the lower load_score first, drawn at most once per decision
// whichever step asks first (prefix affinity weighs a warm replica against
// it; power of two takes its winner).
type pairDraw struct {
	ij    [2]int
	drawn bool
}

// keepsPending: this decision reads and keeps the pending blocks
// (loadView.pending), as a decider alone with predicted-ttft does: it may
// choose over every replica, so what it sent one counts there until the
// engine reports it.
func (p *pick) keepsPending() bool { return p.alone && p.prof.predicts }

// twoOf returns the pair, drawing it on the first call.
func (p *pick) twoOf() [2]int {
	if !p.pair.drawn {
		n := len(p.cands)
		i, j := p.rng.IntN(n), p.rng.IntN(n-1)
		if j >= i {
			j++
		}
		if p.cands[j].load < p.cands[i].load {
			i, j = j, i
		}
		p.pair.ij, p.pair.drawn = [2]int{i, j}, true
	}
	return p.pair.ij
}
