package jsonscan_test

import (
	"encoding/json"
	"testing"

	"github.com/switchyard-llm/switchyard/internal/jsonscan"
)

func TestKeyMatching(t *testing.T) {
	tests := []struct {
		quoted, name string
		equal, fold  bool
	}{
		{`"model"`, "model", true, true},
		{`"MODEL"`, "model", false, true},
		{`"Model"`, "model", false, true},
		{`"mod\u0065l"`, "model", true, true},
		{`"\u004dodel"`, "model", false, true},
		{`"max_to\u212aens"`, "max_tokens", false, true}, // the Kelvin sign folds to k
		{`"ſtream"`, "stream", false, true},              // the long s folds to s
		{`"models"`, "model", false, false},
		{`"mod\el"`, "model", false, false}, // not a valid escape
		{`""`, "", true, true},
	}
	for _, tt := range tests {
		k := key(tt.quoted)
		if got := k.Equal(tt.name); got != tt.equal {
			t.Errorf("%s.Equal(%q) = %v", tt.quoted, tt.name, got)
		}
		if got := k.EqualFold(tt.name); got != tt.fold {
			t.Errorf("%s.EqualFold(%q) = %v", tt.quoted, tt.name, got)
		}
	}
}

// FuzzKeyMatching checks both matchers against encoding/json: EqualFold
// against the struct field a key selects, Equal against the map key it
// decodes to.
func FuzzKeyMatching(f *testing.F) {
	for _, s := range []string{`"model"`, `"MODEL"`, `"mod\u0065l"`, `"max_to\u212aens"`, `"ſtream"`, `"\u00e9"`, `"Stream"`, `"x"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, quoted string) {
		var m map[string]int
		if json.Unmarshal([]byte(`{`+quoted+`:1}`), &m) != nil || len(m) != 1 {
			return
		}
		var v struct {
			Model     int `json:"model"`
			Stream    int `json:"stream"`
			MaxTokens int `json:"max_tokens"`
		}
		if err := json.Unmarshal([]byte(`{`+quoted+`:1}`), &v); err != nil {
			t.Fatal(err)
		}
		k := key(quoted)
		for name, selected := range map[string]bool{"model": v.Model == 1, "stream": v.Stream == 1, "max_tokens": v.MaxTokens == 1} {
			if got := k.EqualFold(name); got != selected {
				t.Errorf("%s.EqualFold(%q) = %v, encoding/json selects: %v", quoted, name, got, selected)
			}
			if got, want := k.Equal(name), m[name] == 1; got != want {
				t.Errorf("%s.Equal(%q) = %v, decodes to that key: %v", quoted, name, got, want)
			}
		}
	})
}

// key is the Key Validate reports for a quoted literal.
func key(quoted string) jsonscan.Key {
	var k jsonscan.Key
	jsonscan.Validate([]byte(`{`+quoted+`:0}`), func(got jsonscan.Key, _ []byte) { k = got })
	if k.Quoted == nil { // not valid JSON: read it as the skippers do
		m := jsonscan.NewMembers([]byte(`{`+quoted+`:0}`), 0)
		m.Next()
		k = m.Key()
	}
	return k
}
