package features_test

import (
	"testing"

	"github.com/switchyard-llm/switchyard/features"
	"github.com/switchyard-llm/switchyard/subjects"
)

// The Messages and Responses APIs render as the chat conversation they
// are, so a system prompt warms the same prefix whichever API sent it.
func TestMessagesAndResponsesRenderLikeChat(t *testing.T) {
	chat, err := features.ParseRequest(subjects.EndpointChat, []byte(`{"model":"m","messages":[{"role":"system","content":"Be brief"},{"role":"user","content":"Hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ endpoint, body string }{
		{subjects.EndpointMessages, `{"model":"m","max_tokens":9,"system":"Be brief","messages":[{"role":"user","content":[{"type":"text","text":"Hi"}]}]}`},
		{subjects.EndpointResponses, `{"model":"m","max_output_tokens":9,"instructions":"Be brief","input":"Hi"}`},
		{subjects.EndpointResponses, `{"model":"m","max_output_tokens":9,"instructions":"Be brief","input":[{"role":"user","content":[{"type":"input_text","text":"Hi"}]},{"type":"function_call_output","call_id":"c","output":"x"}]}`},
	} {
		r, err := features.ParseRequest(c.endpoint, []byte(c.body))
		if err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		if string(r.Prompt) != string(chat.Prompt) || r.MaxTokens == nil || *r.MaxTokens != 9 {
			t.Errorf("%s: prompt %q, max tokens %v; want %q and 9", c.body, r.Prompt, r.MaxTokens, chat.Prompt)
		}
	}
}

func TestResponsesFieldsAreChecked(t *testing.T) {
	for body, param := range map[string]string{
		`{"model":"m"}`: "input",
		`{"model":"m","input":"x","max_output_tokens":-1}`:                                   "max_output_tokens",
		`{"model":"m","input":"x","previous_response_id":"a.b"}`:                             "previous_response_id",
		`{"model":"m","input":"x","previous_response_id":7}`:                                 "previous_response_id",
		`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":3}]}]}`: "input[0].content[0].text",
	} {
		_, err := features.ParseRequest(subjects.EndpointResponses, []byte(body))
		pe, ok := err.(*features.ParseError)
		if !ok || pe.Param != param {
			t.Errorf("%s: err %v, want one naming %s", body, err, param)
		}
	}
	r, err := features.ParseRequest(subjects.EndpointResponses, []byte(`{"model":"m","input":"x","previous_response_id":"resp_abc-1"}`))
	if err != nil || r.PreviousResponseID != "resp_abc-1" {
		t.Errorf("previous_response_id = %v, %v", r, err)
	}
}
