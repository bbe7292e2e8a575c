package owners_test

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/natsconn/natstest"
	"github.com/switchyard-llm/switchyard/owners"
)

func TestWriterCreatesReaderFinds(t *testing.T) {
	_, url := natstest.Start(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	r := owners.NewReader(js, "")
	if _, err := r.Get(ctx, "resp_1"); !errors.Is(err, owners.ErrNotFound) {
		t.Fatalf("reader before any writer: %v, want ErrNotFound (and no bucket created)", err)
	}
	if _, err := js.KeyValue(ctx, owners.DefaultBucket); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Fatalf("a reader created the bucket: %v", err)
	}
	w := owners.New(js, "")
	rec := owners.Record{Tenant: "acme", Replica: "r-1", Model: "m", Tokens: 42}
	if err := w.Put(ctx, "resp_1", rec); err != nil {
		t.Fatal(err)
	}
	r = owners.NewReader(js, "")
	if got, err := r.Get(ctx, "resp_1"); err != nil || got != rec {
		t.Fatalf("Get = %+v, %v; want %+v", got, err, rec)
	}
	kv, _ := js.KeyValue(ctx, owners.DefaultBucket)
	st, _ := kv.Status(ctx)
	if st.TTL() != owners.DefaultTTL || st.History() != 1 {
		t.Errorf("bucket TTL %v, history %d; want %v, 1", st.TTL(), st.History(), owners.DefaultTTL)
	}
	if err := w.Forget(ctx, "resp_1"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Get(ctx, "resp_1"); !errors.Is(err, owners.ErrNotFound) {
		t.Errorf("after Forget: %v, want ErrNotFound", err)
	}
	// A second writer opens the bucket the first created.
	if err := owners.New(js, "").Put(ctx, "resp_2", rec); err != nil {
		t.Errorf("second writer: %v", err)
	}
}
