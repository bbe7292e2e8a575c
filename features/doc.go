// Package features extracts the routing features of an OpenAI request body:
// the canonical prompt, the token estimate, the chained prefix block hashes
// (Llm-Prefix) and the feature flags (Llm-Features). The gateway runs it once
// per request; a broker runs it only when a direct NATS client left the
// headers out (docs/protocol.md, "Prefix features").
//
// It is pure: no NATS, no I/O, no clock.
package features
