package reply_test

import (
	"bufio"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/subjects/reply"
)

// docRow is one row of the reply protocol's table in docs/protocol.md.
type docRow struct {
	kind    string
	seq     string
	headers []string
}

var backticked = regexp.MustCompile("`([^`]+)`")

// protocolTable reads the table under "## The reply protocol".
func protocolTable(t *testing.T) []docRow {
	t.Helper()
	f, err := os.Open("../../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rows []docRow
	in, header := false, true
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			in = line == "## The reply protocol"
			continue
		case !in || !strings.HasPrefix(line, "|"):
			if in && len(rows) > 0 {
				return rows // the table is over
			}
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if header || strings.HasPrefix(cells[0], "---") {
			header = false // the first line names the columns
			continue
		}
		if len(cells) != 5 {
			t.Fatalf("reply protocol table row %q: %d columns, want 5", line, len(cells))
		}
		r := docRow{kind: strings.TrimSpace(cells[0]), seq: strings.TrimSpace(cells[2])}
		for _, m := range backticked.FindAllStringSubmatch(cells[3], -1) {
			r.headers = append(r.headers, m[1])
		}
		rows = append(rows, r)
	}
	if len(rows) == 0 {
		t.Fatal(`docs/protocol.md has no table under "## The reply protocol"`)
	}
	return rows
}

// TestProtocolTable holds docs/protocol.md and the codec together: every
// kind of the table is a kind of the codec and the other way round, each
// with the same headers, and only the routed notice and present go without Llm-Seq.
func TestProtocolTable(t *testing.T) {
	rows := protocolTable(t)
	byName := map[string]reply.Kind{}
	for _, k := range reply.Kinds() {
		byName[k.String()] = k
	}
	seen := map[string]bool{}
	for _, r := range rows {
		k, ok := byName[r.kind]
		if !ok {
			t.Errorf("the doc names kind %q, the codec has none", r.kind)
			continue
		}
		seen[r.kind] = true
		codec := k.Headers()
		for _, h := range r.headers {
			if !slices.ContainsFunc(codec, matcher(h)) {
				t.Errorf("%s: the doc names header %s, the codec's %s frame has none", r.kind, h, r.kind)
			}
		}
		for _, h := range codec {
			if !slices.ContainsFunc(r.headers, func(d string) bool { return matcher(d)(h) }) {
				t.Errorf("%s: the codec's frame carries %s, the doc's row does not name it", r.kind, h)
			}
		}
		if noSeq := r.seq == "none"; noSeq != !slices.Contains(codec, subjects.HdrSeq) {
			t.Errorf("%s: the doc's Llm-Seq is %q, the codec's headers are %v", r.kind, r.seq, codec)
		}
	}
	for name := range byName {
		if !seen[name] {
			t.Errorf("the codec has kind %q, the doc's table has no row for it", name)
		}
	}
}

// matcher matches a header name against a doc's spelling, where a
// trailing * stands for any rest.
func matcher(doc string) func(string) bool {
	if p, ok := strings.CutSuffix(doc, "*"); ok {
		return func(h string) bool { return strings.HasPrefix(h, p) }
	}
	return func(h string) bool { return h == doc }
}

// TestRoundTrip: what Encode writes, Decode reads as the same frame.
func TestRoundTrip(t *testing.T) {
	rej := reply.Rejection(&subjects.APIError{Status: 429, Code: subjects.CodeRateLimit, Message: "slow down",
		RetryAfter: 1500e6, Headers: map[string]string{subjects.HdrRateLimitRemainingRequests: "0"}})
	tests := []reply.Frame{
		{Kind: reply.Routed, Seq: -1, Replica: "r1"},
		{Kind: reply.Present, Seq: -1, Replica: "r1"},
		{Kind: reply.Accept, Seq: 0, Replica: "r1", Held: 1500 * time.Microsecond, Body: []byte(`{"replica":"r1"}`)},
		{Kind: reply.Head, Seq: 1, Status: 200},
		{Kind: reply.Head, Seq: 1, Status: 200, Replica: "r1", Held: 40 * time.Millisecond, End: true, Body: []byte("{}")},
		{Kind: reply.Head, Seq: 1, Status: 502, End: true, Err: "engine died"},
		{Kind: reply.Data, Seq: 2, Body: []byte("data: x\n\n")},
		{Kind: reply.Keepalive, Seq: 1},
		{Kind: reply.End, Seq: 3, End: true},
		{Kind: reply.End, Seq: 3, End: true, Err: "broken pipe"},
		{Kind: reply.Handover, Seq: 4, End: true, Err: "drained"},
		rej,
	}
	for _, want := range tests {
		t.Run(want.Kind.String(), func(t *testing.T) {
			m := want.Msg("llm.reply.gw.id")
			got := reply.Decode(m)
			if got.Kind != want.Kind || got.Seq != want.Seq || got.Replica != want.Replica || got.Status != want.Status ||
				got.End != want.End || got.Err != want.Err || string(got.Body) != string(want.Body) ||
				(want.Replica != "" && want.Kind != reply.Routed && got.Held != want.Held) {
				t.Errorf("Decode(Encode(%+v)) = %+v", want, got)
			}
		})
	}
	h := reply.Decode(rej.Msg("x")).Header
	for _, k := range []string{subjects.HdrRetryAfter, subjects.HdrRetryAfterMS, subjects.HdrRateLimitRemainingRequests, subjects.HdrContent} {
		if h.Get(k) == "" {
			t.Errorf("rejection lost %s: %v", k, h)
		}
	}
}

