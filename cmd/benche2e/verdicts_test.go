package main

import (
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/loadgen"
)

func ms(f float64) loadgen.Dur { return loadgen.Dur(time.Duration(f * float64(time.Millisecond))) }

// One size is met when Switchyard adds at most the proxy's addition (or 0
// when the proxy adds less than nothing) plus the floor plus 0.2 ms.
func TestBodyVerdict(t *testing.T) {
	size := func(direct, proxy, sy, floor float64) *bodySize {
		return &bodySize{KB: 1, Paths: map[string]pathSummary{
			"direct": {OK: 1, P50: ms(direct)}, "proxy": {OK: 1, P50: ms(proxy)}, "switchyard": {OK: 1, P50: ms(sy)},
		}, Floor: pathSummary{OK: 1, P50: ms(floor)}}
	}
	cases := []struct {
		name string
		bs   *bodySize
		met  bool
	}{
		{"at the limit", size(5, 5.5, 6.2, 0.5), true},       // 1.2 ≤ 0.5 + 0.5 + 0.2
		{"just over", size(5, 5.5, 6.21, 0.5), false},        // 1.21 > 1.2
		{"a proxy that gains", size(5, 4.8, 5.7, 0.5), true}, // 0.7 ≤ 0 + 0.5 + 0.2
		{"a gain not credited", size(5, 4.8, 5.8, 0.5), false},
		{"no floor measured", &bodySize{KB: 1, Paths: map[string]pathSummary{}}, false},
	}
	for _, c := range cases {
		if met, line := bodyVerdict(c.bs); met != c.met {
			t.Errorf("%s: met %v (%s), want %v", c.name, met, line, c.met)
		}
	}
}

// Every verdict line ends as the issue's contract says: " met", " NOT
// met", or " indicative" for a phase on a busy machine, whatever its
// figures.
func TestVerdictLines(t *testing.T) {
	for v, want := range map[verdict]string{
		{Target: "x", Met: true}:                    "x: met",
		{Target: "x"}:                               "x: NOT met",
		{Target: "x", Met: true, Indicative: true}:  "x: indicative",
		{Target: "x", Met: false, Indicative: true}: "x: indicative",
	} {
		if got := v.String(); got != want {
			t.Errorf("%+v: %q, want %q", v, got, want)
		}
	}
}

// The CPU target counts the floor's own process and its server's share,
// 1.3 times, over the proxy's; the decide benchmark its median and the
// most allocations of any run.
func TestVerdictsJudgeCPUAndDecide(t *testing.T) {
	r := &results{Config: configJSON{Rate: 500},
		NonStream: &fixedPhase{PerPath: 1000, CPU: map[string]cpuUse{
			"stack": {User: ms(600), Sys: ms(200)}, "proxy": {User: ms(200), Sys: ms(100)}}, // 800 and 300 µs a request
			Floor: &floorPhase{Run: floorRun{Requests: 1000}, CPU: cpuUse{User: ms(200), Sys: ms(100)}, ServerCPU: cpuUse{User: ms(100)}}, // 400 µs
		},
		Decide: &decideBench{NsOp: []float64{1900, 2500, 1800}, Allocs: 0},
	}
	vs := verdicts(r)
	if len(vs) != 2 {
		t.Fatalf("%d verdicts: %v", len(vs), vs)
	}
	if !vs[0].Met || !strings.Contains(vs[0].Target, "median 1900 ns") {
		t.Errorf("decide: %s", vs[0])
	}
	if !vs[1].Met || !strings.Contains(vs[1].Target, "= 820 µs") { // 300 + 1.3 × 400
		t.Errorf("cpu: %s", vs[1])
	}
	r.NonStream.CPU["stack"] = cpuUse{User: ms(821)} // 821 µs a request
	r.Decide.Allocs = 1
	vs = verdicts(r)
	if vs[0].Met || vs[1].Met {
		t.Errorf("an allocation and 821 µs met: %v", vs)
	}
}

// The benchmark's lines are read from go test's output, and an output
// without them is an error, not a pass.
func TestDecideBenchParse(t *testing.T) {
	out := `goos: linux
goarch: amd64
pkg: github.com/switchyard-llm/switchyard/broker/policy
BenchmarkDecide/candidates=64-2         	  812345	      1432 ns/op	       0 B/op	       0 allocs/op
BenchmarkDecide/candidates=64-2         	  812345	      1510 ns/op	       8 B/op	       1 allocs/op
BenchmarkDecide/candidates=64-2         	  812345	      1390 ns/op	       0 B/op	       0 allocs/op
PASS
`
	var d decideBench
	if err := d.parse(out); err != nil {
		t.Fatal(err)
	}
	if len(d.NsOp) != 3 || d.medianNs() != 1432 || d.Allocs != 1 {
		t.Errorf("parsed %+v, median %v", d, d.medianNs())
	}
	if err := new(decideBench).parse("PASS\n"); err == nil {
		t.Error("no benchmark line parsed as a result")
	}
}
