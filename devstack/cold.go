package devstack

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/switchyard-llm/switchyard/devstack/fleet"
	"github.com/switchyard-llm/switchyard/loader"
)

// DefaultColdLoad is how long the dev stack's cold model takes to load at
// --speed 1: about what a 141B-parameter mixture of experts takes to come
// off local NVMe onto its GPUs.
const DefaultColdLoad = 20 * time.Second

// ColdReplicas are the dev replicas of cold-tier models (fleet.Cold).
// None runs at start: the dev loader starts one when a request asks for
// its model, and stops it after the model's idle_unload_after.
func ColdReplicas() []Replica { return fleet.Cold() }

// coldRun is a cold replica while it runs.
type coldRun struct {
	cancel context.CancelFunc // stops its engine
	done   <-chan struct{}    // closed when the engine stopped
}

// devActions are the dev loader's load and unload actions: a cold dev
// replica is an engine simulator and an adapter started in this process,
// its engine answering /health with 503 (so the replica heartbeats
// loading) until the load time has passed.
type devActions struct {
	s        *Stack
	fallback loader.Actions

	mu      sync.Mutex
	running map[string]*coldRun
}

var _ loader.Actions = (*devActions)(nil)

func (a *devActions) Run(ctx context.Context, op loader.Op) error {
	var r *Replica
	for _, c := range a.s.cfg.ColdReplicas {
		if c.Model == op.Model && (op.Version == "" || c.Version == op.Version) {
			r = &c
			break
		}
	}
	if r == nil {
		return a.fallback.Run(ctx, op)
	}
	if op.Unload {
		return a.stop(r.ID)
	}
	return a.start(*r)
}

// start launches the replica and returns; the replica heartbeats loading
// until the scaled load time has passed, then ready.
func (a *devActions) start(r Replica) error {
	s := a.s
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.running[r.ID] != nil {
		return nil
	}
	f := new(Faults)
	f.SetHealth(http.StatusServiceUnavailable) // loading its weights
	ctx, cancel := context.WithCancel(s.engineCtx)
	url, stopped, err := s.startEngine(ctx, r, f)
	if err != nil {
		cancel()
		return err
	}
	run := &coldRun{cancel: cancel, done: stopped}
	if err := s.startAdapter(r, url); err != nil {
		cancel()
		<-run.done
		return fmt.Errorf("adapter %s: %w", r.ID, err)
	}
	a.running[r.ID] = run
	loadTime := time.Duration(float64(s.cfg.ColdLoad) / s.cfg.Speed)
	s.wg.Go(func() {
		t := time.NewTimer(loadTime)
		defer t.Stop()
		select {
		case <-t.C:
			f.SetHealth(0) // loaded
		case <-ctx.Done():
		case <-s.runCtx.Done():
		}
	})
	s.log.Info("cold replica loading", "replica", r.ID, "model", r.Model, "load_time", loadTime)
	return nil
}

// stop drains and stops the replica's adapter (SIGTERM), then its engine.
func (a *devActions) stop(id string) error {
	a.mu.Lock()
	run := a.running[id]
	delete(a.running, id)
	a.mu.Unlock()
	if run == nil {
		return nil
	}
	if err := a.s.StopReplica(id); err != nil {
		return err
	}
	run.cancel()
	<-run.done
	a.s.partsMu.Lock()
	delete(a.s.engines, id)
	delete(a.s.faults, id)
	a.s.partsMu.Unlock()
	return nil
}
