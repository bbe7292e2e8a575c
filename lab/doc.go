// Package lab is Switchyard's routing laboratory: a discrete-event simulator
// that runs the real routing policy (broker/policy) against replicas modelled
// by the engine simulator's model (enginesim), in virtual time.
//
// The router sees replicas the way a broker does: through heartbeats built
// from each engine's Stats every second (optionally delivered late), and
// through its own in-flight counts. Several router instances can run side by
// side. Baseline policies (round-robin, random, least-loaded, power of two
// without affinity) sit behind the same small Picker interface as the real
// policy, so every experiment compares like with like on the same workload.
//
// The experiments reproduce the routing questions of the design's seed text
// (affinity release threshold, exclusion cascade, metric staleness,
// long-context segregation, LoRA affinity, herding, baselines); each writes
// CSV files, PNG charts and a section of report.md. A run is deterministic
// for a given seed: every random draw comes from a seeded generator, and the
// simulated clock never reads the wall clock.
//
// The package never imports the NATS broker or any NATS code.
package lab
