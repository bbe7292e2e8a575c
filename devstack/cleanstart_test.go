package devstack_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// A clean start of the dev stack, as `make run` makes it (every dev replica,
// the loader and the batcher, a fresh data directory), logs no warning: a
// newcomer's first screen must not look broken. The log is read from the
// start until the stack is ready and has served a request.
func TestCleanStartLogsNoWarning(t *testing.T) {
	var logs testkit.SyncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := devstack.Start(ctx, devstack.Config{
		Listen: "127.0.0.1:0", NATSListen: "127.0.0.1:-1", DataDir: t.TempDir(),
		Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("stack stopped with errors: %v", err)
		}
	})
	if err := st.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	if code, body := chat(t, st.GatewayURL()); code != 200 {
		t.Fatalf("chat answered %d: %s", code, body)
	}
	var records int
	for line := range strings.SplitSeq(logs.String(), "\n") {
		var r map[string]any
		if json.Unmarshal([]byte(line), &r) != nil {
			continue
		}
		records++
		if lvl, _ := r["level"].(string); lvl == slog.LevelWarn.String() || lvl == slog.LevelError.String() {
			t.Errorf("%s on a clean start: %s", lvl, line)
		}
	}
	if records == 0 {
		t.Error("the stack logged nothing at info level: the check reads no log")
	}
}
