package enginesim

import "container/list"

// kvCache does the block arithmetic and keeps the prefix cache: an LRU over
// chained block hashes. A hash stands for its whole chain, so a lookup walks
// the request's hashes in order and stops at the first miss, exactly like
// vLLM's automatic prefix caching. Adapters change the KV values, so the
// adapter name is part of the key.
type kvCache struct {
	blockTokens int
	capacity    int
	lru         *list.List // of prefixKey, most recent first
	index       map[prefixKey]*list.Element
}

type prefixKey struct {
	lora string
	hash uint64
}

func newKVCache(blockTokens, prefixBlocks int) kvCache {
	return kvCache{
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
// recently used blocks beyond capacity.
func (c *kvCache) insert(lora string, prefix []uint64, promptTokens int) {
	if c.capacity == 0 {
		return
	}
	prefix = c.usable(prefix, promptTokens)
	for i := len(prefix) - 1; i >= 0; i-- { // tail first, as in lookup
		k := prefixKey{lora, prefix[i]}
		if el, ok := c.index[k]; ok {
			c.lru.MoveToFront(el)
			continue
		}
		c.index[k] = c.lru.PushFront(k)
		for c.lru.Len() > c.capacity {
			old := c.lru.Back()
			delete(c.index, old.Value.(prefixKey))
			c.lru.Remove(old)
		}
	}
}

// cachedBlocks is the number of block hashes held.
func (c *kvCache) cachedBlocks() int { return c.lru.Len() }
