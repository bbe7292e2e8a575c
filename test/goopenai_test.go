package test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	goopenai "github.com/sashabaranov/go-openai"

	"github.com/switchyard-llm/switchyard/devstack"
)

// go-openai reads a failed stream's error line and returns the server's
// message: the line is one data: {"error":…} with no event line before it
// (an event line made it report "unexpected end of JSON input"). One
// replica, so the failure cannot be served elsewhere.
func TestGoOpenAIReadsTheMidStreamError(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: l8()[:1], Speed: 1})
	cfg := goopenai.DefaultConfig("sk-default-dev")
	cfg.BaseURL = st.GatewayURL() + "/v1"
	c := goopenai.NewClientWithConfig(cfg)
	stream, err := c.CreateChatCompletionStream(context.Background(), goopenai.ChatCompletionRequest{
		Model: "chat-small", MaxTokens: 2000, Stream: true,
		Messages: []goopenai.ChatCompletionMessage{{Role: "user", Content: "Tell a long story"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if _, err := stream.Recv(); err != nil {
		t.Fatalf("first chunk: %v", err)
	}
	st.Faults("l8-gen-0").Kill()
	for {
		_, err = stream.Recv()
		if err != nil {
			break
		}
	}
	var apiErr *goopenai.APIError
	if errors.Is(err, io.EOF) || !errors.As(err, &apiErr) || !strings.Contains(apiErr.Message, "engine failed mid-response") {
		t.Fatalf("go-openai returned %v (%T), want the server's error message", err, err)
	}
	t.Logf("go-openai: %v", err)
}
