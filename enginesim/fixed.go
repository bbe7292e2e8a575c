package enginesim

import (
	"context"
	"sync/atomic"
	"time"
)

// Fixed mode answers every request with the same TTFT and ITL whatever the
// load, so a benchmark of the layers in front of the engine measures those
// layers and not the engine's queueing. Requests do not touch the engine
// model; the counts below stand in for its state on /metrics.

type fixedCounts struct {
	running      atomic.Int64
	blocks       atomic.Int64 // KV blocks the running requests would hold
	promptTokens atomic.Int64
	genTokens    atomic.Int64
}

type fixedSource struct {
	s      *Server
	g      *generation
	start  time.Time
	blocks int64
	last   time.Time
	closed bool
}

func (s *Server) openFixed(g *generation) *fixedSource {
	blocks := int64((g.req.PromptTokens + g.req.MaxTokens + s.cfg.Engine.BlockTokens - 1) / s.cfg.Engine.BlockTokens)
	s.inflight.Add(1)
	s.fixed.running.Add(1)
	s.fixed.blocks.Add(blocks)
	return &fixedSource{s: s, g: g, start: time.Now(), blocks: blocks}
}

func (src *fixedSource) next(ctx context.Context, seen int) (progress, error) {
	cfg := &src.s.cfg
	n := src.g.req.MaxTokens
	if seen >= n {
		return progress{tokens: seen, done: true}, nil
	}
	// Token k (1-based) is due at TTFT + (k-1)·ITL after the start.
	due := cfg.Engine.TTFTBase + time.Duration(seen)*cfg.Engine.ITL
	due = time.Duration(float64(due) / cfg.Speed)
	if err := fixedDelay(ctx, time.Until(src.start.Add(due))); err != nil {
		return progress{tokens: seen}, err
	}
	now := time.Now()
	model := cfg.Engine.Model
	if seen == 0 {
		src.s.fixed.promptTokens.Add(int64(src.g.req.PromptTokens))
		src.s.m.ttft.WithLabelValues(model).Observe(now.Sub(src.start).Seconds())
	} else {
		src.s.m.itl.WithLabelValues(model).Observe(now.Sub(src.last).Seconds())
	}
	src.last = now
	src.s.fixed.genTokens.Add(1)
	p := progress{tokens: seen + 1, done: seen+1 == n}
	if p.done {
		src.s.m.e2e.WithLabelValues(model).Observe(now.Sub(src.start).Seconds())
		src.s.m.success.WithLabelValues(src.g.reason, model).Inc()
	}
	return p, nil
}

func (src *fixedSource) close() {
	if src.closed {
		return
	}
	src.closed = true
	src.s.inflight.Add(-1)
	src.s.fixed.running.Add(-1)
	src.s.fixed.blocks.Add(-src.blocks)
}
