package enginesim_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/enginesim"
)

// longChat is a chat request of about 2,000 prompt tokens.
func longChat(extra string) string {
	return `{"model": "sim-model", "messages": [{"role": "user", "content": "` + strings.Repeat("the quick brown fox jumps over ", 300) + `"}], "max_tokens": ` + extra
}

type kvAnswer struct {
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	KV *enginesim.KVTransferParams `json:"kv_transfer_params"`
}

func decodeAnswer(t *testing.T, resp *http.Response) kvAnswer {
	t.Helper()
	var a kvAnswer
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		t.Fatal(err)
	}
	return a
}

func TestPrefillThenDecodeAcrossEngines(t *testing.T) {
	pe, ps := start(t, enginesim.ServerConfig{Speed: 100})
	de, ds := start(t, enginesim.ServerConfig{Speed: 100})

	resp := post(t, ps, "/v1/chat/completions", longChat(`1, "kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false}}`))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("prefill status %d", resp.StatusCode)
	}
	p := decodeAnswer(t, resp)
	kv := p.KV
	if kv == nil || !kv.DoRemotePrefill || kv.DoRemoteDecode || kv.RemoteEngineID == nil || *kv.RemoteEngineID != pe.EngineID() ||
		len(kv.RemoteBlockIDs) != (p.Usage.PromptTokens+15)/16 || kv.RemoteHost == nil || kv.RemotePort == nil || kv.RemoteRequestID == "" {
		t.Fatalf("prefill kv_transfer_params = %+v (prompt %d tokens)", kv, p.Usage.PromptTokens)
	}
	if p.Usage.CompletionTokens != 1 {
		t.Errorf("prefill completion tokens = %d, want 1", p.Usage.CompletionTokens)
	}

	kv.DoRemotePrefill = true
	params, _ := json.Marshal(kv)
	resp = post(t, ds, "/v1/chat/completions", longChat(`5, "kv_transfer_params": `+string(params)+`}`))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("decode status %d", resp.StatusCode)
	}
	d := decodeAnswer(t, resp)
	if d.Usage.CompletionTokens != 5 || d.Usage.PromptTokens != p.Usage.PromptTokens || d.KV != nil {
		t.Errorf("decode answer = %+v", d)
	}
	seen := de.KVTransfers()
	if len(seen) != 1 || !seen[0].DoRemotePrefill || *seen[0].RemoteEngineID != pe.EngineID() {
		t.Errorf("decode engine saw %+v", seen)
	}
	if seen := pe.KVTransfers(); len(seen) != 1 || !seen[0].DoRemoteDecode {
		t.Errorf("prefill engine saw %+v", seen)
	}
	// The prefill's blocks went to the decode once: a second pull fails as
	// vLLM fails a request whose KV it cannot load.
	resp = post(t, ds, "/v1/chat/completions", longChat(`5, "kv_transfer_params": `+string(params)+`}`))
	if resp.StatusCode != http.StatusInternalServerError {
		t.Fatalf("second decode status %d, want 500", resp.StatusCode)
	}
	if m := readJSON(t, resp.Body); m["error"].(map[string]any)["message"] != "Internal server error" {
		t.Errorf("second decode error = %v", m)
	}
}

func TestDecodeFailsOnUnknownOrExpiredBlocks(t *testing.T) {
	_, ps := start(t, enginesim.ServerConfig{Speed: 100, KVHold: time.Nanosecond})
	_, ds := start(t, enginesim.ServerConfig{Speed: 100})

	resp := post(t, ps, "/v1/chat/completions", longChat(`1, "kv_transfer_params": {"do_remote_decode": true}}`))
	expired := decodeAnswer(t, resp).KV
	if expired == nil {
		t.Fatal("no kv_transfer_params from the prefill")
	}
	forged := *expired
	other := "another-engine"
	forged.RemoteEngineID = &other
	for name, kv := range map[string]enginesim.KVTransferParams{"expired": *expired, "another engine": forged} {
		kv.DoRemotePrefill = true
		params, _ := json.Marshal(kv)
		resp := post(t, ds, "/v1/chat/completions", longChat(`5, "kv_transfer_params": `+string(params)+`}`))
		if resp.StatusCode != http.StatusInternalServerError {
			t.Errorf("%s: status %d, want 500", name, resp.StatusCode)
		}
	}
	for name, body := range map[string]string{
		"prefill streamed":    longChat(`1, "stream": true, "kv_transfer_params": {"do_remote_decode": true}}`),
		"decode without host": longChat(`5, "kv_transfer_params": {"do_remote_prefill": true, "remote_engine_id": "x", "remote_block_ids": [1]}}`),
		"both legs at once":   longChat(`5, "kv_transfer_params": {"do_remote_prefill": true, "do_remote_decode": true}}`),
	} {
		if resp := post(t, ds, "/v1/chat/completions", body); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400", name, resp.StatusCode)
		}
	}
}
