package features

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/switchyard-llm/switchyard/subjects"
)

// The fast path must compute exactly what the encoding/json parser
// (reference_test.go) did: the same request, the same prefix hashes and
// flags, and for a refused body the same error.

// extracted is every feature the gateway derives from a body.
type extracted struct {
	Req    Request
	Prefix []uint64
	Flags  string
	Code   bool
}

func extractWith(parse func(*Request, string, []byte) error, isCode func([]byte) bool, endpoint string, body []byte) (extracted, error) {
	var x extracted
	if err := parse(&x.Req, endpoint, body); err != nil {
		return x, err
	}
	x.Prefix = AppendPrefix(nil, x.Req.Prompt, 16, MaxPrefixBlocks)
	x.Code = isCode(x.Req.Prompt)
	if x.Code {
		x.Flags = FeatureCode
	}
	if len(x.Req.Prompt) == 0 {
		x.Req.Prompt = nil
	}
	return x, nil
}

func sameAsReference(t *testing.T, endpoint string, body []byte) {
	t.Helper()
	want, werr := extractWith(refParseRequestInto, refIsCode, endpoint, body)
	got, gerr := extractWith(ParseRequestInto, IsCode, endpoint, body)
	if flags := Flags(got.Req.Prompt); gerr == nil && flags != got.Flags {
		t.Fatalf("Flags %q, IsCode %v", flags, got.Code)
	}
	show := func() string {
		if len(body) > 300 {
			return fmt.Sprintf("%d-byte body %q…", len(body), body[:300])
		}
		return fmt.Sprintf("body %q", body)
	}
	if (werr == nil) != (gerr == nil) {
		t.Fatalf("endpoint %q %s: error %v, reference %v", endpoint, show(), gerr, werr)
	}
	if werr != nil {
		if gerr.Error() != werr.Error() || gerr.(*ParseError).Param != werr.(*ParseError).Param {
			t.Fatalf("endpoint %q %s:\nerror     %v (param %q)\nreference %v (param %q)", endpoint, show(),
				gerr, gerr.(*ParseError).Param, werr, werr.(*ParseError).Param)
		}
		return
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("endpoint %q %s:\ngot  %+v\nwant %+v", endpoint, show(), summary(got), summary(want))
	}
}

func summary(x extracted) string {
	p := x.Req.Prompt
	if len(p) > 200 {
		p = p[:200]
	}
	mt := "nil"
	if x.Req.MaxTokens != nil {
		mt = fmt.Sprint(*x.Req.MaxTokens)
	}
	return fmt.Sprintf("model %q stream %v usage %v max %s has %v/%v/%v tokens %d exact %v prompt(%d) %q prefix %d flags %q",
		x.Req.Model, x.Req.Stream, x.Req.IncludeUsage, mt, x.Req.HasMessages, x.Req.HasPrompt, x.Req.HasInput,
		x.Req.PromptTokens, x.Req.ExactTokens, len(x.Req.Prompt), p, len(x.Prefix), x.Flags)
}

func endpoints() []string {
	return []string{subjects.EndpointChat, subjects.EndpointCompletions, subjects.EndpointEmbeddings,
		subjects.EndpointMessages, subjects.EndpointResponses, ""}
}

