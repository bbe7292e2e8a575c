package test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/openai/openai-go/v3"

	"github.com/switchyard-llm/switchyard/auth"
	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/gateway"
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
	b, err := createBatch(c, lines)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// createBatch uploads lines and creates a chat batch of them.
func createBatch(c *openai.Client, lines string) (*openai.Batch, error) {
	ctx := context.Background()
	f, err := c.Files.New(ctx, openai.FileNewParams{
		File: openai.File(strings.NewReader(lines), "batch.jsonl", "application/jsonl"), Purpose: openai.FilePurposeBatch,
	})
	if err != nil {
		return nil, fmt.Errorf("files.create: %w%s", err, errorBody(err))
	}
	b, err := c.Batches.New(ctx, openai.BatchNewParams{
		InputFileID: f.ID, Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: openai.BatchNewParamsCompletionWindow24h,
	})
	if err != nil {
		return nil, fmt.Errorf("batches.create: %w%s", err, errorBody(err))
	}
	if b.Status != "validating" || b.InputFileID != f.ID || b.Endpoint != "/v1/chat/completions" {
		return nil, fmt.Errorf("new batch: %+v", b)
	}
	return b, nil
}

// awaitBatch polls the batch until it reaches a final status.
func awaitBatch(t *testing.T, c *openai.Client, id string, within time.Duration) *openai.Batch {
	t.Helper()
	var b *openai.Batch
	testkit.CheckFor(t, within, 200*time.Millisecond, batchEnded(c, id, &b))
	return b
}

// batchEnded is a poll's check that the batch id reached a final status,
// keeping its last reading in *b.
func batchEnded(c *openai.Client, id string, b **openai.Batch) func() error {
	return func() (err error) {
		if *b, err = c.Batches.Get(context.Background(), id); err != nil {
			return err
		}
		switch (*b).Status {
		case "completed", "failed", "expired", "cancelled":
			return nil
		}
		return fmt.Errorf("status %s, %d of %d done", (*b).Status, (*b).RequestCounts.Completed+(*b).RequestCounts.Failed, (*b).RequestCounts.Total)
	}
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
	// The dashboard lists it with its progress.
	dash, err := http.Get(st.GatewayURL() + "/ui/batches")
	if err != nil {
		t.Fatal(err)
	}
	defer dash.Body.Close()
	var listed []struct {
		ID, Tenant, Status string
		Counts             openai.BatchRequestCounts `json:"request_counts"`
	}
	if err := json.NewDecoder(dash.Body).Decode(&listed); err != nil || len(listed) != 1 || listed[0].ID != b.ID ||
		listed[0].Tenant != "acme" || listed[0].Status != "completed" || listed[0].Counts.Completed != 39 {
		t.Errorf("the dashboard's batches: %v %+v", err, listed)
	}
}

// errorBody is the body of the OpenAI error err carries, for a failure's
// message: the SDK's Error() gives only the status line.
func errorBody(err error) string {
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) {
		return ""
	}
	return " " + apiErr.RawJSON()
}

func isStatus(err error, status int) bool {
	var apiErr *openai.Error
	return errors.As(err, &apiErr) && apiErr.StatusCode == status
}

// upload posts content to /v1/files as key and returns the status and the
// decoded body.
func upload(t *testing.T, url, key, content string) (int, map[string]any) {
	t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	_ = mw.WriteField("purpose", "batch")
	fw, _ := mw.CreateFormFile("file", "in.jsonl")
	_, _ = io.WriteString(fw, content)
	_ = mw.Close()
	return callAPI(t, "POST", url+"/v1/files", key, mw.FormDataContentType(), &body)
}

func callAPI(t *testing.T, method, url, key, ct string, body io.Reader) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	return resp.StatusCode, m
}

