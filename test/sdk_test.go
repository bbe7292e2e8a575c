package test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/devstack"
)

// sdkScript runs test/sdk/sdk.mjs with args and returns its result lines.
// The SDKs are the ones test/sdk/package.json pins, installed by `make
// test`; without node or without them the test is skipped, saying why.
func sdkScript(t *testing.T, args ...string) []map[string]any {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed: the SDK tests need node 20 or later")
	}
	if _, err := os.Stat(filepath.Join("sdk", "node_modules", "openai")); err != nil {
		t.Skip("the SDKs are not installed: run `make test-sdk-deps` (make test does)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, append([]string{"sdk.mjs"}, args...)...)
	cmd.Dir = "sdk"
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node sdk.mjs %v: %v\n%s\n%s", args, err, out, stderr.Bytes())
	}
	var lines []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("sdk.mjs printed %q", sc.Text())
		}
		lines = append(lines, m)
	}
	return lines
}

// checked fails the test for every check line that is not ok and returns
// the lines that are not checks.
func checked(t *testing.T, lines []map[string]any, want int) []map[string]any {
	t.Helper()
	var rest []map[string]any
	n := 0
	for _, l := range lines {
		name, ok := l["check"].(string)
		if !ok {
			rest = append(rest, l)
			continue
		}
		n++
		if l["ok"] != true {
			t.Errorf("%s: %v", name, l["detail"])
		} else {
			t.Logf("%s: ok", name)
		}
	}
	if n != want {
		t.Errorf("%d checks ran, want %d", n, want)
	}
	return rest
}

// TestSDKs calls the stack with the SDKs people use: openai for Node (chat,
// the Responses API with and without a stream, a stored conversation over
// three turns that stays on its replica, models.retrieve), the AI SDK's
// default OpenAI model (the Responses API) and Anthropic's SDK (messages
// with and without a stream, an error). Then the conversation's replica
// drains, and the next turn is the clear error the SDK raises.
func TestSDKs(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: apiReplicas(), HeartbeatEvery: 100 * time.Millisecond, ScrapeEvery: 100 * time.Millisecond})
	url := st.GatewayURL()
	rest := checked(t, sdkScript(t, "sdks", url), 10)
	if len(rest) != 1 {
		t.Fatalf("want the stored conversation's owner, got %v", rest)
	}
	owner, _ := rest[0]["owner"].(string)
	last, _ := rest[0]["last"].(string)
	if owner == "" || last == "" {
		t.Fatal("no stored conversation to drain")
	}
	drainInTable(t, st, owner)

	checked(t, sdkScript(t, "drained", url, last), 1)
}

// TestSDKBatch runs the Batch API with the official openai SDK for Node,
// the pinned 6.x and 5.x: files.create → batches.create → batches.retrieve
// until completed (within 60 s) → files.content, one answer per custom_id.
func TestSDKBatch(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: apiReplicas()})
	checked(t, sdkScript(t, "batch", st.GatewayURL()), 2)
}
