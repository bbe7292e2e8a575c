package batch

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/natsconn/natstest"
	"github.com/switchyard-llm/switchyard/subjects"
)

// testStore opens a batch store on a NATS server of the test's own; the
// context ends with the test.
func testStore(t *testing.T) (context.Context, jetstream.JetStream, *Store) {
	t.Helper()
	_, url := natstest.Start(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	js, _ := jetstream.New(nc)
	st, err := OpenStore(ctx, js, 1)
	if err != nil {
		t.Fatal(err)
	}
	return ctx, js, st
}

// The leader's answer on a file: there once written, not once deleted,
// not for a name never written.
func TestLeaderHasAFileOnlyWhileItIsThere(t *testing.T) {
	ctx, _, st := testStore(t)
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

// A stored batch file passed the Checker, so a line CheckInput now fails
// to parse can only be a read the stream cut short or garbled: the
// creation gets the store's 503, not a 400 that blames the client's file.
// (A line for another endpoint is the client's 400 at once: the Checker
// did not know the batch's endpoint.) The garbled read is made with the object store's own parts: the file's
// metadata is pointed at chunks of another content of the same size,
// so the read fails its digest only at the end, after the bad line.
func TestAGarbledReadOfAStoredFileIsNotTheClients400(t *testing.T) {
	ctx, js, st := testStore(t)
	line := `{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m"}}` + "\n"
	f, err := st.PutFile(ctx, "acme", "in.jsonl", PurposeBatch, strings.NewReader(line+line))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, apiErr := st.CheckInput(ctx, "acme", f.ID, "/v1/chat/completions"); apiErr != nil {
		t.Fatalf("the file as stored: %v", apiErr)
	}
	name := objectName("acme", f.ID)
	good, err := st.files.GetInfo(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	garbled := strings.Replace(line, "{", "[", 1) + line
	other, err := st.files.PutString(ctx, "other", garbled)
	if err != nil {
		t.Fatal(err)
	}
	meta := *good
	meta.NUID = other.NUID
	meta.ModTime = time.Time{}
	data, err := json.Marshal(&meta)
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg("$O." + subjects.FilesBucket + ".M." + base64.URLEncoding.EncodeToString([]byte(name)))
	m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	m.Data = data
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	_, _, apiErr := st.CheckInput(ctx, "acme", f.ID, "/v1/chat/completions")
	if apiErr == nil || apiErr.Status != 503 || apiErr.RetryAfter == 0 {
		t.Fatalf("a garbled read of a stored file: %+v, want the store's 503 with Retry-After", apiErr)
	}
	if !strings.Contains(apiErr.Message, "digest") {
		t.Errorf("the 503 does not say the read failed its digest: %q", apiErr.Message)
	}
}

// The leader's answer on a batch record: there once written, not once
// deleted, not for a batch never created. An item is dropped for want of
// its batch only on this answer.
func TestLeaderHasARecordOnlyWhileItIsThere(t *testing.T) {
	ctx, _, st := testStore(t)
	if _, err := st.batches.Put(ctx, recordKey("acme", "batch_one"), []byte(`{"id":"batch_one","tenant":"acme"}`)); err != nil {
		t.Fatal(err)
	}
	if has, known := st.leaderHasRecord(ctx, "acme", "batch_one"); !has || !known {
		t.Errorf("the leader does not have the record just written")
	}
	if has, known := st.leaderHasRecord(ctx, "acme", "batch_never"); has || !known {
		t.Errorf("the leader has a record never written")
	}
	if has, known := st.leaderHasRecord(ctx, "umbrella", "batch_one"); has || !known {
		t.Errorf("the leader has another tenant's record")
	}
	// A record under the key that names another batch is none of it (as
	// getRecord reads it): its item is not held back for ever.
	if _, err := st.batches.Put(ctx, recordKey("acme", "batch_two"), []byte(`{"id":"batch_one","tenant":"acme"}`)); err != nil {
		t.Fatal(err)
	}
	if has, known := st.leaderHasRecord(ctx, "acme", "batch_two"); has || !known {
		t.Errorf("the leader has a record for batch_two that names batch_one")
	}
	if err := st.batches.Delete(ctx, recordKey("acme", "batch_one")); err != nil {
		t.Fatal(err)
	}
	if has, known := st.leaderHasRecord(ctx, "acme", "batch_one"); has || !known {
		t.Errorf("the leader still has the deleted record")
	}
}
