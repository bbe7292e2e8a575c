package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/internal/stages"
)

// Every phase records the 1-minute load average it started at: on these
// two cores a phase that started above indicativeLoad shared the machine
// with other work, and its figures are marked indicative (targets are
// judged on the phases that were not).
const indicativeLoad = 1.0

// loadNow is the 1-minute load average (-1 when unknown).
func loadNow() float64 {
	f := strings.Fields(readTrim("/proc/loadavg"))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}

// settle waits, up to --settle, for the 1-minute load average to fall to
// indicativeLoad (the bench's own previous phase keeps both cores busy and
// the average decays with a one-minute time constant), and returns the load
// the phase starts at.
func (b *bench) settle(ctx context.Context) float64 {
	l := loadNow()
	if l <= indicativeLoad || b.cfg.settleMax <= 0 {
		return l
	}
	fmt.Fprintf(os.Stderr, "   waiting up to %s for the load average (%.2f) to fall to %.1f\n", b.cfg.settleMax, l, indicativeLoad)
	deadline := time.Now().Add(b.cfg.settleMax)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for l > indicativeLoad && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return l
		case <-t.C:
		}
		l = loadNow()
	}
	return l
}

// loadNote is what the document says of a phase that started at load l.
func loadNote(l float64) string {
	switch {
	case l < 0:
		return "load average at the start unknown"
	case l > indicativeLoad:
		return fmt.Sprintf("load average at the start %.2f: **indicative** (the machine was busy)", l)
	}
	return fmt.Sprintf("load average at the start %.2f", l)
}

// The stack role records the stages of every request and serves the
// table on its control listener (stages.Handlers), with the bus floor
// measured then through the stack's own NATS server.
func stageHandlers(mux *http.ServeMux, st *devstack.Stack, rec *stages.Recorder) {
	for p, h := range stages.Handlers(st.StageSummary, rec.Reset) {
		mux.Handle(p, h)
	}
}

// resetStages starts a phase's stage table; stageTable fetches it at the
// phase's end (nil when the stack serves none).
func (b *bench) resetStages(ctx context.Context, ctl string) {
	if ctl == "" {
		return
	}
	_ = stages.Reset(ctx, ctl)
}

func (b *bench) stageTable(ctx context.Context, ctl string) *stages.Summary {
	if ctl == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	sum, err := stages.Fetch(ctx, ctl)
	if err != nil {
		fmt.Fprintln(os.Stderr, "stages:", err)
		return nil
	}
	if sum.Requests == 0 {
		return nil
	}
	return sum
}

// renderStages is a phase's stage table.
func renderStages(p func(string, ...any), title string, sum *stages.Summary) {
	if sum == nil {
		return
	}
	var b strings.Builder
	sum.WriteTable(&b, title)
	p("%s", b.String())
}

// indicativeNote marks a verdict reached on a busy machine.
func indicativeNote(l float64) string {
	if l > indicativeLoad {
		return fmt.Sprintf(" — indicative only, the phase started at load %.2f", l)
	}
	return ""
}