// corpus is the differential test's bodies: every shape and refusal the
// parser knows, the spellings encoding/json tolerates, and long prompts.
func corpus() [][]byte {
	msg := `"messages":[{"role":"user","content":"x"}]`
	small := []string{
		`{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"b"}]}]}`,
		`{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[]}]}`,
		`{"model":"m","messages":[{"role":"user","content":"a\"\\\/\n\t\u00e9\ud83d\ude00\ud800x"}]}`,
		`{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","max_tokens":100,"max_completion_tokens":7,` + msg + `}`,
		`{"model":"m","max_tokens":64.0,` + msg + `}`,
		`{"model":"m","max_tokens":1e3,` + msg + `}`,
		`{"model":"m","max_tokens":9223372036854775808,` + msg + `}`,
		`{"model":"m","max_tokens":1e400,` + msg + `}`,
		`{"model":"m","stream":null,"max_tokens":null,"stream_options":null,` + msg + `}`,
		`{"model":"m","prompt":"hello world"}`,
		`{"model":"m","prompt":["a","b"]}`,
		`{"model":"m","prompt":[1,2,300]}`,
		`{"model":"m","prompt":[[1,2],[3]]}`,
		`{"model":"m","prompt":[[1,2],null]}`,
		`{"model":"m","prompt":[[1,2],{}]}`,
		`{"model":"m","prompt":[4294967295,4294967296]}`,
		`{"model":"m","prompt":[1.0]}`,
		`{"model":"m","prompt":[null]}`,
		`{"model":"m","prompt":[true,"a"]}`,
		`{"model":"e","input":"abc"}`,
		`{"model":"e","input":["abc","d\u0000"]}`,
		`{"model":"m","prompt":"p","messages":[{"role":"user","content":"c"}]}`,
		// Keys as encoding/json matches them: any case, escapes, the
		// Kelvin sign and the long s, the last duplicate winning.
		`{"MODEL":"m","Messages":[{"ROLE":"user","Content":"hi"}]}`,
		`{"mod\u0065l":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","ſtream":true,"max_to\u212aens":5,` + msg + `}`,
		`{"model":"a","model":"b","messages":[{"role":"user","role":"system","content":"x"}]}`,
		`{"model":"m","model":null,` + msg + `}`,
		`{"model":"m","messages":[{"role":"user","content":[{"TYPE":"text","Text":"a"},{"type":"te\u0078t","text":"b"}]}]}`,
		`{"model":"m","stream_options":{"INCLUDE_USAGE":true,"include_usage":null},` + msg + `}`,
		`{"model":"m\u00e9\\x",` + msg + `}`,
		` {"model" : "m" , "messages" : [ { "role" : "user" , "content" : [ { "type" : "text" , "text" : "a" } ] } ] } `,
		// The Messages and Responses APIs.
		`{"model":"m","max_tokens":9,"system":"Be brief","messages":[{"role":"user","content":[{"type":"text","text":"Hi"}]}]}`,
		`{"model":"m","system":[{"type":"text","text":"Be"},{"type":"text","text":" brief"}],"messages":[{"role":"user","content":"Hi"}]}`,
		`{"model":"m","max_output_tokens":9,"instructions":"Be brief","input":"Hi"}`,
		`{"model":"m","instructions":"Be brief","input":[{"role":"user","content":[{"type":"input_text","text":"Hi"}]},{"type":"function_call_output","call_id":"c","output":"x"},null,{"role":"assistant","content":[{"type":"output_text","text":"ok"}]}]}`,
		`{"model":"m","input":"x","previous_response_id":"resp_abc-1"}`,
		`{"model":"m","input":"x","previous_response_id":"a.b"}`, `{"model":"m","input":"x","previous_response_id":7}`,
		`{"model":"m","input":"x","previous_response_id":"\u0061bc"}`, `{"model":"m","input":"x","max_output_tokens":-1}`,
		`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":3}]}]}`,
		`{"model":"m","input":[{"role":"","content":"x"}]}`, `{"model":"m","input":[5]}`, `{"model":"m","input":[]}`,
		`{"model":"m","system":5,"messages":[{"role":"user","content":"Hi"}]}`, `{"model":"m","instructions":[1],"input":"x"}`,
		"{\"model\":\"m\",\"system\":\"\xff\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
		// Refusals.
		`{"model":`, `{"model":"m",` + msg + `} x`, `["model"]`, `"model"`, `12`, `true`, `null`, ``, ` `,
		`{` + msg + `}`, `{"model":"",` + msg + `}`, `{"model":3,` + msg + `}`,
		`{"model":"m","stream":"yes",` + msg + `}`, `{"model":"m","stream":1,` + msg + `}`,
		`{"model":"m","stream_options":1,` + msg + `}`, `{"model":"m","stream_options":[],` + msg + `}`,
		`{"model":"m","stream_options":{"include_usage":1},` + msg + `}`,
		`{"model":"m","max_tokens":-1,` + msg + `}`, `{"model":"m","max_tokens":1048577,` + msg + `}`,
		`{"model":"m","max_tokens":0,` + msg + `}`, `{"model":"m","max_tokens":-0,` + msg + `}`,
		`{"model":"m","max_tokens":1.5,` + msg + `}`, `{"model":"m","max_completion_tokens":"9",` + msg + `}`,
		`{"model":"m","max_tokens":[1],` + msg + `}`,
		`{"model":"m"}`, `{"model":"m","messages":[]}`, `{"model":"m","messages":{}}`, `{"model":"m","messages":"hi"}`,
		`{"model":"m","messages":["hi"]}`, `{"model":"m","messages":[null]}`, `{"model":"m","messages":[{"content":"x"}]}`,
		`{"model":"m","messages":[{"role":"","content":"x"}]}`, `{"model":"m","messages":[{"role":1,"content":"x"}]}`,
		`{"model":"m","messages":[{"role":"user","content":1}]}`, `{"model":"m","messages":[{"role":"user","content":{}}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":1}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"text":"a"}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":[null]}]}`,
		`{"model":"m","messages":[{"role":"user","content":["a"]}]}`,
		"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}",
		"{\"model\":\"\xc3\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
		"{\"model\":\"m\",\"other\":\"\xed\xa0\x80\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
		"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\x01\"}]}",
		`{"model":"m","messages":[{"role":"user","content":"\x"}]}`, `{"model":"m","messages":[{"role":"user","content":"\u12"}]}`,
		`{"model":"m","prompt":[]}`, `{"model":"m","prompt":["a",1]}`, `{"model":"m","prompt":[1,-2]}`,
		`{"model":"m","prompt":[[1],[]]}`, `{"model":"m","prompt":{}}`, `{"model":"m","prompt":01}`,
		`{"model":"m","prompt":1.}`, `{"model":"m","prompt":-}`, `{"model":"m","prompt":1e}`, `{"model":"m","prompt":tru}`,
		`{"model":"m",}`, `{"model":"m" "x":1}`, `{"model":"m",` + msg + `,}`, `{,}`, `{"a":[1,]}`, `{"a":[,1]}`,
		"\xef\xbb\xbf{\"model\":\"m\"}",
	}
	var out [][]byte
	for _, s := range small {
		out = append(out, []byte(s))
	}
	// Nesting at encoding/json's limit and one past it.
	for _, depth := range []int{9999, 10000} {
		out = append(out, []byte(`{"model":"m","x":`+strings.Repeat("[", depth-1)+strings.Repeat("]", depth-1)+`,`+msg+`}`))
	}
	// Long prompts, up to the 480 KB the dev models' context holds.
	rng := rand.New(rand.NewPCG(17, 1))
	for _, n := range []int{1 << 10, 64 << 10, 256 << 10, 480 << 10} {
		out = append(out, chatBody(n))
		out = append(out, chatBodyFrom(rng, n))
	}
	out = append(out, []byte(`{"model":"m","prompt":"`+strings.Repeat(`line of text\n`, 20000)+`"}`))
	var ids bytes.Buffer
	ids.WriteString(`{"model":"m","prompt":[`)
	for i := range 50000 {
		if i > 0 {
			ids.WriteByte(',')
		}
		fmt.Fprint(&ids, rng.Uint32())
	}
	ids.WriteString(`]}`)
	out = append(out, ids.Bytes())
	return out
}

