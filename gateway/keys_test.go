package gateway_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/switchyard-llm/switchyard/gateway"
)

// TestAnonymousMeansNoKey: with allow_anonymous on (the dev table), only a
// request without any key is tenant default; a key that is not in the
// table, or a header that carries none, is 401.
func TestAnonymousMeansNoKey(t *testing.T) {
	u := newUpstream(t, gateway.Config{}, func(r *reply, _ int) { r.stream("r-0", 1) })
	for _, c := range []struct {
		name, header, value string
		want                int
	}{
		{"no key", "", "", 200},
		{"a dev key", "Authorization", "Bearer sk-acme-dev", 200},
		{"lowercase scheme", "Authorization", "bearer sk-acme-dev", 200},
		{"sk-default-dev", "Authorization", "Bearer sk-default-dev", 200},
		{"x-api-key", "X-Api-Key", "sk-teamx-dev", 200},
		{"a mistyped key", "Authorization", "Bearer sk-acme-dve", 401},
		{"an empty bearer", "Authorization", "Bearer ", 401},
		{"another scheme", "Authorization", "Basic c2stYWNtZS1kZXY6", 401},
		{"an empty header", "Authorization", "", 401},
		{"an unknown x-api-key", "X-Api-Key", "sk-nope", 401},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest("POST", u.gw+"/v1/chat/completions",
				strings.NewReader(`{"model":"chat-small","messages":[{"role":"user","content":"hi"}]}`))
			if c.header != "" {
				req.Header[c.header] = []string{c.value}
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != c.want || c.want == 401 && !strings.Contains(string(b), "invalid_api_key") {
				t.Errorf("%s: %q: %d %s, want %d", c.header, c.value, resp.StatusCode, b, c.want)
			}
		})
	}
}
