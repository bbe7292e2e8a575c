package adapter

import (
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
)

// The decode time a heartbeat carries (decode_ms): how long a request
// holds its batch slot after its first token. With a full batch a new
// request waits for a running one to end, a slot freeing about every
// decode time / max_batch; brokers count that wait in the predicted time
// to first token (broker/policy, "Predicted TTFT"), and the prefill rate
// is learned without it.

// decodeAlpha is the weight of one stream in the decode time's average.
const decodeAlpha = 0.2

// observeDecode learns the decode time from one stream that ended whole:
// the time from its first token to its end, in a moving average, bounded
// to what a heartbeat may carry.
func (l *loadState) observeDecode(d time.Duration) {
	ms := min(float64(d)/float64(time.Millisecond), subjects.MaxHeartbeatMillis)
	if !(ms > 0) {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.decode == 0 {
		l.decode = ms
		return
	}
	l.decode += decodeAlpha * (ms - l.decode)
}

// slotWaitFor is the wait for a batch slot that a request expects when
// the adapter holds inflight requests (itself included) on an engine
// with batch slots: those beyond the batch, a slot freeing every decode
// time / batch. 0 while the decode time is unknown or the batch has room.
func (l *loadState) slotWaitFor(inflight, batch int) time.Duration {
	if batch <= 0 || inflight <= batch {
		return 0
	}
	l.mu.Lock()
	decode := l.decode
	l.mu.Unlock()
	return time.Duration(float64(inflight-batch) * decode / float64(batch) * float64(time.Millisecond))
}

// slotWait is slotWaitFor the adapter's requests now and its engine's
// batch; an interactive request at a priority engine waits for none of
// the batch lines waiting (batchWaiting), a batch line (behind) for all.
func (a *Adapter) slotWait(behind bool) time.Duration {
	batch := a.engineLimits().batch
	n := a.InFlight()
	if !behind {
		n -= a.batchWaiting(n, batch)
	}
	return a.load.slotWaitFor(n, batch)
}

// batchWaiting is how many of inflight requests beyond an engine's batch
// of batch are batch lines: at an engine scheduling by priority, the
// batch lines held wait last, behind every interactive request.
func (a *Adapter) batchWaiting(inflight, batch int) int {
	return min(max(inflight-batch, 0), int(a.book.batchHeld.Load()))
}
