package lab_test

import (
	"bytes"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/lab"
)

// readAll reads every record of a trace, or its error.
func readAll(name, text, format string) ([]lab.TraceRecord, error) {
	tr, err := lab.NewTraceReader(name, strings.NewReader(text), format, 512)
	if err != nil {
		return nil, err
	}
	var out []lab.TraceRecord
	for {
		var rec lab.TraceRecord
		ok, err := tr.Next(&rec)
		if err != nil {
			return out, err
		}
		if !ok {
			return out, nil
		}
		out = append(out, rec)
	}
}

// TestTraceRefusesBadLines: a bad line stops the replay with an error
// naming the file and the line; nothing is guessed.
func TestTraceRefusesBadLines(t *testing.T) {
	ok := `{"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [1, 2]}` + "\n"
	for _, tc := range []struct{ name, text, want string }{
		{"not JSON", ok + ok + "{timestamp: 1}\n", "trace.jsonl: line 3: not a JSON object"},
		{"input not a number", ok + ok + `{"timestamp": 5, "input_length": "many", "output_length": 1, "hash_ids": []}`, "trace.jsonl: line 3: input_length is not a number"},
		{"missing timestamp", `{"input_length": 5, "output_length": 1, "hash_ids": []}`, "trace.jsonl: line 1: timestamp is missing"},
		{"missing hash_ids", `{"timestamp": 0, "input_length": 5, "output_length": 1}`, "trace.jsonl: line 1: hash_ids is missing"},
		{"negative output", ok + `{"timestamp": 5, "input_length": 5, "output_length": -1, "hash_ids": []}`, "trace.jsonl: line 2: output_length is negative"},
		{"fractional input", `{"timestamp": 5, "input_length": 5.5, "output_length": 1, "hash_ids": []}`, "trace.jsonl: line 1: input_length is not a whole number"},
		{"bad hash id", `{"timestamp": 5, "input_length": 5, "output_length": 1, "hash_ids": [-3]}`, "trace.jsonl: line 1: hash_ids[0] is not a whole number"},
		{"hash ids not a list", `{"timestamp": 5, "input_length": 5, "output_length": 1, "hash_ids": "abc"}`, "trace.jsonl: line 1: hash_ids is not a list of numbers"},
		{"too many hash ids", `{"timestamp": 0, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2, 3, 4]}`,
			"trace.jsonl: line 1: 4 hash_ids, more than input_length 1025 allows at 512 tokens a block (3)"},
		{"backwards", `{"timestamp": 10, "input_length": 5, "output_length": 1, "hash_ids": [1]}` + "\n\n" + `{"timestamp": 9, "input_length": 5, "output_length": 1, "hash_ids": [1]}`,
			"trace.jsonl: line 3: timestamp 9 ms is before the previous request's 10 ms: timestamps go backwards"},
		{"empty", "", "trace.jsonl: no requests"},
		{"blank", "\n\n", "trace.jsonl: no requests"},
	} {
		_, err := readAll("trace.jsonl", tc.text, lab.FormatMooncake)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	// A partial last block is one id; three ids for 1025 tokens are fine.
	recs, err := readAll("trace.jsonl", `{"timestamp": 0.5, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2, 3]}`, "")
	if err != nil || len(recs) != 1 || recs[0].At != 500*time.Microsecond || recs[0].Input != 1025 || !slices.Equal(recs[0].Hashes, []uint64{1, 2, 3}) {
		t.Errorf("a good line: %+v, %v", recs, err)
	}
	if _, err := lab.NewTraceReader("x", strings.NewReader(ok), "sharegpt", 512); err == nil {
		t.Error("an unknown format was accepted")
	}
}

// TestAzureTrace: Azure's CSV, its times relative to the first request,
// no prefix information; a bad line is refused by line.
func TestAzureTrace(t *testing.T) {
	const head = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
	recs, err := readAll("azure.csv", head+"2023-11-16 18:15:46.6805900,4808,10\n2023-11-16 18:15:50.1805900,100,3\n", lab.FormatAzure)
	if err != nil || len(recs) != 2 {
		t.Fatalf("%+v, %v", recs, err)
	}
	if recs[0].At != 0 || recs[1].At != 3500*time.Millisecond || recs[0].Input != 4808 || recs[1].Output != 3 || len(recs[1].Hashes) != 0 || recs[1].Line != 3 {
		t.Errorf("read %+v", recs)
	}
	for _, tc := range []struct{ text, want string }{
		{"TIMESTAMP,Tokens\n", "azure.csv: line 1: the header is"},
		{head + "2023-11-16 18:15:46.68,4808\n", "azure.csv: line 2: 2 fields, want 3"},
		{head + "yesterday,4808,10\n", "azure.csv: line 2: TIMESTAMP is not a date and time"},
		{head + "2023-11-16 18:15:46.68,lots,10\n", "azure.csv: line 2: ContextTokens is not a number"},
		{head + "2023-11-16 18:15:46.68,5,-1\n", "azure.csv: line 2: GeneratedTokens is negative"},
		{head + "2023-11-16 18:15:46.68,5,1\n2023-11-16 18:15:45,5,1\n", "azure.csv: line 3: timestamp -1680 ms is before"},
		{head, "azure.csv: no requests"},
	} {
		if _, err := readAll("azure.csv", tc.text, lab.FormatAzure); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.text, err, tc.want)
		}
	}
}

