package adapter

import (
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/natsconn/natstest"
	"github.com/switchyard-llm/switchyard/subjects"
)

// BenchmarkAccept is one request's accept sent alone (no accept delay), as
// every request sends it unless its head comes first.
func BenchmarkAccept(b *testing.B) {
	_, url := natstest.Start(b)
	nc, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	body := acceptBody("replica-0")
	b.ReportAllocs()
	for b.Loop() {
		st := &stream{nc: nc, reply: "llm.reply.gw.bench"}
		if err := st.accept("replica-0", body, 0); err != nil {
			b.Fatal(err)
		}
	}
}

// TestAcceptAlone: an accept sent alone is seq 0 with Llm-Accepted and the
// body docs/protocol.md gives it, {"replica":"<id>"}.
func TestAcceptAlone(t *testing.T) {
	st, sub := replyStream(t)
	st.next = 0
	if err := st.accept("r-1", acceptBody("r-1"), 0); err != nil {
		t.Fatal(err)
	}
	m := sent(t, sub, 1)[0]
	if m.Header.Get(subjects.HdrSeq) != "0" || m.Header.Get(subjects.HdrAccepted) != "r-1" || string(m.Data) != `{"replica":"r-1"}` {
		t.Errorf("accept %v %q", m.Header, m.Data)
	}
}
