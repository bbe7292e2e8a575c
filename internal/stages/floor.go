package stages

import (
	"time"

	"github.com/nats-io/nats.go"
)

// BusFloor measures n bare NATS requests through nc's server: a responder
// on a fresh inbox answers each at once, so the time is two hops of the
// bus and nothing of Switchyard's. It is the floor the stage table is read
// against, measured in the same run.
func BusFloor(nc *nats.Conn, n int) (StageTime, error) {
	subject := nc.NewRespInbox()
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) { _ = m.Respond(nil) })
	if err != nil {
		return StageTime{}, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.Flush(); err != nil {
		return StageTime{}, err
	}
	payload := make([]byte, 256)
	ns := make([]int64, 0, n)
	for range n {
		start := time.Now()
		if _, err := nc.Request(subject, payload, 2*time.Second); err != nil {
			return StageTime{}, err
		}
		ns = append(ns, int64(time.Since(start)))
	}
	return Quantiles("bus floor (bare NATS request and reply)", ns), nil
}
