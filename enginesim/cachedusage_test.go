package enginesim_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/switchyard-llm/switchyard/enginesim"
)

// A request preempted and recomputed finds its own prompt in the prefix
// cache; its usage still reports the cached tokens of its first admission,
// as vLLM's num_cached_tokens is set once: two cold prompts report none,
// however often the KV cache ran short and they were recomputed.
func TestUsageReportsTheFirstAdmissionsCachedTokens(t *testing.T) {
	_, hs := start(t, enginesim.ServerConfig{Engine: enginesim.Config{Model: "m", KVBlocks: 12}, Speed: 5})
	var wg sync.WaitGroup
	cached := make([]float64, 2)
	for i := range 2 {
		wg.Go(func() {
			// 64 tokens of text of its own: four blocks of 16.
			prompt := strings.Repeat(fmt.Sprintf("p%d-x", i), 64)
			body := fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":120}`, prompt)
			resp := post(t, hs, "/v1/completions", body)
			if resp.StatusCode != http.StatusOK {
				b, _ := io.ReadAll(resp.Body)
				t.Errorf("status %d: %s", resp.StatusCode, b)
				return
			}
			u := readJSON(t, resp.Body)["usage"].(map[string]any)
			cached[i] = u["prompt_tokens_details"].(map[string]any)["cached_tokens"].(float64)
		})
	}
	wg.Wait()
	resp, err := hs.Client().Get(hs.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	metrics, _ := io.ReadAll(resp.Body)
	// The engine counts every admission's hits: a recompute's are there.
	if !strings.Contains(string(metrics), "vllm:prefix_cache_hits_total{") || strings.Contains(string(metrics), `vllm:prefix_cache_hits_total{model_name="m"} 0`+"\n") {
		t.Fatalf("no prefix-cache hit counted: the test needs a request preempted and recomputed\n%s", metrics)
	}
	if cached[0] != 0 || cached[1] != 0 {
		t.Errorf("cached tokens %v, want 0 for two cold prompts", cached)
	}
}