// apiError checks m is the OpenAI error shape with status's type and a
// message containing want.
func apiError(t *testing.T, what string, status int, m map[string]any, wantStatus int, want string) {
	t.Helper()
	e, _ := m["error"].(map[string]any)
	msg, _ := e["message"].(string)
	if status != wantStatus || e == nil || !strings.Contains(msg, want) || e["type"] == nil {
		t.Errorf("%s: %d %v, want %d with %q in the message", what, status, m, wantStatus, want)
	}
}

func TestBatchBadInputIsRefusedWholeAndStoresNothing(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: devstack.ReplicasNamed("l70-gen-0"), NoBatcher: true,
		Gateway: gateway.Config{MaxFileLines: 5, MaxFileBytes: 4 << 10}})
	url := st.GatewayURL()
	good := batchLines(2, "chat-large")
	line := func(id, endpoint string) string {
		return `{"custom_id":"` + id + `","method":"POST","url":"` + endpoint + `","body":{"model":"chat-large","messages":[{"role":"user","content":"x"}]}}` + "\n"
	}
	for _, c := range []struct {
		name, content, want string
		status              int
	}{
		{"an empty file", "", "empty", 400},
		{"blank lines only", "\n \n", "empty", 400},
		{"a line that is not JSON", good + "{not json\n", "line 3", 400},
		{"a duplicate custom_id", line("a", "/v1/chat/completions") + line("a", "/v1/chat/completions"), "line 2", 400},
		{"an unknown url", line("a", "/v1/images"), "line 1", 400},
		{"a method other than POST", strings.Replace(line("a", "/v1/chat/completions"), "POST", "GET", 1), "line 1", 400},
		{"no body.model", `{"custom_id":"a","method":"POST","url":"/v1/completions","body":{"prompt":"x"}}`, "line 1", 400},
		{"over --max-file-lines", batchLines(6, "chat-large"), "line 6", 400},
		{"over --max-file-bytes", strings.Repeat(" ", 5<<10) + good, "bytes", 413},
	} {
		status, m := upload(t, url, "sk-acme-dev", c.content)
		apiError(t, c.name, status, m, c.status, c.want)
	}
	op := mustConnectAs(t, st, roleOperator)
	js, _ := jetstream.New(op)
	ctx := context.Background()
	if s, err := js.Stream(ctx, "OBJ_llm-files"); err != nil {
		t.Fatal(err)
	} else if info, err := s.Info(ctx); err != nil || info.State.Msgs != 0 {
		t.Errorf("refused uploads left %d messages in the object store (%v)", info.State.Msgs, err)
	}

	// A good file of acme's: the url must match the batch's endpoint.
	status, f := upload(t, url, "sk-acme-dev", good+line("emb", "/v1/embeddings"))
	if status != 200 || f["object"] != "file" || f["purpose"] != "batch" {
		t.Fatalf("upload: %d %v", status, f)
	}
	id, _ := f["id"].(string)
	create := func(key, file, endpoint string) (int, map[string]any) {
		return callAPI(t, "POST", url+"/v1/batches", key, "application/json", strings.NewReader(
			`{"input_file_id":"`+file+`","endpoint":"`+endpoint+`","completion_window":"24h"}`))
	}
	status, m := create("sk-acme-dev", id, "/v1/chat/completions")
	apiError(t, "a url not matching the endpoint", status, m, 400, "line 3")
	status, m = create("sk-acme-dev", id, "/v1/images")
	apiError(t, "an unknown endpoint", status, m, 400, "endpoint")
	status, m = callAPI(t, "POST", url+"/v1/batches", "sk-acme-dev", "application/json", strings.NewReader(`{"input_file_id":"`+id+`","endpoint":"/v1/chat/completions","completion_window":"1h"}`))
	apiError(t, "a window other than 24h", status, m, 400, "24h")

	// Another tenant's file is not found, for every call.
	status, m = create("sk-intern-dev", id, "/v1/chat/completions")
	apiError(t, "a batch on another tenant's file", status, m, 404, id)
	for _, c := range []struct{ method, path string }{
		{"GET", "/v1/files/" + id}, {"GET", "/v1/files/" + id + "/content"}, {"DELETE", "/v1/files/" + id},
	} {
		status, m = callAPI(t, c.method, url+c.path, "sk-intern-dev", "", nil)
		apiError(t, c.method+" "+c.path+" of another tenant's file", status, m, 404, id)
	}
	if status, m = callAPI(t, "GET", url+"/v1/files", "sk-intern-dev", "", nil); status != 200 || len(m["data"].([]any)) != 0 {
		t.Errorf("another tenant's file list: %d %v", status, m)
	}
	if status, m = callAPI(t, "GET", url+"/v1/files/"+id, "sk-acme-dev", "", nil); status != 200 || m["id"] != id {
		t.Errorf("the owner's file after another tenant's delete: %d %v", status, m)
	}

	// An unknown batch.
	for _, c := range []struct{ method, path string }{
		{"GET", "/v1/batches/batch_0123456789abcdef"}, {"POST", "/v1/batches/batch_0123456789abcdef/cancel"}, {"GET", "/v1/batches/nonsense"},
	} {
		status, m = callAPI(t, c.method, url+c.path, "sk-acme-dev", "", nil)
		apiError(t, c.method+" "+c.path, status, m, 404, "No batch")
	}
	// None of the refused creations stored a batch.
	if status, m = callAPI(t, "GET", url+"/v1/batches", "sk-acme-dev", "", nil); status != 200 || len(m["data"].([]any)) != 0 {
		t.Errorf("batches after refused creations: %d %v", status, m)
	}
	// The owner deletes its file.
	if status, m = callAPI(t, "DELETE", url+"/v1/files/"+id, "sk-acme-dev", "", nil); status != 200 || m["deleted"] != true {
		t.Errorf("delete: %d %v", status, m)
	}
	status, m = callAPI(t, "GET", url+"/v1/files/"+id, "sk-acme-dev", "", nil)
	apiError(t, "a deleted file", status, m, 404, id)
}

