// Package test holds end-to-end tests: the whole stack in one process (an
// embedded nats-server, broker, gateway, simulated engines and adapters),
// driven from the outside with real clients.
package test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/switchyard-llm/switchyard/auth"
	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/internal/sse"
	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// launch starts the dev stack on free ports, stopped when the test ends.
func launch(t *testing.T, cfg devstack.Config) *devstack.Stack {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.NATSListen == "" {
		cfg.NATSListen = "127.0.0.1:-1"
	}
	if cfg.Speed == 0 {
		cfg.Speed = 4
	}
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := devstack.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start stack: %v", err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("stack stopped with errors: %v", err)
		}
	})
	return st
}

// startStack runs the dev stack and waits until it is ready.
// deciders are the parts that can decide an HTTP request (gateway
// --decide): the end-to-end tests of what a decision does run with each,
// and must see the same.
var deciders = []string{gateway.DecideLocal, gateway.DecideBroker}

// eachDecider runs f once per decider, as a subtest named after it.
func eachDecider(t *testing.T, f func(t *testing.T, decide string)) {
	for _, d := range deciders {
		t.Run("decide="+d, func(t *testing.T) { f(t, d) })
	}
}

func startStack(t *testing.T, cfg devstack.Config) *devstack.Stack {
	t.Helper()
	st := launch(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := st.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	return st
}

func client(st *devstack.Stack, key string) *openai.Client {
	opts := []option.RequestOption{option.WithBaseURL(st.GatewayURL() + "/v1/"), option.WithMaxRetries(0)}
	if key != "" {
		opts = append(opts, option.WithAPIKey(key))
	} else {
		opts = append(opts, option.WithAPIKey("sk-default-dev")) // tenant default, for an SDK that must send a key
	}
	c := openai.NewClient(opts...)
	return &c
}

func devReplicaIDs() []string {
	var ids []string
	for _, r := range devstack.Replicas() {
		ids = append(ids, r.ID)
	}
	return ids
}

func TestOpenAIClientThroughTheStack(t *testing.T) {
	eachDecider(t, func(t *testing.T, decide string) {
		st := startStack(t, devstack.Config{Gateway: gateway.Config{Decide: decide}})
		c := client(st, "")
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()

		t.Run("chat", func(t *testing.T) {
			var resp *http.Response
			out, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
				Model:     "chat-large",
				Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello")},
				MaxTokens: openai.Int(8),
			}, option.WithResponseInto(&resp))
			if err != nil {
				t.Fatal(err)
			}
			if len(out.Choices) != 1 || out.Choices[0].Message.Content == "" {
				t.Fatalf("no answer: %+v", out)
			}
			if out.Usage.CompletionTokens != 8 {
				t.Errorf("completion tokens = %d, want 8", out.Usage.CompletionTokens)
			}
			if out.Model != "chat-large" {
				t.Errorf("answer names model %q, want chat-large as asked", out.Model)
			}
			rep := resp.Header.Get("X-Switchyard-Replica")
			if !slices.Contains(devReplicaIDs(), rep) || !strings.HasPrefix(rep, "l70-") {
				t.Errorf("X-Switchyard-Replica = %q, want a llama-3-70b dev replica", rep)
			}
			if got := resp.Header.Get("X-Switchyard-Model"); got != "llama-3-70b-instruct" {
				t.Errorf("X-Switchyard-Model = %q", got)
			}
			for _, h := range []string{"X-Switchyard-Version", "X-Switchyard-Pool", "X-Switchyard-Reason"} {
				if resp.Header.Get(h) == "" {
					t.Errorf("%s missing", h)
				}
			}
		})

		t.Run("streamed chat", func(t *testing.T) {
			stream := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
				Model:     "chat-small",
				Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Count to five")},
				MaxTokens: openai.Int(6),
			})
			var chunks int
			var text strings.Builder
			for stream.Next() {
				ch := stream.Current()
				if len(ch.Choices) > 0 {
					text.WriteString(ch.Choices[0].Delta.Content)
				}
				chunks++
				if ch.Model != "chat-small" {
					t.Errorf("chunk names model %q, want chat-small as asked", ch.Model)
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatal(err)
			}
			if chunks < 6 || text.Len() == 0 {
				t.Errorf("got %d chunks, text %q; want incremental chunks", chunks, text.String())
			}
		})

		t.Run("completions", func(t *testing.T) {
			out, err := c.Completions.New(ctx, openai.CompletionNewParams{
				Model:     "chat-small",
				Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
				MaxTokens: openai.Int(5),
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(out.Choices) != 1 || out.Choices[0].Text == "" {
				t.Fatalf("no completion: %+v", out)
			}
		})

		t.Run("models", func(t *testing.T) {
			page, err := c.Models.List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, m := range page.Data {
				ids = append(ids, m.ID)
			}
			for _, want := range []string{"auto", "chat-large", "chat-small", "code"} {
				if !slices.Contains(ids, want) {
					t.Errorf("models %v lack %s", ids, want)
				}
			}
		})

		t.Run("a tenant sees its adapters", func(t *testing.T) {
			page, err := client(st, "sk-teamx-dev").Models.List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, m := range page.Data {
				ids = append(ids, m.ID+"/"+m.OwnedBy)
			}
			for _, want := range []string{"chat-small:team-x-v3/team-x", "chat-small/switchyard", "llama-3-8b-instruct/switchyard"} {
				if !slices.Contains(ids, want) {
					t.Errorf("team-x models %v lack %s", ids, want)
				}
			}
		})

		t.Run("restricted tenant sees only its models", func(t *testing.T) {
			page, err := client(st, "sk-intern-dev").Models.List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(page.Data) != 1 || page.Data[0].ID != "chat-small" {
				t.Errorf("intern models = %+v, want only chat-small", page.Data)
			}
		})
	})
}

