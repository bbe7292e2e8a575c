package decider

import (
	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/subjects"
)

// ejected is the router's OnEject: it runs under the router's lock, so it
// only counts, logs and hands the announcement to the publish queue.
func (dec *Decider) ejected(x policy.EjectedReplica) {
	dec.metrics.ejections.WithLabelValues(x.Replica).Inc()
	dec.log.Warn("replica ejected: its engine fails requests", "replica", x.Replica,
		"failures", x.Failures, "ejections", x.Count, "until", x.Until)
	dec.enqueue(dec.subj.Eject(x.Replica), subjects.Ejection{
		Replica: x.Replica, Broker: dec.cfg.ID, Failures: x.Failures, Count: x.Count, UntilUnixMs: x.Until.UnixMilli(),
	})
}
