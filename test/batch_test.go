package test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// batchLines is a JSONL batch of n chat lines for model, custom ids
// req-1 … req-n.
func batchLines(n int, model string) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, `{"custom_id":"req-%d","method":"POST","url":"/v1/chat/completions","body":{"model":%q,"max_tokens":3,"messages":[{"role":"user","content":"line %d of a batch"}]}}`+"\n", i, model, i)
	}
	return b.String()
}

// runBatch uploads lines, creates the batch and returns it.
func runBatch(t *testing.T, c *openai.Client, lines string) *openai.Batch {
	t.Helper()
	ctx := context.Background()
	f, err := c.Files.New(ctx, openai.FileNewParams{
		File: openai.File(strings.NewReader(lines), "batch.jsonl", "application/jsonl"), Purpose: openai.FilePurposeBatch,
	})
	if err != nil {
		t.Fatalf("files.create: %v", err)
	}
	b, err := c.Batches.New(ctx, openai.BatchNewParams{
		InputFileID: f.ID, Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: openai.BatchNewParamsCompletionWindow24h,
	})
	if err != nil {
		t.Fatalf("batches.create: %v", err)
	}
	if b.Status != "validating" || b.InputFileID != f.ID || b.Endpoint != "/v1/chat/completions" {
		t.Fatalf("new batch: %+v", b)
	}
	return b
}

// awaitBatch polls the batch until it reaches a final status.
func awaitBatch(t *testing.T, c *openai.Client, id string, within time.Duration) *openai.Batch {
	t.Helper()
	var b *openai.Batch
	testkit.CheckFor(t, within, 200*time.Millisecond, func() error {
		var err error
		if b, err = c.Batches.Get(context.Background(), id); err != nil {
			return err
		}
		switch b.Status {
		case "completed", "failed", "expired", "cancelled":
			return nil
		}
		return fmt.Errorf("status %s, %d of %d done", b.Status, b.RequestCounts.Completed+b.RequestCounts.Failed, b.RequestCounts.Total)
	})
	return b
}

// fileLines reads a file's content as output lines by custom_id, failing
// on a custom_id seen twice.
func fileLines(t *testing.T, c *openai.Client, id string) map[string]map[string]any {
	t.Helper()
	resp, err := c.Files.Content(context.Background(), id)
	if err != nil {
		t.Fatalf("files.content %s: %v", id, err)
	}
	defer resp.Body.Close()
	out := map[string]map[string]any{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 4<<20)
	for sc.Scan() {
		var l map[string]any
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("output line %q: %v", sc.Text(), err)
		}
		id, _ := l["custom_id"].(string)
		if _, dup := out[id]; dup {
			t.Fatalf("custom_id %q answered twice", id)
		}
		out[id] = l
	}
	return out
}

func TestBatchCompletesWithOneResultPerLine(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: devstack.ReplicasNamed("l70-gen-0", "l70-gen-1", "l8-gen-0")})
	c := client(st, "sk-acme-dev")
	lines := batchLines(39, "chat-large") +
		`{"custom_id":"forbidden","method":"POST","url":"/v1/chat/completions","body":{"model":"no-such-model","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}}` + "\n"
	b := runBatch(t, c, lines)
	b = awaitBatch(t, c, b.ID, 60*time.Second)
	if b.Status != "completed" || b.RequestCounts.Total != 40 || b.RequestCounts.Completed != 39 || b.RequestCounts.Failed != 1 {
		t.Fatalf("batch: status %s counts %+v", b.Status, b.RequestCounts)
	}
	if b.CompletedAt == 0 || b.InProgressAt == 0 || b.FinalizingAt == 0 || b.OutputFileID == "" || b.ErrorFileID == "" {
		t.Errorf("timestamps or files missing: %+v", b)
	}
	out := fileLines(t, c, b.OutputFileID)
	if len(out) != 39 {
		t.Errorf("output has %d lines, want 39", len(out))
	}
	for i := 1; i <= 39; i++ {
		l := out[fmt.Sprintf("req-%d", i)]
		resp, _ := l["response"].(map[string]any)
		body, _ := resp["body"].(map[string]any)
		if resp["status_code"] != 200.0 || body["object"] != "chat.completion" || l["error"] != nil {
			t.Errorf("req-%d: %v", i, l)
		}
	}
	errs := fileLines(t, c, b.ErrorFileID)
	resp, _ := errs["forbidden"]["response"].(map[string]any)
	if len(errs) != 1 || resp["status_code"] != 404.0 {
		t.Errorf("error file: %v", errs)
	}
	// The output belongs to the tenant: another sees nothing of it.
	other := client(st, "sk-intern-dev")
	if _, err := other.Files.Content(context.Background(), b.OutputFileID); !isStatus(err, 404) {
		t.Errorf("another tenant read the output: %v", err)
	}
	if _, err := other.Batches.Get(context.Background(), b.ID); !isStatus(err, 404) {
		t.Errorf("another tenant read the batch: %v", err)
	}
	page, err := c.Batches.List(context.Background(), openai.BatchListParams{Limit: openai.Int(1)})
	if err != nil || len(page.Data) != 1 || page.Data[0].ID != b.ID {
		t.Errorf("batches.list: %v %+v", err, page)
	}
}

func isStatus(err error, status int) bool {
	var apiErr *openai.Error
	return errors.As(err, &apiErr) && apiErr.StatusCode == status
}
