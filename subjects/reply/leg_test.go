package reply_test

import (
	"testing"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/subjects/reply"
)

// TestLeg: a prefill leg's answer reads back as a whole answer with the
// engine's status and body, and a refusal as a rejection with its status,
// so the decode adapter tells them apart by status alone.
func TestLeg(t *testing.T) {
	for _, status := range []int{200, 400, 500} {
		leg := reply.Leg(status, []byte(`{"kv_transfer_params":{}}`))
		m := leg.Msg("_INBOX.x")
		f := reply.Decode(m)
		if f.Kind != reply.Head || f.Status != status || !f.End || string(f.Body) != `{"kv_transfer_params":{}}` {
			t.Errorf("Leg(%d) read back as %+v", status, f)
		}
		if m.Header.Get(subjects.HdrStatus) == "" {
			t.Errorf("Leg(%d) without %s: %v", status, subjects.HdrStatus, m.Header)
		}
	}
	refused := reply.Rejection(subjects.NewError(503, subjects.CodeAllReplicasBusy, "busy"))
	if f := reply.Decode(refused.Msg("_INBOX.x")); f.Kind != reply.Error || f.Status != 503 {
		t.Errorf("a refused leg read back as %+v", f)
	}
}
