package broker

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects"
)

// TestADeadlineOutOfRangeIsRefused: a direct client's Llm-Deadline that is
// not unix milliseconds from 1 to subjects.MaxDeadlineMillis is answered
// with a 400 naming the header; one in range is routed.
func TestADeadlineOutOfRangeIsRefused(t *testing.T) {
	e := newFaultEnv(t)
	e.heartbeat(ready("r-0", 0.2))
	e.heartbeat(ready("r-1", 0.2))
	body := []byte(`{"model":"chat-small","messages":[{"role":"user","content":"hi"}]}`)
	ask := func(deadline string) *nats.Msg {
		m := nats.NewMsg("llm.route.default")
		m.Header.Set(subjects.HdrDeadline, deadline)
		m.Data = body
		var r *nats.Msg
		// The broker's route subscription may still be on its way to
		// the server: no responders until it arrives.
		testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() (err error) {
			r, err = e.nc.RequestMsg(m, 2*time.Second)
			return err
		})
		return r
	}
	for _, v := range []string{"0", "-1", "soon", "1.5", strconv.Itoa(subjects.MaxDeadlineMillis + 1), "9223372036854775807"} {
		r := ask(v)
		if r.Header.Get(subjects.HdrStatus) != "400" || !strings.Contains(string(r.Data), subjects.HdrDeadline) {
			t.Errorf("Llm-Deadline %q: %v %s, want a 400 naming the header", v, r.Header, r.Data)
		}
	}
	in := strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)
	if r := ask(in); r.Header.Get(subjects.HdrRouted) == "" {
		t.Errorf("Llm-Deadline %s: %v %s, want the request routed", in, r.Header, r.Data)
	}
}
