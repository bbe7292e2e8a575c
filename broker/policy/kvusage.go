package policy

// kvUsage prefers the replica with the least of its KV cache in use, the
// signal the seed's prefix step ranks warm replicas by: its heartbeat's
// kv_usage, in [0, 1].
func kvUsage(x *replica, _ *scoredView) float64 { return x.kv }
