package main

import (
	"testing"

	"github.com/switchyard-llm/switchyard/loadgen"
)

// Switchyard's failures in the many-streams phase: none at the target
// load; past it, only refusals gateway_overloaded that say when to come back.
func TestJudgeFailures(t *testing.T) {
	proxy := loadgen.TargetReport{Name: "proxy", Sent: 100, OK: 100}
	cases := []struct {
		name  string
		sy    loadgen.TargetReport
		first bool
		met   bool
	}{
		{"no failure at the target load", loadgen.TargetReport{Sent: 100, OK: 100}, true, true},
		{"an overload refusal at the target load", loadgen.TargetReport{Sent: 100, OK: 99, Errors: 1, ErrorsBy: map[string]int{"503": 1}, CodesBy: map[string]int{"gateway_overloaded": 1}}, true, false},
		{"overload refusals past it", loadgen.TargetReport{Sent: 100, OK: 90, Errors: 10, ErrorsBy: map[string]int{"503": 10}, CodesBy: map[string]int{"gateway_overloaded": 10}}, false, true},
		{"one without Retry-After", loadgen.TargetReport{Sent: 100, OK: 90, Errors: 10, ErrorsBy: map[string]int{"503": 10}, CodesBy: map[string]int{"gateway_overloaded": 10}, NoRetryAfter: 1}, false, false},
		{"no_replicas past it", loadgen.TargetReport{Sent: 100, OK: 90, Errors: 10, ErrorsBy: map[string]int{"503": 10}, CodesBy: map[string]int{"gateway_overloaded": 9, "no_replicas": 1}}, false, false},
		{"a cut stream past it", loadgen.TargetReport{Sent: 100, OK: 90, Errors: 10, ErrorsBy: map[string]int{"503": 9, "incomplete stream": 1}, CodesBy: map[string]int{"gateway_overloaded": 9}}, false, false},
	}
	for _, c := range cases {
		rep := &loadgen.Report{Targets: []loadgen.TargetReport{proxy, c.sy}}
		if met, why := judgeFailures(rep, c.first); met != c.met {
			t.Errorf("%s: met %v (%s), want %v", c.name, met, why, c.met)
		}
	}
}
