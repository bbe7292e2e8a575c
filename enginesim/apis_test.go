package enginesim_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/switchyard-llm/switchyard/enginesim"
)

// events reads a stream's event names, in order.
func events(t *testing.T, resp *http.Response) []string {
	t.Helper()
	return fieldValues(t, resp.Body, "event")
}

func TestResponsesAreStoredPerReplica(t *testing.T) {
	cfg := enginesim.ServerConfig{Engine: enginesim.Config{Model: "sim-model"}, Speed: 10}
	_, a := start(t, cfg)
	_, b := start(t, cfg)
	first := readJSON(t, post(t, a, "/v1/responses", `{"model":"sim-model","input":"Hello","instructions":"Be brief","max_output_tokens":4}`).Body)
	id, _ := first["id"].(string)
	if !strings.HasPrefix(id, "resp_") || first["object"] != "response" || first["status"] != "incomplete" {
		t.Fatalf("first turn = %v", first)
	}
	out := first["output"].([]any)[0].(map[string]any)["content"].([]any)[0].(map[string]any)
	if out["type"] != "output_text" || len(strings.Fields(out["text"].(string))) != 4 {
		t.Errorf("output = %v, want 4 words of output_text", out)
	}
	second := readJSON(t, post(t, a, "/v1/responses", `{"model":"sim-model","input":"And then?","previous_response_id":"`+id+`","max_output_tokens":4}`).Body)
	in1 := first["usage"].(map[string]any)["input_tokens"].(float64)
	if in2 := second["usage"].(map[string]any)["input_tokens"].(float64); in2 <= in1+4 {
		t.Errorf("second turn input_tokens %v, want more than the first turn's %v plus its answer", in2, in1)
	}
	if resp := post(t, b, "/v1/responses", `{"model":"sim-model","input":"x","previous_response_id":"`+id+`"}`); resp.StatusCode != 404 {
		t.Errorf("previous_response_id on another replica: status %d, want 404", resp.StatusCode)
	}
	get, _ := http.Get(a.URL + "/v1/responses/" + id)
	get.Body.Close()
	req, _ := http.NewRequest("DELETE", a.URL+"/v1/responses/"+id, nil)
	del, _ := http.DefaultClient.Do(req)
	del.Body.Close()
	again, _ := http.Get(a.URL + "/v1/responses/" + id)
	again.Body.Close()
	if get.StatusCode != 200 || del.StatusCode != 200 || again.StatusCode != 404 {
		t.Errorf("GET, DELETE, GET = %d %d %d, want 200 200 404", get.StatusCode, del.StatusCode, again.StatusCode)
	}
}

func TestResponsesStreamEvents(t *testing.T) {
	_, hs := start(t, enginesim.ServerConfig{Engine: enginesim.Config{Model: "sim-model"}, Speed: 10})
	got := events(t, post(t, hs, "/v1/responses", `{"model":"sim-model","input":[{"role":"user","content":"Hi"}],"stream":true,"max_output_tokens":3}`))
	want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
		"response.output_text.delta", "response.output_text.delta", "response.output_text.delta",
		"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("events\n got %v\nwant %v", got, want)
	}
}

func TestMessagesSpeakAnthropic(t *testing.T) {
	_, hs := start(t, enginesim.ServerConfig{Engine: enginesim.Config{Model: "sim-model"}, Speed: 10})
	body := `{"model":"sim-model","max_tokens":3,"system":"Be brief","messages":[{"role":"user","content":"Hi"}]%s}`
	m := readJSON(t, post(t, hs, "/v1/messages", fmtBody(body, "")).Body)
	if m["type"] != "message" || m["stop_reason"] != "max_tokens" || m["usage"].(map[string]any)["output_tokens"] != 3.0 {
		t.Errorf("message = %v", m)
	}
	got := events(t, post(t, hs, "/v1/messages", fmtBody(body, `,"stream":true`)))
	want := "message_start content_block_start ping content_block_delta content_block_delta content_block_delta content_block_stop message_delta message_stop"
	if strings.Join(got, " ") != want {
		t.Errorf("events %v, want %s", got, want)
	}
	resp := post(t, hs, "/v1/messages", `{"model":"sim-model","messages":[{"role":"user","content":"Hi"}]}`)
	e := readJSON(t, resp.Body)
	if resp.StatusCode != 400 || e["type"] != "error" || e["error"].(map[string]any)["type"] != "invalid_request_error" {
		t.Errorf("no max_tokens: %d %v, want 400 in Anthropic's shape", resp.StatusCode, e)
	}
}
