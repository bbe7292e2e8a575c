package enginesim_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/switchyard-llm/switchyard/enginesim"
	"github.com/switchyard-llm/switchyard/internal/sse"
)

// ids reads a JSON array of token ids.
func ids(t *testing.T, raw json.RawMessage) []uint32 {
	t.Helper()
	var out []uint32
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &out); err != nil {
			t.Fatalf("token ids %s: %v", raw, err)
		}
	}
	return out
}

// return_token_ids, as vLLM answers it: a chat response carries the
// prompt's token ids beside its choices and each choice its tokens' ids;
// a completions choice carries both; in a stream the prompt's ids come
// once, on the first chunk, and every token chunk its token's id. The
// prompt's ids are /tokenize's, the ones the KV-cache events carry.
func TestReturnTokenIDs(t *testing.T) {
	srv := enginesim.NewServer(enginesim.ServerConfig{Engine: enginesim.Config{Model: "m"}, Speed: 50})
	hs := serve(t, srv)
	question := strings.Repeat("what is cached? ", 8)
	chat := `{"model":"m","max_tokens":5,"return_token_ids":true,"messages":[{"role":"user","content":` + jsonString(question) + `}]}`
	prompt := `{"model":"m","max_tokens":5,"return_token_ids":true,"prompt":` + jsonString(question) + `}`

	var tok struct {
		Tokens []uint32 `json:"tokens"`
	}
	resp := post(t, hs, "/tokenize", `{"model":"m","messages":[{"role":"user","content":`+jsonString(question)+`}]}`)
	if err := json.NewDecoder(resp.Body).Decode(&tok); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	chatIDs := tok.Tokens
	tok.Tokens = nil // decoding again would reuse the array
	resp = post(t, hs, "/tokenize", `{"model":"m","prompt":`+jsonString(question)+`}`)
	if err := json.NewDecoder(resp.Body).Decode(&tok); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	promptIDs := tok.Tokens
	if len(chatIDs) < len(question)/4 || len(promptIDs) < len(question)/4 {
		t.Fatalf("/tokenize: %d and %d ids for a %d-byte question", len(chatIDs), len(promptIDs), len(question))
	}

	t.Run("chat", func(t *testing.T) {
		var out struct {
			PromptTokenIDs json.RawMessage `json:"prompt_token_ids"`
			Usage          struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
			Choices []struct {
				TokenIDs json.RawMessage `json:"token_ids"`
			} `json:"choices"`
		}
		resp := post(t, hs, "/v1/chat/completions", chat)
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := ids(t, out.PromptTokenIDs); !slices.Equal(got, chatIDs) || len(got) != out.Usage.PromptTokens {
			t.Errorf("prompt_token_ids %v (usage %d), want /tokenize's %v", got, out.Usage.PromptTokens, chatIDs)
		}
		if len(out.Choices) != 1 || len(ids(t, out.Choices[0].TokenIDs)) != out.Usage.CompletionTokens || out.Usage.CompletionTokens != 5 {
			t.Errorf("choices %+v, want one with the ids of its %d tokens", out.Choices, out.Usage.CompletionTokens)
		}
	})

	t.Run("completions", func(t *testing.T) {
		var out struct {
			PromptTokenIDs json.RawMessage `json:"prompt_token_ids"`
			Choices        []struct {
				PromptTokenIDs json.RawMessage `json:"prompt_token_ids"`
				TokenIDs       json.RawMessage `json:"token_ids"`
			} `json:"choices"`
		}
		resp := post(t, hs, "/v1/completions", prompt)
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if len(out.Choices) != 1 || !slices.Equal(ids(t, out.Choices[0].PromptTokenIDs), promptIDs) || len(ids(t, out.Choices[0].TokenIDs)) != 5 {
			t.Errorf("choices %+v, want one with /tokenize's prompt ids and 5 token ids", out.Choices)
		}
		if out.PromptTokenIDs != nil {
			t.Errorf("a completions response carries prompt_token_ids on its choices only, got %s at the top", out.PromptTokenIDs)
		}
	})

	t.Run("not asked", func(t *testing.T) {
		resp := post(t, hs, "/v1/chat/completions", strings.Replace(chat, `"return_token_ids":true,`, "", 1))
		m := readJSON(t, resp.Body)
		resp.Body.Close()
		if _, ok := m["prompt_token_ids"]; ok {
			t.Errorf("prompt_token_ids without return_token_ids: %v", m)
		}
		if c := m["choices"].([]any)[0].(map[string]any); c["token_ids"] != nil {
			t.Errorf("token_ids without return_token_ids: %v", c)
		}
	})

	for _, c := range []struct{ name, path, body string }{
		{"chat stream", "/v1/chat/completions", chat},
		{"completions stream", "/v1/completions", prompt},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp := post(t, hs, c.path, strings.Replace(c.body, `"return_token_ids":true`, `"return_token_ids":true,"stream":true`, 1))
			defer resp.Body.Close()
			r := sse.NewReader(resp.Body, 1<<20)
			var promptSeen [][]uint32
			var tokens []uint32
			for {
				l, err := r.Next()
				if err != nil || string(l.Value) == "[DONE]" {
					break
				}
				if l.Field != "data" {
					continue
				}
				var ch struct {
					PromptTokenIDs json.RawMessage `json:"prompt_token_ids"`
					Choices        []struct {
						PromptTokenIDs json.RawMessage `json:"prompt_token_ids"`
						TokenIDs       json.RawMessage `json:"token_ids"`
					} `json:"choices"`
				}
				if err := json.Unmarshal(l.Value, &ch); err != nil {
					t.Fatalf("chunk %s: %v", l.Value, err)
				}
				if p := ids(t, ch.PromptTokenIDs); p != nil {
					promptSeen = append(promptSeen, p)
				}
				for _, x := range ch.Choices {
					if p := ids(t, x.PromptTokenIDs); p != nil {
						promptSeen = append(promptSeen, p)
					}
					tokens = append(tokens, ids(t, x.TokenIDs)...)
				}
			}
			want := promptIDs
			if c.path == "/v1/chat/completions" {
				want = chatIDs
			}
			if len(promptSeen) != 1 || !slices.Equal(promptSeen[0], want) {
				t.Errorf("prompt ids sent %d times (%v), want once: %v", len(promptSeen), promptSeen, want)
			}
			if len(tokens) != 5 {
				t.Errorf("%d token ids over the stream, want 5", len(tokens))
			}
		})
	}
}
