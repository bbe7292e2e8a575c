package gateway

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/switchyard-llm/switchyard/deploy/examples"
	"github.com/switchyard-llm/switchyard/table"
)

func TestModelListIsWhatTheTenantMayAskFor(t *testing.T) {
	flat, errs := table.ParseFlat(examples.Table())
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	snap, errs := table.FromFlat(flat)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	ids := func(tenant string) string {
		var out []string
		for _, m := range modelList(snap, tenant) {
			out = append(out, m.ID+"/"+m.OwnedBy)
		}
		return strings.Join(out, " ")
	}
	tests := []struct{ tenant, want string }{
		{"default", "auto/switchyard chat-large/switchyard chat-small/switchyard code/switchyard mixtral/switchyard " +
			"llama-3-70b-instruct/switchyard llama-3-70b-pd/switchyard llama-3-8b-instruct/switchyard mixtral-8x22b/switchyard qwen-coder-32b/switchyard"},
		// Only what its allowed_models names (auto reaches chat-small
		// for some prompts only, and is refused for the rest).
		{"intern", "chat-small/switchyard"},
		{"team-x", "auto/switchyard chat-large/switchyard chat-small/switchyard code/switchyard mixtral/switchyard " +
			"llama-3-70b-instruct/switchyard llama-3-70b-pd/switchyard llama-3-8b-instruct/switchyard mixtral-8x22b/switchyard qwen-coder-32b/switchyard " +
			"chat-small:team-x-v3/team-x"},
	}
	for _, tt := range tests {
		if got := ids(tt.tenant); got != tt.want {
			t.Errorf("%s:\n got %s\nwant %s", tt.tenant, got, tt.want)
		}
	}
	b, _ := json.Marshal(modelList(snap, "team-x"))
	for _, want := range []string{
		`{"id":"chat-large","object":"model","created":0,"owned_by":"switchyard","resolves_to":["llama-3-70b-instruct"]}`,
		`{"id":"auto","object":"model","created":0,"owned_by":"switchyard","resolves_to":["code","chat-small","chat-large"]}`,
		`{"id":"chat-small:team-x-v3","object":"model","created":0,"owned_by":"team-x","parent":"chat-small"}`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("list lacks %s:\n%s", want, b)
		}
	}
}