// TestBatchSurvivesAKilledBatcher runs the batcher as its own process,
// built from this tree, SIGKILLs it halfway through a 2,000-line batch and
// starts another: the lines it held are delivered again, the ones already
// answered are skipped, and the output has every line exactly once.
func TestBatchSurvivesAKilledBatcher(t *testing.T) {
	if testing.Short() {
		t.Skip("a 2,000-line batch")
	}
	survivesKilledBatchers(t, 2000, 1, 4*time.Minute)
}

// TestBatchSurvivesTwoKilledBatchers is `make test-batch-kill`: a batch of
// 10,000 lines completes with exactly one output line per custom_id while
// its batcher process is SIGKILLed and restarted twice, within 4 minutes.
func TestBatchSurvivesTwoKilledBatchers(t *testing.T) {
	if os.Getenv("SWITCHYARD_BATCH_KILL") == "" {
		t.Skip("make test-batch-kill runs this (a 10,000-line batch, about two minutes)")
	}
	survivesKilledBatchers(t, 10_000, 2, 4*time.Minute)
}

// survivesKilledBatchers runs a batch of n lines through batcher
// processes, SIGKILLing the one running each time another n/(kills+1)
// lines are answered and starting the next, and checks that the batch
// completes within limit with every line answered once.
func survivesKilledBatchers(t *testing.T, n, kills int, limit time.Duration) {
	bin := binary(t)
	st := startStack(t, devstack.Config{Speed: 20, NoBatcher: true,
		Replicas: devstack.ReplicasNamed("l70-gen-0", "l70-gen-1", "l8-gen-0", "l8-gen-1")})
	batcher := func(i int) *proc {
		name := fmt.Sprintf("batcher-%d", i)
		return startProc(t, name, bin, "batcher", "--nats", st.NATSURL(), "--creds", st.Creds(auth.Role{Kind: auth.RoleBatcher}),
			"--id", name, "--ack-wait", "3s", "--metrics-listen", "", "--log-level", "debug")
	}
	start := time.Now()
	deadline := start.Add(limit)
	running := batcher(1)
	c := client(st, "sk-acme-dev")
	b := runBatch(t, c, batchLines(n, "chat-large"))
	for k := 1; k <= kills; k++ {
		at := int64(n * k / (kills + 1))
		testkit.CheckFor(t, time.Until(deadline), 100*time.Millisecond, func() error {
			got, err := c.Batches.Get(context.Background(), b.ID)
			if err != nil {
				return err
			}
			if done := got.RequestCounts.Completed; done < at {
				return fmt.Errorf("%s, %d of %d answered", got.Status, done, n)
			}
			return nil
		})
		running.kill()
		mid, err := c.Batches.Get(context.Background(), b.ID)
		if err != nil {
			t.Fatal(err)
		}
		if mid.Status != "in_progress" || mid.RequestCounts.Completed >= int64(n) {
			t.Fatalf("batcher %d was killed too late to prove anything: %s %+v", k, mid.Status, mid.RequestCounts)
		}
		t.Logf("batcher-%d SIGKILLed with %d of %d lines answered, %v in", k, mid.RequestCounts.Completed, n, time.Since(start).Round(time.Second))
		running = batcher(k + 1)
	}
	b = awaitBatch(t, c, b.ID, time.Until(deadline))
	if b.Status != "completed" || b.RequestCounts.Completed != int64(n) || b.RequestCounts.Failed != 0 || b.ErrorFileID != "" {
		t.Fatalf("after the restarts: %s %+v error file %q", b.Status, b.RequestCounts, b.ErrorFileID)
	}
	out := fileLines(t, c, b.OutputFileID) // fails on a custom_id seen twice
	for i := 1; i <= n; i++ {
		if l := out[fmt.Sprintf("req-%d", i)]; l == nil || l["response"].(map[string]any)["status_code"] != 200.0 {
			t.Fatalf("req-%d: %v", i, l)
		}
	}
	if len(out) != n {
		t.Fatalf("%d results, want %d", len(out), n)
	}
	t.Logf("%d lines, each answered once, through %d SIGKILLed batchers in %v", n, kills, time.Since(start).Round(time.Second))
}