// rawSSE posts a streamed chat and returns the body as the client saw it.
func rawSSE(t *testing.T, url string) (http.Header, string) {
	t.Helper()
	body := `{"model":"chat-small","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	return resp.Header, string(b)
}

func TestStreamEndsWithDone(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: devstack.ReplicasNamed("l8-gen-0", "l8-gen-1")})
	h, body := rawSSE(t, st.GatewayURL())
	if ct := h.Get("Content-Type"); !sse.IsEventStream(ct) {
		t.Errorf("Content-Type = %q", ct)
	}
	// The bytes on the wire, not what a reader makes of them: one
	// "data: " line per event, LF-ended, as vLLM and OpenAI write them.
	lines := strings.Split(strings.TrimSpace(body), "\n\n")
	if len(lines) < 5 {
		t.Fatalf("want one data: line per token, got %q", body)
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, "data: ") {
			t.Errorf("not an SSE data line: %q", l)
		}
	}
	if lines[len(lines)-1] != "data: [DONE]" {
		t.Errorf("last line = %q, want data: [DONE]", lines[len(lines)-1])
	}
}

// chatReplica sends one chat and returns the replica that served it.
func chatReplica(t *testing.T, url, model string) string {
	t.Helper()
	status, h, b := chatOnce(t, url, `{"model":"`+model+`","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`, nil)
	if status != 200 {
		t.Fatalf("%s: status %d: %s", model, status, b)
	}
	return h.Get("X-Switchyard-Replica")
}

func kvBucket(t *testing.T, st *devstack.Stack) jetstream.KeyValue {
	t.Helper()
	nc, err := connectAs(st, auth.Role{Kind: auth.RoleOperator})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(context.Background(), "llm-routing")
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

func TestKVEditChangesRoutingAndInvalidValueIsIgnored(t *testing.T) {
	st := startStack(t, devstack.Config{})
	kv := kvBucket(t, st)
	ctx := context.Background()
	if rep := chatReplica(t, st.GatewayURL(), "chat-small"); !strings.HasPrefix(rep, "l8-gen-") {
		t.Fatalf("chat-small served by %q before the edit", rep)
	}

	// An operator points chat-small at the coder model: new requests follow.
	if _, err := kv.Put(ctx, "aliases.chat-small", []byte(`{"targets":[{"model":"qwen-coder-32b","version":"v1.0.0","weight":100}]}`)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	testkit.CheckFor(t, 3*time.Second, 50*time.Millisecond, func() error {
		rep := chatReplica(t, st.GatewayURL(), "chat-small")
		if rep != "coder-gen-0" {
			return errors.New("chat-small still served by " + rep)
		}
		return nil
	})
	t.Logf("routing followed the KV edit in %s", time.Since(start).Round(time.Millisecond))

	// A broken value is rejected; the last good value stays in force.
	if _, err := kv.Put(ctx, "aliases.chat-small", []byte(`{"targets":[{"model":"llama-3-8b-instruct","weight":"lots"}]}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "aliases.code", []byte(`{"targets":[{"model":"qwen-coder-32b","version":"v1.0.0","weight":100}]}`)); err != nil {
		t.Fatal(err)
	}
	// Wait until the valid edit after it is applied, so the invalid one was seen too.
	testkit.CheckFor(t, 3*time.Second, 50*time.Millisecond, func() error {
		if st.Broker(0).Table().Revision < mustRev(t, kv, "aliases.code") {
			return errors.New("broker has not caught up")
		}
		return nil
	})
	for range 5 {
		if rep := chatReplica(t, st.GatewayURL(), "chat-small"); rep != "coder-gen-0" {
			t.Fatalf("after an invalid value, chat-small went to %q; the last good value should stay", rep)
		}
	}
}

func mustRev(t *testing.T, kv jetstream.KeyValue, key string) uint64 {
	t.Helper()
	e, err := kv.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return e.Revision()
}

func TestErrorsHaveTheOpenAIShape(t *testing.T) {
	eachDecider(t, func(t *testing.T, decide string) {
		st := startStack(t, devstack.Config{Gateway: gateway.Config{Decide: decide}, Replicas: devstack.ReplicasNamed("l8-gen-0")})
		for _, tc := range []struct {
			name, path, body string
			status           int
			code             string
		}{
			{"unknown model", "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, 404, "model_not_found"},
			{"malformed JSON", "/v1/chat/completions", `{"model":`, 400, "invalid_request_error"},
			{"unknown path", "/v1/nothing", `{}`, 404, "not_found"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				resp, err := http.Post(st.GatewayURL()+tc.path, "application/json", strings.NewReader(tc.body))
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				var e struct {
					Error struct {
						Message string `json:"message"`
						Type    string `json:"type"`
						Code    string `json:"code"`
					} `json:"error"`
				}
				if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
					t.Fatal(err)
				}
				if resp.StatusCode != tc.status || e.Error.Code != tc.code || e.Error.Message == "" || e.Error.Type == "" {
					t.Errorf("got %d %+v, want %d %s", resp.StatusCode, e.Error, tc.status, tc.code)
				}
			})
		}
	})
}
