package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects"
	replyproto "github.com/switchyard-llm/switchyard/subjects/reply"
)

// TestHeldStreamAnsweredWithAnError: a stream held while its cold model
// loads is already 200; when the replica it then goes to answers with an
// error status, the client's stream ends with that error as its error
// event (the relay judges it a rejection after the first byte), never a
// [DONE].
func TestHeldStreamAnsweredWithAnError(t *testing.T) {
	const model = "mixtral-8x22b"
	u := newUpstream(t, gateway.Config{ColdKeepalive: 20 * time.Millisecond}, func(r *reply, _ int) {
		if r.m.Header.Get(subjects.HdrColdWaited) == "" {
			f := replyproto.Rejection(subjects.NewError(503, subjects.CodeModelLoading, model+" is loading"))
			f.Header[subjects.HdrRouteModel] = []string{model}
			_ = r.nc.PublishMsg(f.Msg(r.m.Reply))
			return
		}
		r.accept("mx-0")
		r.send(nats.Header{subjects.HdrStatus: {"400"}, subjects.HdrContent: {"application/json"}},
			`{"error":{"message":"the prompt is too long","type":"invalid_request_error","param":null,"code":"context_length_exceeded"}}`)
		r.end("")
	})
	js, _ := jetstream.New(u.nc)
	bucket, err := js.KeyValue(context.Background(), "llm-routing")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bucket.Put(context.Background(), "models."+model,
		[]byte(`{"versions": ["v1.0.0"], "tier": "cold", "max_context_tokens": 65536, "default_max_tokens": 1024, "on_cold": "wait"}`)); err != nil {
		t.Fatal(err)
	}
	ready, _ := json.Marshal(subjects.LoadStatus{Model: model, Phase: subjects.LoadReady, Loader: "test"})

	var body string
	// Until the gateway has the entry, the request gets model_loading
	// at once; then it is held.
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		resp, err := http.Post(u.gw+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"`+model+`","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			b, _ := io.ReadAll(resp.Body)
			return fmt.Errorf("not held: %d %s", resp.StatusCode, b)
		}
		// The second comment is written once the hold waits for the
		// load's status: the ready status is news to it then.
		rd := bufio.NewReader(resp.Body)
		var read strings.Builder
		for comments := 0; comments < 2; {
			line, err := rd.ReadString('\n')
			read.WriteString(line)
			if err != nil {
				return fmt.Errorf("the held stream ended before its second comment: %q", read.String())
			}
			if strings.HasPrefix(line, ": waiting for "+model) {
				comments++
			}
		}
		if err := u.nc.Publish(subjects.New("").ControlLoadStatus(), ready); err != nil {
			return err
		}
		rest, _ := io.ReadAll(rd)
		body = read.String() + string(rest)
		return nil
	})
	if !strings.HasPrefix(body, ": waiting for "+model+" to load\n\n") ||
		!strings.Contains(body, "\n\ndata: {\"error\":{\"message\":\"the prompt is too long\"") ||
		!strings.Contains(body, `"code":"context_length_exceeded"`) || strings.Contains(body, "[DONE]") {
		t.Errorf("held stream answered 400: %q, want the comments, then the 400's error as the stream's error event", body)
	}
	if n := u.counter("switchyard_gateway_cold_waits_total", map[string]string{"outcome": "ready"}); n != 1 {
		t.Errorf("cold waits ended ready = %v, want 1", n)
	}
}
