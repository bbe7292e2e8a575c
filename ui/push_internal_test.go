package ui

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/table"
)

// A browser that stops reading is dropped once its buffer is full; the
// others keep getting every push, and nothing is pushed without a change.
func TestASlowClientIsDroppedAndTheOthersKeepUp(t *testing.T) {
	u := New(nil, Config{ClientBuffer: 2, Table: func() *table.Snapshot { return nil }})
	slow, _ := u.register(time.Now())
	fast, _ := u.register(time.Now())
	for i := range 5 {
		u.onDecision(&nats.Msg{Subject: "llm.decision.general", Data: []byte(`{"replica":"r"}`)})
		u.push(time.Now())
		select {
		case b := <-fast.ch:
			if len(b) == 0 {
				t.Fatalf("push %d empty", i)
			}
		default:
			t.Fatalf("push %d did not reach the client that reads", i)
		}
	}
	u.push(time.Now())
	select {
	case <-fast.ch:
		t.Error("pushed although nothing changed")
	default:
	}
	n := 0
	for range slow.ch { // closed when dropped, so this ends
		n++
	}
	if n != 2 {
		t.Errorf("slow client got %d pushes before being dropped, want its buffer of 2", n)
	}
	u.mu.Lock()
	_, slowKept := u.clients[slow]
	_, fastKept := u.clients[fast]
	u.mu.Unlock()
	if slowKept || !fastKept {
		t.Errorf("clients after the drop: slow %v, fast %v; want only the fast one", slowKept, fastKept)
	}
	u.unregister(slow) // the handler's deferred unregister after a drop is harmless
	u.stop()
	if _, ok := <-fast.ch; ok {
		t.Error("stop left a client channel open")
	}
}

// Ejections are kept for at most maxReplicas replicas, like heartbeats: a
// publisher naming ever new replicas cannot grow the dashboard's memory.
func TestEjectionsAreBounded(t *testing.T) {
	u := New(nil, Config{Table: func() *table.Snapshot { return nil }})
	until := time.Now().Add(time.Hour).UnixMilli()
	for i := range maxReplicas + 10 {
		u.onEjection(&nats.Msg{Subject: "llm.eject.x", Data: fmt.Appendf(nil, `{"replica":"r%d","until_unix_ms":%d}`, i, until)})
	}
	if len(u.ejections) != maxReplicas {
		t.Fatalf("%d ejections kept, want %d", len(u.ejections), maxReplicas)
	}
	// A replica already kept is still updated.
	u.onEjection(&nats.Msg{Subject: "llm.eject.x", Data: fmt.Appendf(nil, `{"replica":"r0","until_unix_ms":%d}`, until+1)})
	if got := u.ejections["r0"].UntilUnixMs; got != until+1 {
		t.Errorf("r0 until %d, want %d", got, until+1)
	}
}
