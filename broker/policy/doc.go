// Package policy is the broker's routing decision (README.md in this
// directory): which model, which pool, which replica, admit or reject. It is
// a pipeline of small pure steps over plain values:
//
//	resolve model → pick version and pool → admission (context, quota) →
//	filter candidates → fallbacks → capacity → session | LoRA | prefix
//	affinity → power of two (or random when load data is stale) → deadline →
//	commit
//
// What the request resolves to (resolution) is kept apart from the replica
// choice (pick), whose filters, steps and checks are rows of the tables in
// steps.go.
//
// The Router also holds the load view the steps read: the routing table
// snapshot, the last heartbeat of every replica, this broker's in-flight
// count since each heartbeat, the per-model prefix map and the tenant token
// buckets. It imports no NATS: the broker feeds it heartbeats, placements
// and usage events, and takes time and randomness as inputs, so the lab runs
// it in virtual time and tests are deterministic. See README.md for the rules.
package policy
