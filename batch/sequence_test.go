package batch_test

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-llm/switchyard/batch"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects/reply"
)

// orderStandIn answers each line as an adapter does, in the reply
// protocol's frames: its first try in the way its content names, every
// later try with the accept, the head, a data frame and the end in order.
type orderStandIn struct {
	mu    sync.Mutex
	tries map[string]int
}

func (o *orderStandIn) serve(nc *nats.Conn) func(*nats.Msg) {
	return func(m *nats.Msg) {
		var body struct {
			Messages []struct {
				Content string `json:"content"`
			} `json:"messages"`
		}
		_ = json.Unmarshal(m.Data, &body)
		way := body.Messages[0].Content
		o.mu.Lock()
		o.tries[way]++
		n := o.tries[way]
		o.mu.Unlock()
		accept := reply.Frame{Kind: reply.Accept, Seq: 0, Replica: "r-1"}
		head := reply.Frame{Kind: reply.Head, Seq: 1, Status: 200, Body: []byte(`{"object":"chat.completion",`)}
		data := reply.Frame{Kind: reply.Data, Seq: 2, Body: []byte(`"echo":"` + way + `"}`)}
		end := reply.Frame{Kind: reply.End, Seq: 3}
		frames := []reply.Frame{accept, head, data, end}
		if n == 1 {
			switch way {
			case "whole": // the accept and the whole answer in the head
				frames = []reply.Frame{{Kind: reply.Head, Seq: 1, Replica: "r-1", Status: 200, End: true,
					Body: []byte(`{"object":"chat.completion","echo":"whole"}`)}}
			case "gap": // data frame 2 lost
				data.Seq, end.Seq = 3, 4
				frames = []reply.Frame{accept, head, data, end}
			case "headless": // the accept lost
				frames = []reply.Frame{head, data, end}
			case "twice": // an accept after the accept
				frames = []reply.Frame{accept, accept, head, data, end}
			}
		}
		for _, f := range frames {
			_ = nc.PublishMsg(f.Msg(m.Reply))
		}
	}
}

// TestALineIsTakenOnlyInSequence: a line's answer counts only when its
// frames come in Llm-Seq order from the accept; one that lost a message
// (a gap, the accept, a repeated accept) is tried again, and what the
// output file holds is the answer that came whole.
func TestALineIsTakenOnlyInSequence(t *testing.T) {
	stand := &orderStandIn{tries: map[string]int{}}
	g := newBatchRig(t, 60*time.Second, stand.serve)
	ctx, st := g.ctx, g.st
	ways := []string{"split", "whole", "gap", "headless", "twice"}
	var in string
	for _, w := range ways {
		in += line(w, "/v1/chat/completions", fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, w))
	}
	rec := createBatch(ctx, t, st, in)
	reg := prometheus.NewRegistry()
	g.run(t, batch.Config{ID: "b1", SuperviseEvery: 50 * time.Millisecond, AckWait: 2 * time.Second, Registerer: reg})

	var got *batch.Record
	testkit.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() (err error) {
		if got, err = st.Batch(ctx, "acme", rec.ID); err != nil {
			return err
		}
		if got.Status != batch.StatusCompleted {
			return fmt.Errorf("status %s %+v", got.Status, got.RequestCounts)
		}
		return nil
	})
	if got.RequestCounts != (batch.RequestCounts{Total: 5, Completed: 5}) || got.OutputFileID == nil {
		t.Fatalf("completed: %+v", got)
	}
	out := readLines(t, st, *got.OutputFileID)
	if len(out) != len(ways) {
		t.Fatalf("%d output lines, want %d", len(out), len(ways))
	}
	for _, l := range out {
		want := `{"object":"chat.completion","echo":"` + l.CustomID + `"}`
		if l.Response == nil || l.Response.StatusCode != 200 || string(l.Response.Body) != want {
			t.Errorf("line %s: %+v, want the body %s", l.CustomID, l.Response, want)
		}
	}
	stand.mu.Lock()
	defer stand.mu.Unlock()
	for _, w := range ways {
		want := 2 // out of order the first time
		if w == "split" || w == "whole" {
			want = 1
		}
		if stand.tries[w] != want {
			t.Errorf("line %s sent %d times, want %d", w, stand.tries[w], want)
		}
	}
	if n := testkit.Sum(reg, "switchyard_batch_items_total", map[string]string{"outcome": "retried"}); n != 3 {
		t.Errorf("%v lines retried, want the 3 out of order", n)
	}
}
