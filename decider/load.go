package decider

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/internal/clip"
	"github.com/switchyard-llm/switchyard/internal/jsonscan"
	"github.com/switchyard-llm/switchyard/subjects"
)

// errLoadDelta is wrapped by every reason a load delta is refused.
var errLoadDelta = errors.New("bad load delta")

// errDeltaReplica: a load delta names another replica than its subject.
var errDeltaReplica = errors.New("load delta of another replica")

// DecodeLoadDelta decodes a load delta received on subject and validates
// it as a heartbeat is (deciders and batchers read deltas with it): the
// replica is the one the subject names (NATS permissions decide who may
// publish on llm.load.<id>, so the body may not speak for another replica:
// errDeltaReplica), its counts are within a
// heartbeat's ranges and its TTFT samples within theirs. A delta out of
// range is refused whole; the heartbeat in hand stays the view.
func DecodeLoadDelta(subject string, data []byte, d *subjects.LoadDelta) error {
	if len(data) > subjects.MaxLoadDeltaBytes {
		return fmt.Errorf("%w: %d bytes", errLoadDelta, len(data))
	}
	if err := readLoadDelta(subject, data, d); err != nil {
		return err
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

// readLoadDelta reads a delta as an adapter writes it: one object whose
// members are named exactly, integers in plain digits, the replica the
// subject names. A decider reads 20,000 of them a second from 1,000
// replicas, so it is read in place, without encoding/json's reflection.
// Anything else is refused.
func readLoadDelta(subject string, data []byte, d *subjects.LoadDelta) error {
	token := subject[strings.LastIndexByte(subject, '.')+1:]
	if subjects.ValidToken(token) != nil {
		return fmt.Errorf("%w: subject %q", errDeltaReplica, subject)
	}
	m := jsonscan.NewMembers(data, jsonscan.SkipSpace(data, 0))
	var ok, named bool
	for m.Next() {
		k, v := m.Key(), m.Value()
		switch {
		case k.Equal("replica"):
			if len(v) < 2 || v[0] != '"' || string(v[1:len(v)-1]) != token {
				return fmt.Errorf("%w: replica %s published on %q", errDeltaReplica, clip.Text(v, 80), subject)
			}
			d.Replica, named, ok = token, true, true
		case k.Equal("hb_seq"):
			d.Heartbeat, ok = unsigned(v)
		case k.Equal("seq"):
			d.Seq, ok = unsigned(v)
		case k.Equal("sent_unix_ms"):
			var n uint64
			n, ok = unsigned(v)
			d.SentUnixMillis = int64(min(n, 1<<62))
		case k.Equal("inflight"):
			d.Inflight, ok = signed(v)
		case k.Equal("queued_prefill_tokens"):
			d.QueuedPrefillTokens, ok = signed(v)
		case k.Equal("ttft"):
			ok = readTTFT(v, d)
		default:
			ok = true
		}
		if !ok {
			return fmt.Errorf("%w: member %s", errLoadDelta, clip.Text(k.Quoted, 64))
		}
	}
	if end := m.End(); end < 0 || jsonscan.SkipSpace(data, end) != len(data) {
		return fmt.Errorf("%w: not one JSON object", errLoadDelta)
	}
	if !named {
		return fmt.Errorf("%w: no replica", errDeltaReplica)
	}
	return nil
}

// readTTFT reads the TTFT samples, at most one more than a delta may hold
// (so that too many are refused, not cut).
func readTTFT(v []byte, d *subjects.LoadDelta) bool {
	if string(v) == "null" {
		return true
	}
	e := jsonscan.NewElems(v, 0)
	for e.Next() {
		if len(d.TTFT) > subjects.MaxLoadDeltaTTFT {
			return true
		}
		obj := e.Value()
		var s subjects.TTFTSample
		m := jsonscan.NewMembers(obj, 0)
		for m.Next() {
			k, x := m.Key(), m.Value()
			var err error
			switch {
			case k.Equal("broker"):
				if len(x) < 2 || x[0] != '"' || subjects.ValidToken(string(x[1:len(x)-1])) != nil {
					return false
				}
				s.Broker = string(x[1 : len(x)-1])
			case k.Equal("predicted_ms"):
				s.Predicted, err = strconv.ParseFloat(string(x), 64)
			case k.Equal("observed_ms"):
				s.Observed, err = strconv.ParseFloat(string(x), 64)
			}
			if err != nil {
				return false
			}
		}
		if m.End() != len(obj) {
			return false
		}
		d.TTFT = append(d.TTFT, s)
	}
	return e.End() == len(v)
}

// unsigned reads plain decimal digits, at most 18 of them.
func unsigned(v []byte) (uint64, bool) {
	if len(v) == 0 || len(v) > 18 {
		return 0, false
	}
	var n uint64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	return n, true
}

// signed reads an optionally negative integer of at most 18 digits.
func signed(v []byte) (int, bool) {
	neg := len(v) > 0 && v[0] == '-'
	if neg {
		v = v[1:]
	}
	n, ok := unsigned(v)
	if neg {
		return -int(n), ok
	}
	return int(n), ok
}

// onLoad applies an adapter's load delta to the load view, and compares
// the predictions this decider made with the first tokens the replica
// observed. Only a replica registered in the table is believed, as for
// heartbeats.
func (dec *Decider) onLoad(m *nats.Msg) {
	var d subjects.LoadDelta
	switch err := DecodeLoadDelta(m.Subject, m.Data, &d); {
	case errors.Is(err, errDeltaReplica):
		dec.refuse(refusedLoadReplica, "load delta naming another replica than its subject ignored", "subject", m.Subject)
		return
	case err != nil:
		dec.metrics.badMessages.WithLabelValues("load_delta").Inc()
		return
	}
	if t := dec.router.Table(); t == nil || t.Replicas[d.Replica] == nil {
		dec.refuseUnregistered("load delta", d.Replica)
		return
	}
	dec.router.ObserveLoadDelta(&d, dec.cfg.Now())
	for _, s := range d.TTFT {
		if s.Broker == dec.cfg.ID {
			dec.metrics.ttftError.Observe((s.Observed - s.Predicted) / 1000)
		}
	}
}
