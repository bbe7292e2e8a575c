package enginesim_test

import (
	"fmt"
	"time"

	"github.com/switchyard-llm/switchyard/enginesim"
)

// A discrete-event driver: jump the clock to the engine's next event, take
// the events, repeat until the engine is idle.
func ExampleEngine() {
	e := enginesim.New(enginesim.Config{Model: "sim-model", PrefillPerToken: -1})
	start := time.Unix(0, 0)
	id, _ := e.Submit(enginesim.Request{PromptTokens: 32, MaxTokens: 3}, start)
	for {
		next, ok := e.NextEvent()
		if !ok {
			break
		}
		for _, ev := range e.Advance(next) {
			fmt.Println(ev.ID == id, ev.Kind, ev.Tokens, ev.At.Sub(start))
		}
	}
	fmt.Printf("kv %.0f%%, running %d\n", e.Stats().KVUsage*100, e.Stats().Running)
	// Output:
	// true first_token 1 30ms
	// true token 2 35ms
	// true token 3 40ms
	// true finish 3 40ms
	// kv 0%, running 0
}
