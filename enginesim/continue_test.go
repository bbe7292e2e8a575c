package enginesim_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/enginesim"
)

// answerOf posts a non-streamed request and returns its text and usage.
func answerOf(t *testing.T, url, path, body string) (string, [2]int) {
	t.Helper()
	resp, err := http.Post(url+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Choices []struct {
			Text    string `json:"text"`
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("%s: status %d: %+v", path, resp.StatusCode, out.Error)
	}
	return out.Choices[0].Text + out.Choices[0].Message.Content, [2]int{out.Usage.PromptTokens, out.Usage.CompletionTokens}
}

func quote(s string) string { b, _ := json.Marshal(s); return string(b) }

func TestContinueFinalMessageContinuesTheAnswer(t *testing.T) {
	for _, deterministic := range []bool{false, true} {
		t.Run(fmt.Sprint("deterministic=", deterministic), func(t *testing.T) {
			_, hs := start(t, enginesim.ServerConfig{Engine: enginesim.Config{Model: "m", ITL: time.Millisecond}, Speed: 50, DeterministicText: deterministic})
			msgs := `[{"role":"user","content":"tell me a story about routers"}]`
			whole, wu := answerOf(t, hs.URL, "/v1/chat/completions", `{"model":"m","max_tokens":30,"messages":`+msgs+`}`)
			words := strings.Fields(whole)
			if len(words) != 30 {
				t.Fatalf("%d words, want 30", len(words))
			}
			carried := strings.Join(words[:12], " ") + " "
			cont := `[{"role":"user","content":"tell me a story about routers"},{"role":"assistant","content":` + quote(carried) + `}]`
			rest, ru := answerOf(t, hs.URL, "/v1/chat/completions",
				`{"model":"m","max_tokens":18,"continue_final_message":true,"add_generation_prompt":false,"messages":`+cont+`}`)
			if carried+rest != whole {
				t.Fatalf("continued:\n%q\nwant\n%q", carried+rest, whole)
			}
			if ru[0]-12 != wu[0] || ru[1] != 18 {
				t.Fatalf("continuation usage %v, want prompt %d+12 and 18 completion tokens", ru, wu[0])
			}

			resp, err := http.Post(hs.URL+"/v1/chat/completions", "application/json",
				strings.NewReader(`{"model":"m","continue_final_message":true,"messages":`+cont+`}`))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 400 {
				t.Fatalf("continue_final_message with the default add_generation_prompt: status %d, want 400 as vLLM", resp.StatusCode)
			}
		})
	}
}

func TestDeterministicTextContinuesACompletion(t *testing.T) {
	_, hs := start(t, enginesim.ServerConfig{Engine: enginesim.Config{Model: "m", ITL: time.Millisecond}, Speed: 50, DeterministicText: true})
	whole, wu := answerOf(t, hs.URL, "/v1/completions", `{"model":"m","max_tokens":25,"prompt":"Once upon a time"}`)
	other, _ := answerOf(t, hs.URL, "/v1/completions", `{"model":"m","max_tokens":25,"prompt":"something else entirely"}`)
	if whole != other {
		t.Fatalf("deterministic text depends on the prompt: %q vs %q", whole, other)
	}
	words := strings.Fields(whole)
	carried := strings.Join(words[:7], " ") + " "
	rest, ru := answerOf(t, hs.URL, "/v1/completions", `{"model":"m","max_tokens":18,"prompt":`+quote("Once upon a time"+carried)+`}`)
	if carried+rest != whole {
		t.Fatalf("continued:\n%q\nwant\n%q", carried+rest, whole)
	}
	if ru[0]-7 != wu[0] {
		t.Fatalf("continuation prompt tokens %d, want %d+7", ru[0], wu[0])
	}
}