// TestOnlyTheBatcherSpeaksOnTheBatchSubject checks the batcher identity's
// row of docs/security.md: only it publishes llm.batch.<tenant> (a request
// there speaks for the tenant); it reads the load view (heartbeats and
// load deltas) and announces itself to the other batchers, but can
// neither speak for a replica's load, announce itself to the deciders,
// write the routing table nor read the requests sent to replicas.
func TestOnlyTheBatcherSpeaksOnTheBatchSubject(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: devstack.ReplicasNamed("l70-gen-0")})
	roleBatcher := auth.Role{Kind: auth.RoleBatcher}
	witness := mustConnectAs(t, st, roleBroker)
	sub, err := witness.SubscribeSync("llm.batch.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := witness.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, r := range []auth.Role{roleGateway, roleObserver, roleOperator, adapterRole("l70-gen-0"), tenant("acme"), roleBatcher} {
		nc := mustConnectAs(t, st, r)
		_ = nc.Publish("llm.batch.acme", []byte("from-"+r.Name()))
		_ = nc.Flush()
	}
	if err := witness.Flush(); err != nil {
		t.Fatal(err)
	}
	var from []string
	for {
		m, err := sub.NextMsg(0)
		if err != nil {
			break
		}
		from = append(from, string(m.Data))
	}
	if len(from) != 1 || from[0] != "from-batcher" {
		t.Errorf("llm.batch.acme carried %v, want the batcher's message alone", from)
	}

	nc := mustConnectAs(t, st, roleBatcher)
	errs := make(chan error, 4)
	nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err })
	if _, err := nc.SubscribeSync("llm.replica.>"); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.Publish(ctx, "$KV.llm-routing.tenants.acme", []byte(`{"tier":"premium"}`)); err == nil {
		t.Error("the batcher wrote the routing table")
	}
	_ = nc.Flush()
	select {
	case err := <-errs:
		if !errors.Is(err, nats.ErrPermissionViolation) {
			t.Errorf("subscribing llm.replica.> as the batcher: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("the batcher may read the requests sent to replicas")
	}

	t.Run("it reads the load view and announces itself to the batchers alone", func(t *testing.T) {
		view := mustConnectAs(t, st, roleBatcher)
		heard := make(chan string, 256)
		for _, subject := range []string{"llm.heartbeat.*", "llm.load.*", "llm.batcher.presence"} {
			if _, err := view.Subscribe(subject, func(m *nats.Msg) {
				select {
				case heard <- m.Subject + " " + string(m.Data):
				default:
				}
			}); err != nil {
				t.Fatal(err)
			}
		}
		if err := view.Flush(); err != nil {
			t.Fatal(err)
		}
		// A request through the gateway makes the adapter send load
		// deltas; heartbeats come every second.
		if status, _ := post(t, st.GatewayURL(), "sk-acme-dev", `{"model":"chat-large","max_tokens":3,"messages":[{"role":"user","content":"load"}]}`); status != 200 {
			t.Fatalf("a request through the gateway: %d", status)
		}
		// Forgeries a batcher might try: a replica's heartbeat and load
		// delta, and a decider's presence (it would shrink their quota
		// shares). Brokers are the witnesses: they hear all three.
		forged := make(chan string, 8)
		w := mustConnectAs(t, st, roleBroker)
		for _, subject := range []string{"llm.heartbeat.l70-gen-0", "llm.load.l70-gen-0", "llm.broker.presence"} {
			if _, err := w.Subscribe(subject, func(m *nats.Msg) {
				if strings.HasPrefix(string(m.Data), "forged") {
					forged <- m.Subject
				}
			}); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		other := mustConnectAs(t, st, roleBatcher)
		for _, subject := range []string{"llm.heartbeat.l70-gen-0", "llm.load.l70-gen-0", "llm.broker.presence"} {
			_ = other.Publish(subject, []byte("forged-"+subject))
		}
		_ = other.Publish("llm.batcher.presence", []byte("batcher-other"))
		if err := other.Flush(); err != nil {
			t.Fatal(err)
		}
		want := map[string]bool{"llm.heartbeat.l70-gen-0": true, "llm.load.l70-gen-0": true, "llm.batcher.presence batcher-other": true}
		testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
			for {
				select {
				case m := <-heard:
					subject, data, _ := strings.Cut(m, " ")
					if strings.HasPrefix(data, "forged") {
						t.Errorf("a forgery went through on %s", subject)
					}
					delete(want, subject)
					delete(want, m)
					continue
				default:
				}
				if len(want) > 0 {
					return fmt.Errorf("not heard yet as the batcher: %v", want)
				}
				return nil
			}
		})
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		select {
		case subject := <-forged:
			t.Errorf("the batcher published on %s", subject)
		default:
		}
	})
}

