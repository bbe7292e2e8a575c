package main

import "testing"

// The gateway, the broker and the adapter each serve newRegistry, so each
// reports which build it runs.
func TestEveryPartReportsItsBuild(t *testing.T) {
	mfs, err := newRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "switchyard_build_info" {
			if len(mf.GetMetric()) != 1 || mf.GetMetric()[0].GetGauge().GetValue() != 1 {
				t.Errorf("switchyard_build_info = %v", mf.GetMetric())
			}
			return
		}
	}
	t.Error("newRegistry has no switchyard_build_info")
}
