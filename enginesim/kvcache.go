package enginesim

import (
	"container/list"

	"github.com/switchyard-llm/switchyard/internal/kvevents"
)

// kvCache does the block arithmetic and keeps the prefix cache: an LRU over
// chained block hashes. A hash stands for its whole chain, so a lookup walks
// the request's hashes in order and stops at the first miss, exactly like
// vLLM's automatic prefix caching. Adapters change the KV values, so the
// adapter name is part of the key.
//
// With events on, every block that enters or leaves the cache is told as
// vLLM tells it (BlockStored with the blocks' token ids and the parent of
// the first, BlockRemoved), for the engine's KV-event feed.
type kvCache struct {
	blockTokens int
	capacity    int
	lru         *list.List // of prefixKey, most recent first
	index       map[prefixKey]*list.Element

	events   bool
	pending  []kvevents.Event
	newBlock []bool // scratch of insert
}

type prefixKey struct {
	lora string
	hash uint64
}

func newKVCache(blockTokens, prefixBlocks int, events bool) kvCache {
	return kvCache{
		events:      events,
		blockTokens: blockTokens,
		capacity:    prefixBlocks,
		lru:         list.New(),
		index:       make(map[prefixKey]*list.Element),
	}
}

// blocksFor is the number of blocks that hold n tokens.
func (c *kvCache) blocksFor(n int) int {
	return (n + c.blockTokens - 1) / c.blockTokens
}

// usable is how many of the prefix hashes describe full blocks of the
// prompt: a longer list than the prompt holds is cut.
func (c *kvCache) usable(prefix []uint64, promptTokens int) []uint64 {
	if n := promptTokens / c.blockTokens; len(prefix) > n {
		return prefix[:n]
	}
	return prefix
}

// lookup returns how many prompt tokens the cache serves. At least one
// prompt token is always computed, since the first output token needs it.
func (c *kvCache) lookup(lora string, prefix []uint64, promptTokens int) int {
	if c.capacity == 0 {
		return 0
	}
	prefix = c.usable(prefix, promptTokens)
	hit := c.hits(lora, prefix)
	// Touch the chain from its tail so that its head is the most recent:
	// eviction then takes tails first and never strands a chain's tail
	// behind an evicted head.
	for i := hit - 1; i >= 0; i-- {
		c.lru.MoveToFront(c.index[prefixKey{lora, prefix[i]}])
	}
	return min(hit*c.blockTokens, promptTokens-1)
}

// hits is the number of leading blocks of prefix the cache holds.
func (c *kvCache) hits(lora string, prefix []uint64) int {
	hit := 0
	for hit < len(prefix) {
		if _, ok := c.index[prefixKey{lora, prefix[hit]}]; !ok {
			break
		}
		hit++
	}
	return hit
}

// peek is lookup without touching the LRU order: what a request would find
// in the cache now.
func (c *kvCache) peek(lora string, prefix []uint64, promptTokens int) int {
	if c.capacity == 0 {
		return 0
	}
	hit := c.hits(lora, c.usable(prefix, promptTokens))
	return min(hit*c.blockTokens, promptTokens-1)
}

// insert records the prompt's blocks as computed, evicting the least
// recently used blocks beyond capacity. tokens are the prompt's token ids,
// told in the BlockStored events (nil: ids made up from the block hashes).
func (c *kvCache) insert(lora string, prefix []uint64, tokens []uint32, promptTokens int) {
	if c.capacity == 0 {
		return
	}
	prefix = c.usable(prefix, promptTokens)
	if c.events {
		c.tellStored(lora, prefix, tokens)
	}
	for i := len(prefix) - 1; i >= 0; i-- { // tail first, as in lookup
		k := prefixKey{lora, prefix[i]}
		if el, ok := c.index[k]; ok {
			c.lru.MoveToFront(el)
			continue
		}
		c.index[k] = c.lru.PushFront(k)
		for c.lru.Len() > c.capacity {
			old := c.lru.Back()
			k := old.Value.(prefixKey)
			delete(c.index, k)
			c.lru.Remove(old)
			if c.events {
				c.pending = append(c.pending, kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: []kvevents.Hash{kvevents.Hash(k.hash)}, Medium: "GPU"})
			}
		}
	}
}

// tellStored queues a BlockStored for each run of the chain's blocks that
// the cache does not hold yet, before insert evicts anything: a consumer
// then sees a block stored before it is removed.
func (c *kvCache) tellStored(lora string, prefix []uint64, tokens []uint32) {
	c.newBlock = c.newBlock[:0]
	for _, h := range prefix {
		_, ok := c.index[prefixKey{lora, h}]
		c.newBlock = append(c.newBlock, !ok)
	}
	for i := 0; i < len(prefix); {
		if !c.newBlock[i] {
			i++
			continue
		}
		j := i
		for j < len(prefix) && c.newBlock[j] {
			j++
		}
		ev := kvevents.Event{Kind: kvevents.BlockStored, BlockSize: c.blockTokens, Medium: "GPU", LoraName: lora}
		if i > 0 {
			ev.Parent, ev.HasParent = kvevents.Hash(prefix[i-1]), true
		}
		for k := i; k < j; k++ {
			ev.Hashes = append(ev.Hashes, kvevents.Hash(prefix[k]))
			ev.TokenIDs = c.appendBlockTokens(ev.TokenIDs, tokens, k, prefix[k])
		}
		c.pending = append(c.pending, ev)
		i = j
	}
}

// appendBlockTokens appends block k's token ids: from tokens when they
// cover it, else made up from its hash (the lab's prompts have no text).
func (c *kvCache) appendBlockTokens(dst, tokens []uint32, k int, h uint64) []uint32 {
	if (k+1)*c.blockTokens <= len(tokens) {
		return append(dst, tokens[k*c.blockTokens:(k+1)*c.blockTokens]...)
	}
	for t := range c.blockTokens {
		h = h*6364136223846793005 + 1442695040888963407 + uint64(t)
		dst = append(dst, uint32(h>>33)&kvevents.MaxTokenID)
	}
	return dst
}

// takeEvents appends the events queued since the last call to dst.
func (c *kvCache) takeEvents(dst []kvevents.Event) []kvevents.Event {
	dst = append(dst, c.pending...)
	clear(c.pending)
	c.pending = c.pending[:0]
	return dst
}

// cachedBlocks is the number of block hashes held.
func (c *kvCache) cachedBlocks() int { return c.lru.Len() }
