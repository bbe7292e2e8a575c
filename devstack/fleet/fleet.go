// Package fleet is the replicas `switchyard dev` runs, defined once: the
// dev stack starts them, and tests that need the dev deployment without
// starting it (the routing policy's) register them as their adapters would.
package fleet

import (
	"fmt"

	"github.com/switchyard-llm/switchyard/enginesim"
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// Replica is one simulated engine and its adapter.
type Replica struct {
	ID, Model, Version, Pool string
	KVBlocks, MaxLoras       int
	Adapters                 []string
	// EngineURL points the adapter at an engine running elsewhere (e.g.
	// http://127.0.0.1:8000); no simulated engine is started for it, and
	// Engine returns nil for its id. Benchmarks use it to put the stack and
	// a plain proxy in front of the same engine.
	EngineURL string
	// EngineScheduling is the scheduling policy of the engine at EngineURL
	// (adapter.Config.EngineScheduling; default fcfs). The simulated
	// engines schedule by priority unless the stack says otherwise.
	EngineScheduling string
	// KVEventsBind, with EngineURL, is the address the adapter binds for
	// the KV-event feed of an engine that dials out (llm-d's vLLM
	// simulator): the adapter's --kv-events-bind (port 0: the system's
	// choice, Stack.KVEventsAddr). Empty: no feed.
	KVEventsBind string
	// MaxBatch and MaxQueue are the capacity the adapter declares
	// (default 32 and 128, the simulated engine's).
	MaxBatch, MaxQueue int
	// Endpoints the adapter says its engine serves (default: vLLM's, all).
	Endpoints []string
	// Role is what the replica serves of a disaggregated model
	// (table.RolePrefill, table.RoleDecode; default both).
	Role string
	// Region is the adapter's --region (default none).
	Region string
	// ITL is the simulated engine's decode step (enginesim.Config.ITL;
	// default the simulator's).
	ITL time.Duration
}

// Dev is the deployment `switchyard dev` runs: thirteen simulated
// replicas of four models across the five pools of the dev table. The
// coder replica says it serves what llama.cpp's server does (no Responses
// API), so a Responses request for its model shows endpoint_not_supported.
// The disaggregated model has two prefill and two decode replicas in the
// general pool: a long prompt's prefill runs on one of the first, its
// decode on one of the others.
func Dev() []Replica {
	const l70, l8, coder, pd = "llama-3-70b-instruct", "llama-3-8b-instruct", "qwen-coder-32b", "llama-3-70b-pd"
	return []Replica{
		{ID: "l70-gen-0", Model: l70, Version: "v1.5.0", Pool: table.PoolGeneral, KVBlocks: 8192},
		{ID: "l70-gen-1", Model: l70, Version: "v1.5.0", Pool: table.PoolGeneral, KVBlocks: 8192},
		{ID: "l70-long-0", Model: l70, Version: "v1.5.0", Pool: table.PoolLongContext, KVBlocks: 16384},
		{ID: "l70-prem-0", Model: l70, Version: "v1.5.0", Pool: table.PoolPremium, KVBlocks: 8192},
		{ID: "l70-batch-0", Model: l70, Version: "v1.5.0", Pool: table.PoolBatch, KVBlocks: 8192},
		{ID: "l70-canary-0", Model: l70, Version: "v1.6.0", Pool: table.PoolCanary, KVBlocks: 8192},
		{ID: "l8-gen-0", Model: l8, Version: "v1.0.0", Pool: table.PoolGeneral, KVBlocks: 8192, MaxLoras: 4, Adapters: []string{"team-x-v3", "team-y-v1"}},
		{ID: "l8-gen-1", Model: l8, Version: "v1.0.0", Pool: table.PoolGeneral, KVBlocks: 8192, MaxLoras: 4, Adapters: []string{"team-x-v3", "team-y-v1"}},
		{ID: "coder-gen-0", Model: coder, Version: "v1.0.0", Pool: table.PoolGeneral, KVBlocks: 8192,
			Endpoints: []string{subjects.EndpointChat, subjects.EndpointCompletions, subjects.EndpointEmbeddings, subjects.EndpointMessages}},
		{ID: "pd-prefill-0", Model: pd, Version: "v1.0.0", Pool: table.PoolGeneral, KVBlocks: 8192, Role: table.RolePrefill},
		{ID: "pd-prefill-1", Model: pd, Version: "v1.0.0", Pool: table.PoolGeneral, KVBlocks: 8192, Role: table.RolePrefill},
		{ID: "pd-decode-0", Model: pd, Version: "v1.0.0", Pool: table.PoolGeneral, KVBlocks: 8192, Role: table.RoleDecode},
		{ID: "pd-decode-1", Model: pd, Version: "v1.0.0", Pool: table.PoolGeneral, KVBlocks: 8192, Role: table.RoleDecode},
	}
}

// Cold is the dev deployment's cold tier: replicas of a model that is not
// loaded until a request asks for it (the table's mixtral-8x22b).
func Cold() []Replica {
	return []Replica{
		{ID: "mixtral-gen-0", Model: "mixtral-8x22b", Version: "v1.0.0", Pool: table.PoolGeneral, KVBlocks: 8192},
	}
}

// Named is the dev replicas with these ids, in this order. An unknown id
// is a defect of the caller and panics.
func Named(ids ...string) []Replica {
	dev := Dev()
	out := make([]Replica, 0, len(ids))
next:
	for _, id := range ids {
		for _, r := range dev {
			if r.ID == id {
				out = append(out, r)
				continue next
			}
		}
		panic(fmt.Sprintf("fleet: no dev replica %q", id))
	}
	return out
}

// Engine is the simulated engine's configuration the dev stack runs the
// replica with (devstack; lab replay --profile dev plays the same): its
// model, KV cache, adapters' slots and decode step, the simulated engine's
// default batch and queue, scheduling by priority.
func (r Replica) Engine() enginesim.Config {
	return enginesim.Config{Model: r.Model, KVBlocks: r.KVBlocks, MaxBatch: DefaultMaxBatch, MaxQueue: DefaultMaxQueue, MaxLoras: r.MaxLoras,
		Scheduling: enginesim.SchedulingPriority, ITL: r.ITL}
}

// Registration is the routing-table entry the replica's adapter writes
// under replicas.<id> once its engine is ready.
func (r Replica) Registration() table.Replica {
	maxBatch, maxQueue := r.Capacity()
	return table.Replica{Model: r.Model, Version: r.Version, Pool: r.Pool, MaxBatch: maxBatch, MaxQueue: maxQueue,
		MaxLoras: r.MaxLoras, State: subjects.StateReady, Role: r.Role, Endpoints: r.Endpoints}
}

// Capacity is the batch and queue the replica's adapter declares: its own
// MaxBatch and MaxQueue, else the defaults.
func (r Replica) Capacity() (maxBatch, maxQueue int) {
	maxBatch, maxQueue = r.MaxBatch, r.MaxQueue
	if maxBatch <= 0 {
		maxBatch = DefaultMaxBatch
	}
	if maxQueue <= 0 {
		maxQueue = DefaultMaxQueue
	}
	return maxBatch, maxQueue
}

// The capacity a replica declares unless it says otherwise: the simulated
// engine's.
const (
	DefaultMaxBatch = 32
	DefaultMaxQueue = 128
)
