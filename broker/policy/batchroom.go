package policy

import (
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
)

// BatchRoom is the share of a replica's batch that batch work may fill
// when its engine serves requests first come first served: a batch request
// goes only to a replica with fresh load data whose engine holds (running
// and waiting, or the adapter's own in-flight count when that is more)
// below BatchRoom of its max_batch, and KV below the release threshold.
// The rest of the batch is room interactive requests find at once, so
// batch work fills spare capacity without taking theirs. This broker's
// sends since the heartbeat are not counted: that count only resets with
// the next heartbeat, so at any real rate it would call an idle replica
// full (the batcher's window bounds what arrives between two heartbeats).
const BatchRoom = 0.75

// RetryBatchRoom is the Retry-After of a batch request refused for room:
// the pool's load changes with every heartbeat.
const RetryBatchRoom = time.Second

// batchRoomCheck is the batch-room check's own state.
type batchRoomCheck struct {
	loser int // the candidate the check switched away from, -1 when none
}

// batchRoom keeps batch work where it has room: the chosen replica, else
// the least loaded candidate with room, else a 503 the batcher paces
// itself on (never a failed line). Interactive requests pass.
func (p *pick) batchRoom() (switched bool, e *subjects.APIError) {
	p.room.loser = -1
	if p.req.Priority != subjects.PriorityBatch || p.req.ResumeFrom != "" {
		return false, nil
	}
	if p.hasRoom(&p.cands[p.chosen]) {
		return false, nil
	}
	best := -1
	for i := range p.cands {
		if p.hasRoom(&p.cands[i]) && (best < 0 || p.cands[i].load < p.cands[best].load) {
			best = i
		}
	}
	if best >= 0 {
		p.room.loser, p.chosen = p.chosen, best
		return true, nil
	}
	e = subjects.NewError(503, subjects.CodeAllReplicasBusy, "No replica has room for batch work; retry later.")
	e.RetryAfter = RetryBatchRoom
	return false, e
}

// hasRoom applies BatchRoom, or subjects.BatchHold to a replica whose
// engine schedules by priority (heartbeat scheduling "priority"): there an
// interactive request is admitted before every waiting batch line, so
// batch work may fill the whole batch and a short queue behind it, whose
// lines take each slot that frees when no interactive request waits. The
// rest of the queue stays free: interactive requests would otherwise find
// its places taken (the at-capacity check). The adapter's last load delta
// brings its in-flight count up to date.
func (p *pick) hasRoom(c *cand) bool {
	x := c.x
	held := max(x.running+x.waiting, clamp32(x.hb.Inflight)) + x.delta
	limit := BatchRoom * float64(x.maxBatch)
	if x.byPriority {
		limit = float64(subjects.BatchHold(int(x.maxBatch), int(x.maxQueue)))
	}
	return c.fresh && float64(held) < limit && x.kv < p.release
}

func (p *pick) whyBatchRoom(i int) string {
	if i == p.room.loser {
		return WhyNoBatchRoom
	}
	return ""
}
