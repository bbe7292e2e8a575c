package loadgen

import (
	"syscall"
	"time"
)

// preciseSleep blocks the calling thread in nanosleep. The runtime's timers
// wake an idle process up to a millisecond late (netpoll waits in whole
// milliseconds), which would bunch a schedule of thousands of sends a second
// into millisecond bursts; nanosleep is late by tens of microseconds.
func preciseSleep(d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	_ = syscall.Nanosleep(&ts, nil) // EINTR only shortens the sleep; the caller loops
}
