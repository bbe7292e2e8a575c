package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/internal/stages"
)

func TestTmpLegs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rec := stages.New(1)
	st, err := devstack.Start(ctx, devstack.Config{Listen: "127.0.0.1:0", NATSListen: "127.0.0.1:-1", DataDir: t.TempDir(), Stages: rec})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	st.Ready(ctx)
	for _, kb := range []int{1, 64, 480} {
		body := promptBody("chat-small", kb<<10, 8, false)
		resp, err := http.Post(st.GatewayURL()+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
		if err != nil {
			t.Fatal(err)
		}
		io.ReadAll(resp.Body)
		resp.Body.Close()
		l := rec.Legs()
		h := 0
		for _, x := range l.Request.Header {
			h += x[0] + x[1]
		}
		t.Logf("%d KB: status %d request body %d, %d header lines %d bytes: %v; replies %d: %+v", kb, resp.StatusCode, l.Request.Body, len(l.Request.Header), h, l.Request.Header, len(l.Replies), l.Replies)
	}
}