// TestLabReplayGeneratedTrace replays a conversation-shaped trace: every
// arm on the same arrivals, replay.csv as documented, no arm's hit rate
// above the trace's bound, and the arms that know the caches hit more than
// round robin.
func TestLabReplayGeneratedTrace(t *testing.T) {
	heavy(t)
	cfg := lab.ReplayConfig{Name: "generated.jsonl", R: bytes.NewReader(lab.ConversationTrace(400, 1)), Replicas: 4}
	tr, err := lab.LoadTrace(cfg, tiny)
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Requests) != 300 || tr.Bound < 0.3 {
		t.Fatalf("%d requests (want the tiny limit, 300), bound %.2f", len(tr.Requests), tr.Bound)
	}
	r := lab.Replay(tiny, tr, cfg)
	if len(r.Speedups) != 4 || r.Capacity() != 2 {
		t.Errorf("speedups %v at loads %v: want 4, the third at capacity", r.Speedups, r.Loads)
	}
	sec := r.Section()
	tab := sec.Tables[0]
	if tab.File != "replay.csv" || !slices.Equal(tab.Header, lab.ReplayHeader) || len(tab.Rows) != len(lab.ReplayArms())*4+4 {
		t.Fatalf("%s: header %v, %d rows", tab.File, tab.Header, len(tab.Rows))
	}
	var arms []string
	for _, row := range tab.Rows {
		if !slices.Contains(arms, row[0]) {
			arms = append(arms, row[0])
		}
	}
	if want := append(lab.ReplayArms(), lab.ArmBound); !slices.Equal(arms, want) {
		t.Errorf("arms %v, want %v", arms, want)
	}
	for _, a := range lab.ReplayArms() {
		for i := range r.Speedups {
			x := r.Of(a, i)
			if x.Requests != 300 || x.HitRate > tr.Bound+1e-9 || x.P90 < x.P50 || x.P99 < x.P90 {
				t.Errorf("%s at %v×: %+v (bound %.3f)", a, r.Speedups[i], x, tr.Bound)
			}
		}
	}
	for _, a := range []string{lab.ArmOracle, lab.ArmDynamoKV, lab.ArmSGLang, lab.ArmBest} {
		if h, rr := r.Of(a, 0).HitRate, r.Of(lab.ArmRoundRobin, 0).HitRate; h <= rr {
			t.Errorf("%s hits %.3f, round robin %.3f", a, h, rr)
		}
	}
	// The default profile is at or below power of two at every speedup up
	// to capacity: prefix affinity draws among a prefix's holders and
	// weighs the one it takes, so a conversation does not stay on a
	// replica whose queue grows.
	for _, c := range r.Checks() {
		t.Logf("%v× %s: %v (%s)", c.Speedup, c.What, c.Met, c.Detail)
		if c.What == "Switchyard p90 ≤ power-of-two" && !c.Met {
			t.Errorf("%v×: the default's p90 is above power of two's (%s)", c.Speedup, c.Detail)
		}
	}
}

