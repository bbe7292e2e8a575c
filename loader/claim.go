package loader

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Phases of a claim in the llm-loads bucket, one key per model version
// (<model>/<version>, "_" for none). The key is created or updated with
// compare-and-set, so when two loaders (or one loader hearing two brokers)
// race for the same model, exactly one wins and runs the action.
const (
	phaseLoading   = "loading"
	phaseReady     = "ready"
	phaseFailed    = "failed"
	phaseUnloading = "unloading"
)

type claimRecord struct {
	Phase       string `json:"phase"`
	Loader      string `json:"loader"`
	SinceMillis int64  `json:"since_unix_ms"`
}

// claim takes the model version for phase (loading or unloading). It
// reports false when another load or unload holds it, or when a failed
// load's cooldown has not passed.
func (l *Loader) claim(ctx context.Context, model, version, phase string, now time.Time) (bool, error) {
	k := key(model, version)
	val, err := json.Marshal(claimRecord{Phase: phase, Loader: l.cfg.ID, SinceMillis: now.UnixMilli()})
	if err != nil {
		return false, err
	}
	e, err := l.claims.Get(ctx, k)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		_, err = l.claims.Create(ctx, k, val)
		if errors.Is(err, jetstream.ErrKeyExists) {
			return false, nil // another loader created it first
		}
		return err == nil, err
	}
	if err != nil {
		return false, err
	}
	var cur claimRecord
	if json.Unmarshal(e.Value(), &cur) != nil {
		cur = claimRecord{} // a garbled claim is taken over
	}
	age := now.Sub(time.UnixMilli(cur.SinceMillis))
	switch cur.Phase {
	case phaseLoading:
		if age < l.cfg.LoadTimeout {
			return false, nil
		}
	case phaseUnloading:
		if age < l.cfg.DrainTimeout+l.cfg.LoadTimeout {
			return false, nil
		}
	case phaseReady:
		// A load request right after the load was ready comes from a
		// broker (or reaches this loader) before the first ready heartbeat
		// did. Only a model that has had no ready replica for a while, as
		// seen by a loader that has listened that long, is loaded again.
		if phase == phaseLoading && (age < liveFor || now.Sub(l.startedAt()) < liveFor) {
			return false, nil
		}
	case phaseFailed:
		if phase == phaseLoading && age < l.cfg.Cooldown {
			return false, nil
		}
	}
	_, err = l.claims.Update(ctx, k, val, e.Revision())
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return false, nil // another loader updated it first
	}
	return err == nil, err
}

func (l *Loader) startedAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.started
}

// setClaim records the outcome of the claim this loader holds.
func (l *Loader) setClaim(model, version, phase string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	val, _ := json.Marshal(claimRecord{Phase: phase, Loader: l.cfg.ID, SinceMillis: time.Now().UnixMilli()})
	if _, err := l.claims.Put(ctx, key(model, version), val); err != nil {
		l.log.Warn("could not record the load's outcome", "model", model, "phase", phase, "err", err)
	}
}

// releaseClaim deletes the claim: the next request starts a new load.
func (l *Loader) releaseClaim(model, version string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := l.claims.Delete(ctx, key(model, version)); err != nil {
		l.log.Warn("could not release the load claim", "model", model, "err", err)
	}
}