// TestBatchCancelAndExpiry cancels a running batch with `switchyard batch
// cancel` (the operator's command) and lets another pass its window: the
// cancelled one finalizes with what completed, the expired one keeps its
// results and lists every other line as a batch_expired error.
func TestBatchCancelAndExpiry(t *testing.T) {
	binary(t) // built before the batches start
	st := startStack(t, devstack.Config{Speed: 1, Replicas: devstack.ReplicasNamed("l70-gen-0")})
	c := client(st, "sk-acme-dev")
	slow := func(n int) string {
		return strings.ReplaceAll(batchLines(n, "chat-large"), `"max_tokens":3`, `"max_tokens":200`)
	}
	opEnv := []string{"NATS_URL=" + st.NATSURL(), "NATS_CREDS=" + st.Creds(roleOperator), "HOME=" + t.TempDir()}
	started := func(id string) {
		testkit.CheckFor(t, 60*time.Second, 100*time.Millisecond, func() error {
			b, err := c.Batches.Get(context.Background(), id)
			if err != nil || b.RequestCounts.Completed < 3 {
				return fmt.Errorf("%v %+v", err, b)
			}
			return nil
		})
	}

	b := runBatch(t, c, slow(300))
	started(b.ID)
	out, errOut, code := sy(t, opEnv, "", "batch", "cancel", b.ID)
	if code != 0 || !strings.Contains(out, `"status": "cancelling"`) || !strings.Contains(out, `"tenant": "acme"`) {
		t.Fatalf("switchyard batch cancel: exit %d\n%s%s", code, out, errOut)
	}
	cancelled := awaitBatch(t, c, b.ID, time.Minute) // the lines in flight run to their end
	counts := cancelled.RequestCounts
	if cancelled.Status != "cancelled" || cancelled.CancelledAt == 0 || counts.Completed == 0 || counts.Completed >= 300 || counts.Failed != 0 {
		t.Fatalf("cancelled batch: %s %+v", cancelled.Status, counts)
	}
	if got := fileLines(t, c, cancelled.OutputFileID); len(got) != int(counts.Completed) {
		t.Errorf("the output of the cancelled batch has %d lines, its counts say %d", len(got), counts.Completed)
	}
	if out, _, code := sy(t, opEnv, "", "batch", "list", "--tenant", "acme"); code != 0 || !strings.Contains(out, b.ID) || !strings.Contains(out, "cancelled") {
		t.Errorf("switchyard batch list: exit %d\n%s", code, out)
	}

	// Past its window: the record's expiry moved to now.
	b = runBatch(t, c, slow(300))
	started(b.ID)
	op := mustConnectAs(t, st, roleOperator)
	js, _ := jetstream.New(op)
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, "llm-batches")
	if err != nil {
		t.Fatal(err)
	}
	// The batcher writes the running batch's progress as its lines
	// complete: such a write between this read and this compare-and-set
	// (a wide gap on a loaded machine) makes it fail, and it is done again
	// on the new revision, as the batcher does with its own.
	testkit.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		e, err := kv.Get(ctx, "acme."+b.ID)
		if err != nil {
			t.Fatal(err)
		}
		var rec map[string]any
		_ = json.Unmarshal(e.Value(), &rec)
		rec["expires_at"] = time.Now().Unix()
		v, _ := json.Marshal(rec)
		if _, err := kv.Update(ctx, "acme."+b.ID, v, e.Revision()); err != nil {
			if errors.Is(err, jetstream.ErrKeyExists) {
				return err // another revision came in between
			}
			t.Fatal(err)
		}
		return nil
	})
	expired := awaitBatch(t, c, b.ID, time.Minute)
	counts = expired.RequestCounts
	if expired.Status != "expired" || expired.ExpiredAt == 0 || counts.Completed == 0 || counts.Completed+counts.Failed != 300 {
		t.Fatalf("expired batch: %s %+v", expired.Status, counts)
	}
	done := fileLines(t, c, expired.OutputFileID)
	failed := fileLines(t, c, expired.ErrorFileID)
	for id := range done {
		if failed[id] != nil {
			t.Errorf("%s is in both files", id)
		}
	}
	if len(done)+len(failed) != 300 || len(failed) != int(counts.Failed) {
		t.Errorf("%d answered + %d errors, want 300 with %d errors", len(done), len(failed), counts.Failed)
	}
	for id, l := range failed {
		if e, _ := l["error"].(map[string]any); e["code"] != "batch_expired" || l["response"] != nil {
			t.Errorf("%s: %v", id, l)
			break
		}
	}
}
