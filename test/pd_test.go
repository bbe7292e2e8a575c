package test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/switchyard-llm/switchyard/devstack"
)

var (
	pdPrefills = []string{"pd-prefill-0", "pd-prefill-1"}
	pdDecodes  = []string{"pd-decode-0", "pd-decode-1"}
)

// pdPrompt is a chat request for the dev stack's disaggregated model with
// a prompt of about words×1.3 tokens, unique per seed.
func pdPrompt(seed string, words, maxTokens int) string {
	var b strings.Builder
	for i := range words {
		fmt.Fprintf(&b, "%s-%d ", seed, i%97)
	}
	return `{"model": "llama-3-70b-pd", "messages": [{"role": "user", "content": "` + b.String() + `"}], "max_tokens": ` + fmt.Sprint(maxTokens) + `}`
}

type pdAnswer struct {
	Choices []struct {
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

func pdChat(t *testing.T, st *devstack.Stack, body string) (http.Header, pdAnswer) {
	t.Helper()
	status, h, b := chatOnce(t, st.GatewayURL(), body, nil)
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, b)
	}
	var a pdAnswer
	if err := json.Unmarshal([]byte(b), &a); err != nil {
		t.Fatalf("answer %q: %v", b, err)
	}
	if len(a.Choices) != 1 || a.Choices[0].Message.Content == "" {
		t.Fatalf("not one answer: %s", b)
	}
	return h, a
}

// The dev stack's disaggregated model: a long prompt is split (its prefill
// on a prefill replica, whose engine was asked for do_remote_decode, its
// decode on a decode replica, whose engine got the prefill's parameters),
// answered once with the usage of the whole request; a short or cached one
// is served whole; prefill replicas that refuse leave it whole, not failed.
func TestDisaggregatedModelThroughTheDevStack(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: devstack.ReplicasNamed(append(slices.Clone(pdPrefills), pdDecodes...)...)})
	long := pdPrompt("long", 3000, 9) // about 4,000 tokens: above min_uncached_tokens (2,048)

	h, a := pdChat(t, st, long)
	decode, prefill := h.Get("X-Switchyard-Replica"), h.Get("X-Switchyard-Prefill-Replica")
	if !slices.Contains(pdDecodes, decode) || !slices.Contains(pdPrefills, prefill) {
		t.Fatalf("long prompt: decode %q prefill %q (reason %q)", decode, prefill, h.Get("X-Switchyard-Reason"))
	}
	if a.Usage.CompletionTokens != 9 || a.Usage.PromptTokens < 2048 {
		t.Errorf("usage %+v", a.Usage)
	}
	pe, de := st.Engine(prefill), st.Engine(decode)
	ps, ds := pe.KVTransfers(), de.KVTransfers()
	if len(ps) != 1 || !ps[0].DoRemoteDecode {
		t.Errorf("prefill engine %s saw %+v, want one do_remote_decode", prefill, ps)
	}
	if len(ds) != 1 || !ds[0].DoRemotePrefill || ds[0].RemoteEngineID == nil || *ds[0].RemoteEngineID != pe.EngineID() ||
		len(ds[0].RemoteBlockIDs) == 0 || ds[0].RemoteHost == nil || ds[0].RemotePort == nil {
		t.Errorf("decode engine %s saw %+v, want the parameters of %s's prefill", decode, ds, prefill)
	}

	t.Run("a short prompt is served whole", func(t *testing.T) {
		h, a := pdChat(t, st, pdPrompt("short", 50, 4))
		if got := h.Get("X-Switchyard-Prefill-Replica"); got != "" || !slices.Contains(pdDecodes, h.Get("X-Switchyard-Replica")) {
			t.Errorf("short prompt: decode %q prefill %q", h.Get("X-Switchyard-Replica"), got)
		}
		if a.Usage.CompletionTokens != 4 {
			t.Errorf("usage %+v", a.Usage)
		}
	})

	t.Run("a cached prompt is served whole", func(t *testing.T) {
		h, _ := pdChat(t, st, long)
		if got := h.Get("X-Switchyard-Prefill-Replica"); got != "" || h.Get("X-Switchyard-Replica") != decode {
			t.Errorf("the long prompt again: decode %q (first %s) prefill %q", h.Get("X-Switchyard-Replica"), decode, got)
		}
	})

	t.Run("refusing prefill replicas leave it whole", func(t *testing.T) {
		for _, id := range pdPrefills {
			st.Faults(id).SetReject(http.StatusServiceUnavailable)
		}
		h, a := pdChat(t, st, pdPrompt("refused", 3000, 5))
		if got := h.Get("X-Switchyard-Prefill-Replica"); got != "" {
			t.Errorf("a refused split still names prefill replica %q", got)
		}
		if r := h.Get("X-Switchyard-Reason"); !strings.HasSuffix(r, "+prefill-whole:refused") {
			t.Errorf("reason %q does not say the prefill was refused", r)
		}
		if a.Usage.CompletionTokens != 5 {
			t.Errorf("usage %+v", a.Usage)
		}
	})
}