// Llm-Held is believed only within its range; anything else reads as
// absent (-1), and an accept that does not say reads so too.
func TestHeldIsRangeChecked(t *testing.T) {
	for v, want := range map[string]time.Duration{
		"0": 0, "1000000": time.Second, "250": 250 * time.Microsecond,
		"": -1, "-1": -1, "1000001": -1, "9223372036854775807": -1, "1e3": -1, "abc": -1,
	} {
		h := nats.Header{subjects.HdrSeq: {"0"}, subjects.HdrAccepted: {"r1"}}
		if v != "" {
			h.Set(subjects.HdrHeld, v)
		}
		if f := reply.Decode(&nats.Msg{Header: h}); f.Kind != reply.Accept || f.Held != want {
			t.Errorf("Llm-Held %q: %s held %v, want accept held %v", v, f.Kind, f.Held, want)
		}
	}
	// Out of range on the way out is clamped, never written as sent.
	f := reply.Frame{Kind: reply.Accept, Replica: "r1", Held: time.Hour}
	if got := reply.Decode(f.Msg("x")).Held; got != time.Second {
		t.Errorf("an hour held encoded and read back as %v, want the bound", got)
	}
}

// TestDecode reads what senders other than the codec put on a reply
// subject: NATS's no-responders status, and malformed messages.
func TestDecode(t *testing.T) {
	tests := []struct {
		name string
		h    nats.Header
		data string
		want reply.Kind
		seq  int
	}{
		{"no responders", nats.Header{"Status": {"503"}}, "", reply.NoResponders, -1},
		{"no seq", nats.Header{"X": {"1"}}, "hi", reply.Unknown, -1},
		{"bad seq", nats.Header{subjects.HdrSeq: {"x"}}, "hi", reply.Unknown, -1},
		{"rejection without seq", nats.Header{subjects.HdrEOS: {"1"}, subjects.HdrStatus: {"400"}}, "{}", reply.Error, -1},
		{"seq 1 without status", nats.Header{subjects.HdrSeq: {"1"}}, "x", reply.Head, 1},
		{"lost end marker", nats.Header{subjects.HdrSeq: {"7"}, subjects.HdrError: {"lost"}}, "", reply.Data, 7},
		{"handover as seq 1", nats.Header{subjects.HdrSeq: {"1"}, subjects.HdrEOS: {"1"}, subjects.HdrHandover: {"1"}}, "", reply.Handover, 1},
	}
	for _, tt := range tests {
		f := reply.Decode(&nats.Msg{Header: tt.h, Data: []byte(tt.data)})
		if f.Kind != tt.want || f.Seq != tt.seq {
			t.Errorf("%s: %s seq %d, want %s seq %d", tt.name, f.Kind, f.Seq, tt.want, tt.seq)
		}
	}
}

// FuzzDecode: a reply subject carries what any adapter sends, so Decode
// takes any headers without failing, and what it reads as a frame of the
// protocol reads back the same once encoded.
func FuzzDecode(f *testing.F) {
	f.Add("1", "", "", "", "", "", "", "data: x\n\n")
	f.Add("0", "r1", "200", "1", "", "", "", "{}")
	f.Add("3", "", "", "1", "1", "drained", "", "")
	f.Add("", "", "", "", "", "", "503", "")
	f.Add("-2", "", "x", "1", "", "", "", "{}")
	f.Fuzz(func(t *testing.T, seq, accepted, status, eos, handover, errText, natsStatus, body string) {
		h := nats.Header{}
		for k, v := range map[string]string{subjects.HdrSeq: seq, subjects.HdrAccepted: accepted, subjects.HdrStatus: status,
			subjects.HdrEOS: eos, subjects.HdrHandover: handover, subjects.HdrError: errText, "Status": natsStatus} {
			if v != "" {
				h.Set(k, v)
			}
		}
		got := reply.Decode(&nats.Msg{Header: h, Data: []byte(body)})
		if got.Kind == reply.Unknown || got.Kind == reply.NoResponders || got.Seq < 0 {
			return
		}
		if got.Kind == reply.Head && got.Status == 0 {
			return // a head without a readable status: nothing to encode it back to
		}
		again := reply.Decode(got.Msg("x"))
		if again.Kind != got.Kind || again.Seq != got.Seq || again.End != got.End || again.Err != got.Err ||
			again.Status != got.Status || again.Replica != got.Replica {
			t.Fatalf("decoded %+v, encoded and decoded again %+v", got, again)
		}
	})
}

// BenchmarkDecode is the gateway's per-message cost of reading a reply:
// a data frame, the one every streamed token arrives in.
func BenchmarkDecode(b *testing.B) {
	f := reply.Frame{Kind: reply.Data, Seq: 7, Body: []byte("data: {}\n\n")}
	m := f.Msg("llm.reply.gw.id")
	b.ReportAllocs()
	for b.Loop() {
		if reply.Decode(m).Kind != reply.Data {
			b.Fatal("not data")
		}
	}
}
