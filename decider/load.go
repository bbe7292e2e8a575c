package decider

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/subjects"
)

// errLoadDelta is wrapped by every reason a load delta is refused.
var errLoadDelta = errors.New("bad load delta")

// errDeltaReplica: a load delta names another replica than its subject.
var errDeltaReplica = errors.New("load delta of another replica")

// decodeLoadDelta decodes a load delta received on subject and validates
// it as a heartbeat is: the replica is the one the subject names (NATS
// permissions decide who may publish on llm.load.<id>, so the body may not
// speak for another replica: errDeltaReplica), its counts are within a
// heartbeat's ranges and its TTFT samples within theirs. A delta out of
// range is refused whole; the heartbeat in hand stays the view.
func decodeLoadDelta(subject string, data []byte, d *subjects.LoadDelta) error {
	if len(data) > subjects.MaxLoadDeltaBytes {
		return fmt.Errorf("%w: %d bytes", errLoadDelta, len(data))
	}
	if err := json.Unmarshal(data, d); err != nil {
		return fmt.Errorf("%w: %w", errLoadDelta, err)
	}
	if i := strings.LastIndexByte(subject, '.'); i < 0 || subject[i+1:] != d.Replica || subjects.ValidToken(d.Replica) != nil {
		return fmt.Errorf("%w: replica %q published on %q", errDeltaReplica, d.Replica, subject)
	}
	switch {
	case !count(d.Inflight):
		return fmt.Errorf("%w: inflight %d not in [0, %d]", errLoadDelta, d.Inflight, subjects.MaxHeartbeatCount)
	case d.QueuedPrefillTokens < 0 || d.QueuedPrefillTokens > subjects.MaxQueuedPrefillTokens:
		return fmt.Errorf("%w: queued_prefill_tokens %d not in [0, %d]", errLoadDelta, d.QueuedPrefillTokens, subjects.MaxQueuedPrefillTokens)
	case len(d.TTFT) > subjects.MaxLoadDeltaTTFT:
		return fmt.Errorf("%w: %d ttft samples, at most %d", errLoadDelta, len(d.TTFT), subjects.MaxLoadDeltaTTFT)
	}
	for _, s := range d.TTFT {
		if !millis(s.Predicted) || !millis(s.Observed) {
			return fmt.Errorf("%w: a ttft sample not in [0, %d] ms", errLoadDelta, subjects.MaxHeartbeatMillis)
		}
	}
	return nil
}

// onLoad applies an adapter's load delta to the load view, and compares
// the predictions this decider made with the first tokens the replica
// observed. Only a replica registered in the table is believed, as for
// heartbeats.
func (b *Decider) onLoad(m *nats.Msg) {
	var d subjects.LoadDelta
	switch err := decodeLoadDelta(m.Subject, m.Data, &d); {
	case errors.Is(err, errDeltaReplica):
		b.refuse(refusedLoadReplica, "load delta naming another replica than its subject ignored", "subject", m.Subject)
		return
	case err != nil:
		b.metrics.badMessages.WithLabelValues("load_delta").Inc()
		return
	}
	if t := b.router.Table(); t == nil || t.Replicas[d.Replica] == nil {
		b.refuse(refusedReplica, "load delta of a replica not registered in the table ignored", "replica", d.Replica)
		return
	}
	b.router.ObserveLoadDelta(&d, b.cfg.Now())
	for _, s := range d.TTFT {
		if s.Broker == b.cfg.ID {
			b.metrics.ttftError.Observe((s.Observed - s.Predicted) / 1000)
		}
	}
}