// chatBodyFrom is a chat body of about n bytes whose contents draw on
// everything a string may hold: escapes, surrogate pairs, multi-byte UTF-8,
// code lines.
func chatBodyFrom(rng *rand.Rand, n int) []byte {
	pieces := []string{"word ", "déjà vu ", "中文 ", "😀", `\n`, `\t`, `\"`, `\\`, `\/`, `\u00e9`, `\ud83d\ude00`, `\ud800`,
		"func main() {", `    return x;\n`, "```", "=> ", "SELECT * FROM t;\\n"}
	var b bytes.Buffer
	b.WriteString(`{"model":"m","stream":true,"messages":[{"role":"system","content":"`)
	for b.Len() < n/2 {
		b.WriteString(pieces[rng.IntN(len(pieces))])
	}
	b.WriteString(`"},{"role":"user","content":[{"type":"text","text":"`)
	for b.Len() < n {
		b.WriteString(pieces[rng.IntN(len(pieces))])
	}
	b.WriteString(`"}]}]}`)
	return b.Bytes()
}

func TestParseMatchesReference(t *testing.T) {
	for i, body := range corpus() {
		for _, ep := range endpoints() {
			t.Run(fmt.Sprintf("%d%s", i, ep), func(t *testing.T) { sameAsReference(t, ep, body) })
		}
	}
}

// TestCorpusIsValidWhereMeant guards the corpus itself: the long bodies must
// be accepted, or the comparison above would only compare refusals.
func TestCorpusIsValidWhereMeant(t *testing.T) {
	for _, n := range []int{64 << 10, 480 << 10} {
		b := chatBody(n)
		if !json.Valid(b) {
			t.Fatalf("chatBody(%d) is not JSON", n)
		}
		var r Request
		if err := ParseRequestInto(&r, subjects.EndpointChat, b); err != nil {
			t.Fatal(err)
		}
		if len(b) < n || len(r.Prompt) < n*9/10 {
			t.Fatalf("chatBody(%d): %d bytes, prompt %d", n, len(b), len(r.Prompt))
		}
	}
}

func FuzzParseMatchesReference(f *testing.F) {
	for _, b := range corpus() {
		if len(b) < 4096 {
			f.Add(byte(0), b)
		}
	}
	f.Fuzz(func(t *testing.T, ep byte, body []byte) {
		eps := endpoints()
		sameAsReference(t, eps[int(ep)%len(eps)], body)
	})
}
