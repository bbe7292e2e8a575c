package lab

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"slices"
	"time"
)

// ConversationTrace is a trace in Mooncake's format with the shape of
// its conversation trace: conversations opening with one of a few shared
// system prompts, each turn's prompt the previous one plus its answer and a
// new message (60% of the requests continue a conversation drawn at
// random), Poisson arrivals 300 ms apart on average. The same n and seed
// give the same trace.
func ConversationTrace(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, 47))
	type conv struct {
		ids    []uint64
		tokens int
	}
	next := uint64(100)
	var convs []*conv
	var b bytes.Buffer
	var at time.Duration
	for range n {
		at += time.Duration(rng.ExpFloat64() * float64(300*time.Millisecond))
		var c *conv
		if len(convs) > 0 && rng.Float64() < 0.6 {
			c = convs[rng.IntN(len(convs))]
			c.tokens += 200 + rng.IntN(1500)
		} else {
			sys := uint64(rng.IntN(4)) // 4 system prompts of 2 blocks each
			c = &conv{ids: []uint64{sys * 2, sys*2 + 1}, tokens: 1024 + 300 + rng.IntN(2000)}
			convs = append(convs, c)
		}
		for len(c.ids) < (c.tokens+511)/512 {
			c.ids = append(c.ids, next)
			next++
		}
		// The last block is partial: the next turn extends it, a new id.
		ids := slices.Clone(c.ids)
		if c.tokens%512 != 0 {
			c.ids = c.ids[:len(c.ids)-1]
		}
		line, _ := json.Marshal(map[string]any{"timestamp": at.Milliseconds(), "input_length": c.tokens, "output_length": 50 + rng.IntN(300), "hash_ids": ids})
		b.Write(line)
		b.WriteByte('\n')
	}
	return b.Bytes()
}
