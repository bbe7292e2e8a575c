package main

import (
	"flag"
	"time"
)

// warmUpVar registers --warm-up, one flag with one meaning on the broker
// and the gateway: the longest wait for a heartbeat from every ready
// replica before the part takes requests (the broker joins the queue
// group; a deciding gateway's /readyz passes). Read it with warmUp.
func warmUpVar(fs *flag.FlagSet, p *time.Duration, what string) {
	fs.DurationVar(p, "warm-up", 2*time.Second, what+": longest wait for a heartbeat from every ready replica (0: none; at most 1m)")
}

// warmUp is the config value of --warm-up d: 0, "no wait" asked for
// explicitly, is negative in broker.Config and gateway.Config, whose zero
// value is the default.
func warmUp(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
