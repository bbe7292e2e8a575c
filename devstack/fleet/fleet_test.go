package fleet_test

import (
	"testing"

	"github.com/switchyard-llm/switchyard/devstack/fleet"
)

func TestNamedPicksInTheGivenOrder(t *testing.T) {
	got := fleet.Named("l8-gen-1", "l70-gen-0")
	if len(got) != 2 || got[0].ID != "l8-gen-1" || got[1].ID != "l70-gen-0" {
		t.Fatalf("got %+v", got)
	}
	if got[0].Model != "llama-3-8b-instruct" || got[0].MaxLoras != 4 {
		t.Errorf("l8-gen-1 = %+v", got[0])
	}
}

func TestNamedRefusesAnUnknownReplica(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic for an unknown replica")
		}
	}()
	fleet.Named("l8-gen-9")
}

func TestIDsAreUniqueAndRegistrationsComplete(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range fleet.Dev() {
		if seen[r.ID] {
			t.Errorf("replica %s defined twice", r.ID)
		}
		seen[r.ID] = true
		reg := r.Registration()
		if reg.Model == "" || reg.Pool == "" || reg.MaxBatch != fleet.DefaultMaxBatch || reg.MaxQueue != fleet.DefaultMaxQueue || reg.State != "ready" {
			t.Errorf("%s registers %+v", r.ID, reg)
		}
	}
}

func TestCapacityIsTheReplicasOwnElseTheDefault(t *testing.T) {
	if b, q := (fleet.Replica{MaxBatch: 8}).Capacity(); b != 8 || q != fleet.DefaultMaxQueue {
		t.Errorf("MaxBatch 8: capacity %d, %d; want 8, %d", b, q, fleet.DefaultMaxQueue)
	}
	if reg := (fleet.Replica{MaxQueue: 5}).Registration(); reg.MaxBatch != fleet.DefaultMaxBatch || reg.MaxQueue != 5 {
		t.Errorf("MaxQueue 5 registers %+v", reg)
	}
}
