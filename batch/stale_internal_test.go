package batch

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/natsconn/natstest"
)

// The leader's answer on a file: there once written, not once deleted,
// not for a name never written.
func TestLeaderHasAFileOnlyWhileItIsThere(t *testing.T) {
	_, url := natstest.Start(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	js, _ := jetstream.New(nc)
	st, err := OpenStore(ctx, js, 1)
	if err != nil {
		t.Fatal(err)
	}
	in := `{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m"}}` + "\n"
	f, err := st.PutFile(ctx, "acme", "in.jsonl", PurposeBatch, strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if has, known := st.leaderHas(ctx, objectName("acme", f.ID)); !has || !known {
		t.Errorf("the leader does not have the file just written")
	}
	if has, known := st.leaderHas(ctx, objectName("acme", "file-never")); has || !known {
		t.Errorf("the leader has a file never written")
	}
	if err := st.DeleteFile(ctx, "acme", f.ID); err != nil {
		t.Fatal(err)
	}
	if has, known := st.leaderHas(ctx, objectName("acme", f.ID)); has || !known {
		t.Errorf("the leader still has the deleted file")
	}
}
