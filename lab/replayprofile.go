package lab

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/switchyard-llm/switchyard/deploy/examples"
	"github.com/switchyard-llm/switchyard/devstack/fleet"
	"github.com/switchyard-llm/switchyard/enginesim"
	"github.com/switchyard-llm/switchyard/table"
)

// Replica profiles of a replay: what the pool is made of and which table
// it runs under.
const (
	// ReplayProfileLab is the lab's pool: Replicas replicas of the lab's
	// engine profile with a KV cache of 16 384 blocks, the lab's table.
	ReplayProfileLab = "lab"
	// ReplayProfileDev is the pool `switchyard dev` serves DevReplayModel
	// with: its general replicas, each engine as the dev stack configures
	// it, run at the dev stack's --speed, under the dev table's policy.
	// `switchyard bench --trace` against `switchyard dev` replays the same
	// trace through that stack (make replay-check).
	ReplayProfileDev = "dev"
)

// ReplayProfiles are the replica profiles a replay may run.
func ReplayProfiles() []string { return []string{ReplayProfileLab, ReplayProfileDev} }

// DevReplayModel is the dev stack's model a dev-profile replay plays: two
// replicas in the general pool and no other pool, so every request of the
// trace is decided among the same replicas in the lab and in the stack.
const DevReplayModel = "llama-3-8b-instruct"

// replaySetup is the pool and table of a replay.
type replaySetup struct {
	engine     enginesim.Config // one replica's engine
	replicas   int
	policy     map[string]any // the table's policy value, before the arm's fields
	context    int            // the model's max_context_tokens
	maxBlocks  int            // the prefix blocks the gateway sends
	blockChars int            // the characters of one of them
	describe   string         // the pool, for the report
}

// setup is the pool and table cfg asks for.
func (cfg ReplayConfig) setup() (replaySetup, error) {
	switch cfg.Profile {
	case "", ReplayProfileLab:
		n := cfg.Replicas
		if n <= 0 {
			n = 8
		}
		return replaySetup{engine: replayProfile(), replicas: n, policy: map[string]any{"prefix_max_blocks": replayMaxBlocks},
			context: 262144, maxBlocks: replayMaxBlocks, blockChars: PrefixBlockChars,
			describe: fmt.Sprintf("%d replicas of the lab's profile with a KV cache of 16 384 blocks", n)}, nil
	case ReplayProfileDev:
		return devSetup(cfg.Speed)
	}
	return replaySetup{}, fmt.Errorf("unknown replica profile %q (want one of %v)", cfg.Profile, ReplayProfiles())
}

// devSetup is the dev stack's pool for DevReplayModel at speed (the dev
// stack's --speed; 0 is 1): the engine configuration devstack gives each
// of its replicas, every cost divided by speed as enginesim's server
// divides them, and the dev table's policy and model limits.
func devSetup(speed float64) (replaySetup, error) {
	if speed == 0 {
		speed = 1
	}
	if !(speed > 0) || speed > 1e6 {
		return replaySetup{}, fmt.Errorf("speed %v: want a number above 0, at most 1e6", speed)
	}
	var reps []fleet.Replica
	for _, r := range fleet.Dev() {
		if r.Model == DevReplayModel {
			reps = append(reps, r)
		}
	}
	if len(reps) == 0 || slices.ContainsFunc(reps, func(r fleet.Replica) bool {
		return r.Pool != table.PoolGeneral || r.Region != "" || r.Engine() != reps[0].Engine()
	}) {
		return replaySetup{}, fmt.Errorf("the dev fleet's %s replicas are not one general pool of equal replicas", DevReplayModel)
	}
	eng := reps[0].Engine().WithDefaults()
	eng.Model = ModelID
	for _, d := range []*time.Duration{&eng.TTFTBase, &eng.PrefillPerToken, &eng.ITL, &eng.ITLPerBatch,
		&eng.KVTransferPerToken, &eng.LoraLoad, &eng.LoraPerAdapterStep} {
		*d = time.Duration(float64(*d) / speed)
	}
	flat := examples.Flat()
	var pol map[string]any
	if err := json.Unmarshal(flat[table.KeyPolicy], &pol); err != nil {
		return replaySetup{}, fmt.Errorf("the dev table's policy: %w", err)
	}
	var model struct {
		MaxContext int `json:"max_context_tokens"`
	}
	if err := json.Unmarshal(flat["models."+DevReplayModel], &model); err != nil || model.MaxContext <= 0 {
		return replaySetup{}, fmt.Errorf("the dev table has no max_context_tokens for %s", DevReplayModel)
	}
	maxBlocks, blockChars := PrefixMaxBlocks, PrefixBlockChars
	if v, ok := pol["prefix_max_blocks"].(float64); ok && v > 0 {
		maxBlocks = int(v)
	}
	if v, ok := pol["prefix_block_chars"].(float64); ok && v > 0 {
		blockChars = int(v)
	}
	return replaySetup{engine: eng, replicas: len(reps), policy: pol, context: model.MaxContext, maxBlocks: maxBlocks, blockChars: blockChars,
		describe: fmt.Sprintf("the %d general replicas `switchyard dev --speed %g` serves %s with (the simulated engine's defaults, a KV cache of %d blocks, priority scheduling), under the dev table's policy",
			len(reps), speed, DevReplayModel, eng.KVBlocks)}, nil
}