// TestMooncakeSlices: the slices of Mooncake's traces kept in testdata read
// whole, with their licence beside them.
func TestMooncakeSlices(t *testing.T) {
	for _, f := range []string{"conversation_trace.jsonl", "synthetic_trace.jsonl"} {
		b, err := os.ReadFile("testdata/mooncake/" + f)
		if err != nil {
			t.Fatal(err)
		}
		tr, err := lab.LoadTrace(lab.ReplayConfig{Name: f, R: bytes.NewReader(b)}, lab.Options{Scale: lab.Full})
		if err != nil {
			t.Fatal(err)
		}
		if len(tr.Requests) != 3000 || !(tr.Bound > 0.2) {
			t.Errorf("%s: %d requests, bound %.3f", f, len(tr.Requests), tr.Bound)
		}
	}
	for _, f := range []string{"LICENSE", "SOURCES.md"} {
		if b, err := os.ReadFile("testdata/mooncake/" + f); err != nil || !bytes.Contains(b, []byte("Apache License")) {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// TestLabReplayBestMeetsTheTargets replays the lab's conversation trace as
// the report does (quick scale, seed 1): Switchyard best is at or below
// every peer's p90 TTFT, within 1.25× of the oracle's and within 3 points
// of the best hit rate at every speedup up to capacity. Before its
// decider chose over every replica it met 18 of 21 (seeds 1–4 meet all 21
// now).
func TestLabReplayBestMeetsTheTargets(t *testing.T) {
	heavy(t)
	targetsMet(t, lab.ReplayGenerated(lab.Options{Scale: lab.Quick, Seed: 1}), "Switchyard best", 18)
}

// targetsMet fails for each target whose name starts with arm that r
// misses, and unless r judged want of them.
func targetsMet(t *testing.T, r *lab.ReplayResult, arm string, want int) {
	t.Helper()
	n := 0
	for _, c := range r.Checks() {
		if strings.HasPrefix(c.What, arm) {
			n++
			if !c.Met {
				t.Errorf("%v×: %s: %s", c.Speedup, c.What, c.Detail)
			}
		}
	}
	if n != want {
		t.Fatalf("%d checks of %s, want %d", n, arm, want)
	}
}

// TestLabReplayMooncakeBestMeetsTheTargets replays the slices of
// Mooncake's conversation and synthetic traces as make lab-replay does
// (quick scale, seed 1): all 21 targets are met on each (Switchyard best's
// 18 and the default's 3), at the speedup at capacity too.
func TestLabReplayMooncakeBestMeetsTheTargets(t *testing.T) {
	heavy(t)
	for _, f := range []string{"conversation_trace.jsonl", "synthetic_trace.jsonl"} {
		t.Run(f, func(t *testing.T) {
			b, err := os.ReadFile("testdata/mooncake/" + f)
			if err != nil {
				t.Fatal(err)
			}
			o := lab.Options{Scale: lab.Quick, Seed: 1}
			cfg := lab.ReplayConfig{Name: f, R: bytes.NewReader(b)}
			tr, err := lab.LoadTrace(cfg, o)
			if err != nil {
				t.Fatal(err)
			}
			targetsMet(t, lab.Replay(o, tr, cfg), "Switchyard", 21)
		})
	}
}
