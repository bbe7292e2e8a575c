package adapter

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/features"
	"github.com/switchyard-llm/switchyard/internal/jsonscan"
	"github.com/switchyard-llm/switchyard/internal/kvevents"
	"github.com/switchyard-llm/switchyard/subjects"
)

// The KV-event feed (docs/architecture.md, "Prefix knowledge from the
// engines"). Brokers match requests on the gateway's text-block keys
// (Llm-Prefix) and see no tokens; the engine tells which token blocks it
// caches. The adapter joins the two for the requests it serves: it asks
// its engine for a request's token ids (/tokenize, off the request's
// path), chains a hash of its own over each block of them, and names the
// engine block that ends each text block. A BlockStored whose tokens chain
// to that hash stores the text key; the BlockRemoved that takes the block's
// reference count to zero evicts it. Brokers hear both on
// llm.kv.<replica>.

// kvFeed is what the adapter knows of its engine's cache. Lock: mu.
type kvFeed struct {
	a   *Adapter
	cfg kvevents.SubscriberConfig
	// sub is the engine's feed, opened by open (Adapter.Run): a feed that
	// is built but never run holds no socket. addr is its address once
	// open (the bound one with --kv-events-bind), read by KVEventsAddr.
	sub  *kvevents.Subscriber
	addr atomic.Value // string

	learnCh chan learnReq
	// learnBytes is what the requests in learnCh hold (learnReq.size),
	// bounded by learnQueueBytes.
	learnBytes atomic.Int64

	mu        sync.Mutex
	blockSize int
	blocks    map[kvevents.Hash]*engineBlock
	byChain   map[uint64]kvevents.Hash // own chain hash → engine hash, for stored blocks
	texts     map[uint64][]uint64      // own chain hash → the text keys its block ends
	keyRef    map[uint64]int           // text key → stored engine blocks that end it
	pending   map[uint64]bool          // text key → stored (true) or evicted, to publish
	reset     bool                     // the next update voids what brokers hold
	resend    bool                     // the reset only answers a decider's ask: nothing was lost
	live      bool                     // no loss since the last reset
	seq       uint64
	blockC    int // the text block size last found
	// The last resend a decider asked for (llm.kvsync), and whether an ask
	// since waits for the next one (askedToResend).
	resentAt  time.Time
	resendDue bool
	// refused is why the engine's last refused message was refused, and
	// refusedAt when: the feed is failing until kvRefusedHold passes
	// without a refusal, however many messages decode meanwhile (a feed
	// whose stores are refused and whose removals decode is failing all
	// the same). warned holds the reasons already logged, once each.
	refused   string
	refusedAt time.Time
	warned    map[string]bool
	// orphans counts the BlockStored events in a row left out for a parent
	// the adapter never saw; at kvOrphanWarn it warns, once per adapter
	// run (orphanWarned).
	orphans      int
	orphanWarned bool
}

type engineBlock struct {
	ref   int
	chain uint64
}

// learnReq is a request served, queued to be learned: only what learning
// reads of it, never the whole body.
type learnReq struct {
	endpoint string
	keys     []uint64
	// source is the request's token source: the raw JSON value of its
	// messages (chat) or prompt (completions), from which both the
	// gateway's canonical prompt and the engine's token ids derive.
	source []byte
}

// size is what r holds, counted against learnQueueBytes.
func (r *learnReq) size() int64 { return int64(len(r.source) + 8*len(r.keys) + learnReqOverhead) }

// Bounds of what the feed remembers: texts holds the text keys of blocks
// learned from requests, stored or about to be; the learn queue holds at
// most learnQueue requests and learnQueueBytes of them.
const (
	maxTexts         = 1 << 20
	maxTextsBlock    = 64
	learnQueue       = 256
	learnQueueBytes  = 16 << 20
	learnReqOverhead = 64
	flushEvery       = 20 * time.Millisecond
)

// kvResendEvery is the least time between two resends asked for on
// llm.kvsync. A resend is every key the engine holds; each decider and
// dashboard asks at most once a second, but there may be many, and any
// identity that may publish the subject could ask in a loop. Asks within
// one interval share one resend: made at once when none was made in the
// interval before, else at its end. A decider that starts late still has
// the full index within kvResendEvery and a flush (flushEvery), inside
// the 2 s docs/protocol.md ("KV-cache events") promises.
const kvResendEvery = time.Second

// kvRefusedHold is how long a refusal marks the feed as failing
// (kv_events_refused): ten heartbeats, so a feed refused every few seconds
// never looks healthy between its refusals.
const kvRefusedHold = 10 * time.Second

// kvOrphanWarn is how many BlockStored events in a row may be left out for
// an unknown parent before the adapter warns that the feed chains nothing:
// a few after a start or a loss are normal, a hundred in a row are an
// engine whose parent hashes the adapter cannot follow.
const kvOrphanWarn = 100

// Outcomes of an ask to resend (switchyard_adapter_kv_sync_requests_total).
const (
	kvSyncResent    = "resent"    // it made a resend, at once or at the interval's end
	kvSyncCoalesced = "coalesced" // a resend already due answers it
)

func newKVFeed(a *Adapter) *kvFeed {
	cfg := kvevents.SubscriberConfig{Endpoint: a.cfg.KVEvents, Topic: a.cfg.KVEventsTopic, Replay: a.cfg.KVEventsReplay}
	if a.cfg.KVEventsBind != "" {
		cfg.Endpoint, cfg.Bind = a.cfg.KVEventsBind, true
	}
	f := &kvFeed{a: a, cfg: cfg, learnCh: make(chan learnReq, learnQueue)}
	f.clearLocked()
	return f
}

// open opens the feed's socket (with --kv-events-bind, it listens at
// once, so a taken address fails the adapter's start); run then reads it.
func (f *kvFeed) open() error {
	sub, err := kvevents.NewSubscriber(f.cfg)
	if err != nil {
		return err
	}
	f.sub = sub
	f.addr.Store(sub.Addr())
	return nil
}

// close closes a feed that was opened and will not be run.
func (f *kvFeed) close() {
	if f.sub != nil {
		f.sub.Close()
	}
}

// run reads the engine's events, learns requests and publishes updates
// until ctx ends. open must have succeeded.
func (f *kvFeed) run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := f.sub.Run(ctx, f); err != nil {
			f.a.log.Warn("KV-event feed stopped", "err", err)
		}
	})
	wg.Go(func() { f.learnLoop(ctx) })
	sub, err := f.a.nc.Subscribe(f.a.subj.KVSync(), func(*nats.Msg) { f.askedToResend(time.Now()) })
	if err != nil {
		f.a.log.Warn("KV sync requests not heard", "err", err)
	}
	t := time.NewTicker(flushEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if sub != nil {
				_ = sub.Unsubscribe()
			}
			wg.Wait()
			return
		case now := <-t.C:
			f.resendIfDue(now)
		}
		f.flush()
	}
}

// askedToResend answers a decider's ask to resend (llm.kvsync): at once
// when no resend was made within kvResendEvery, else with the resend due
// at the interval's end, which every ask until then shares.
func (f *kvFeed) askedToResend(now time.Time) {
	f.a.metrics.kvSyncs.WithLabelValues(f.resendSoon(now)).Inc()
}

// resendSoon makes a resend at once, or shares the one due at the interval's
// end, as askedToResend, and says which (kvSyncResent or kvSyncCoalesced).
// The adapter resends on its own after a reconnect.
func (f *kvFeed) resendSoon(now time.Time) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.resendDue:
		return kvSyncCoalesced
	case now.Sub(f.resentAt) >= kvResendEvery:
		f.resyncLocked()
		f.resentAt = now
	default:
		f.resendDue = true
	}
	return kvSyncResent
}

// resendIfDue makes the resend asks wait for once its interval is over.
func (f *kvFeed) resendIfDue(now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.resendDue && now.Sub(f.resentAt) >= kvResendEvery {
		f.resyncLocked()
		f.resentAt, f.resendDue = now, false
	}
}

// clearLocked forgets everything and makes the next update a reset.
// mu should be held.
func (f *kvFeed) clearLocked() {
	f.blocks = map[kvevents.Hash]*engineBlock{}
	f.byChain = map[uint64]kvevents.Hash{}
	f.texts = map[uint64][]uint64{}
	f.keyRef = map[uint64]int{}
	f.pending = map[uint64]bool{}
	f.reset, f.resend = true, false
}

// resyncLocked makes the next update a reset carrying every held key, and
// the evictions not yet sent: a resend, unless a true reset is pending.
// mu should be held.
func (f *kvFeed) resyncLocked() {
	pending := make(map[uint64]bool, len(f.keyRef))
	if !f.reset {
		for k, stored := range f.pending {
			if !stored {
				pending[k] = false
			}
		}
		f.resend = true
	}
	for k := range f.keyRef {
		pending[k] = true
	}
	f.pending, f.reset = pending, true
}

// Batch applies one batch of the engine's events (kvevents.Sink).
func (f *kvFeed) Batch(_ uint64, b *kvevents.Batch, unknown int) {
	m := f.a.metrics
	if unknown > 0 {
		m.kvEvents.WithLabelValues("unknown", "").Add(float64(unknown))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range b.Events {
		ev := &b.Events[i]
		reason := ""
		switch ev.Kind {
		case kvevents.BlockStored:
			if f.storedLocked(ev) {
				f.orphans = 0
			} else {
				reason = kvUnknownParent
				if f.orphans++; f.orphans == kvOrphanWarn && !f.orphanWarned {
					f.orphanWarned = true
					f.a.log.Warn("KV-event feed chains nothing: BlockStored events in a row name parents this adapter never saw; prefix affinity works from placements",
						"events", kvOrphanWarn)
				}
			}
		case kvevents.BlockRemoved:
			for _, h := range ev.Hashes {
				f.removedLocked(h)
			}
		case kvevents.AllBlocksCleared:
			f.clearLocked()
		}
		m.kvEvents.WithLabelValues(ev.Kind.String(), reason).Inc()
	}
	f.live = true
}

// Lost voids what brokers hold of the replica (kvevents.Sink).
func (f *kvFeed) Lost(reason string) {
	f.a.log.Warn("KV-cache events lost: the replica's keys are dropped from every broker", "reason", reason)
	f.mu.Lock()
	f.clearLocked()
	f.mu.Unlock()
}

// Gap counts a sequence gap (kvevents.Sink).
func (f *kvFeed) Gap() { f.a.metrics.kvGaps.Inc() }

// Malformed counts a refused message by its reason, marks the feed as
// failing for kvRefusedHold (the heartbeat's kv_events_refused),
// and warns once per reason: a feed whose every message is refused leaves
// prefix affinity on placements, which nothing else would show
// (kvevents.Sink).
func (f *kvFeed) Malformed(err error) {
	reason := kvevents.Refusal(err)
	f.a.metrics.kvEvents.WithLabelValues("malformed", reason).Inc()
	f.mu.Lock()
	f.refused, f.refusedAt = reason, time.Now()
	first := !f.warned[reason]
	if first {
		if f.warned == nil {
			f.warned = map[string]bool{}
		}
		f.warned[reason] = true
	}
	f.mu.Unlock()
	if first {
		f.a.log.Warn("KV-event message refused: until the engine's events are read, prefix affinity works from placements",
			"reason", reason, "err", err)
	} else {
		f.a.log.Debug("KV-event message refused", "reason", reason, "err", err)
	}
}

// chainHash is the adapter's own hash of a token block after parent: the
// engine hashes with a seed of its own, so the adapter keys blocks by this.
func chainHash(parent uint64, tokens []uint32) uint64 {
	var d xxhash.Digest
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], parent)
	_, _ = d.Write(b[:])
	for _, t := range tokens {
		binary.LittleEndian.PutUint32(b[:4], t)
		_, _ = d.Write(b[:4])
	}
	return d.Sum64()
}

// kvUnknownParent is the reason label of a BlockStored left out because
// its parent is a block the adapter has not seen (one stored before the
// feed was read, or lost with a gap): normal after a start or a loss, and
// counted so that a feed whose every chain is left out shows.
const kvUnknownParent = "unknown_parent"

// storedLocked records a BlockStored and reports whether it could. Blocks
// whose parent the adapter has not seen cannot be chained and are left
// out. A parent hash of 0 that names no block is a chain's start: vLLM
// sends nil there, but llm-d's vLLM simulator sends 0 in the array
// encoding (and llm-d's router reads 0 as no parent). mu should be held.
func (f *kvFeed) storedLocked(ev *kvevents.Event) bool {
	f.blockSize = ev.BlockSize
	var chain uint64
	if ev.HasParent {
		p := f.blocks[ev.Parent]
		switch {
		case p != nil:
			chain = p.chain
		case ev.Parent != 0:
			return false
		}
	}
	for i, h := range ev.Hashes {
		chain = chainHash(chain, ev.TokenIDs[i*ev.BlockSize:(i+1)*ev.BlockSize])
		if b := f.blocks[h]; b != nil {
			b.ref++ // the same block stored again: a removal counts down
			continue
		}
		f.blocks[h] = &engineBlock{ref: 1, chain: chain}
		f.byChain[chain] = h
		for _, k := range f.texts[chain] {
			f.holdLocked(k)
		}
	}
	return true
}

// removedLocked records a BlockRemoved of h. mu should be held.
func (f *kvFeed) removedLocked(h kvevents.Hash) {
	b := f.blocks[h]
	if b == nil {
		return
	}
	if b.ref--; b.ref > 0 {
		return
	}
	delete(f.blocks, h)
	delete(f.byChain, b.chain)
	for _, k := range f.texts[b.chain] {
		f.releaseLocked(k)
	}
	// The text keys the block ended stay known: a request learned while
	// the block was stored may be waiting in the engine's queue, and
	// stores it again when it runs. pruneTextsLocked bounds them.
}

func (f *kvFeed) holdLocked(k uint64) {
	if f.keyRef[k]++; f.keyRef[k] == 1 {
		f.pending[k] = true
	}
}

func (f *kvFeed) releaseLocked(k uint64) {
	if f.keyRef[k]--; f.keyRef[k] <= 0 {
		delete(f.keyRef, k)
		f.pending[k] = false
	}
}

// learn queues a request served, to be matched with its engine blocks off
// its path. It keeps only the request's token source; a queue full in
// count or bytes drops the request (counted: the next request with the
// same prefix teaches the same).
func (f *kvFeed) learn(endpoint, prefix string, body []byte) {
	if prefix == "" || (endpoint != subjects.EndpointChat && endpoint != subjects.EndpointCompletions) {
		return
	}
	src := tokenSource(endpoint, body)
	if src == nil {
		return
	}
	keys, err := features.ParsePrefixHeader(nil, prefix)
	if err != nil || len(keys) == 0 {
		return
	}
	r := learnReq{endpoint: endpoint, keys: keys, source: src}
	n := r.size()
	if f.learnBytes.Add(n) > learnQueueBytes {
		f.learnBytes.Add(-n)
		f.a.metrics.kvLearnDropped.Inc()
		return
	}
	r.source = bytes.Clone(src) // the body's buffer is not kept
	select {
	case f.learnCh <- r:
	default:
		f.learnBytes.Add(-n)
		f.a.metrics.kvLearnDropped.Inc()
	}
}

// tokenSource is the raw value of body's top-level messages (chat) or
// prompt (completions) member, the last of duplicates as encoding/json
// keeps, or nil. It only skips over the other members.
func tokenSource(endpoint string, body []byte) []byte {
	name := "messages"
	if endpoint == subjects.EndpointCompletions {
		name = "prompt"
	}
	var src []byte
	m := jsonscan.NewMembers(body, jsonscan.SkipSpace(body, 0))
	for m.Next() {
		if m.Key().EqualFold(name) {
			src = m.Value()
		}
	}
	if m.End() < 0 || len(src) == 0 || string(src) == "null" {
		return nil
	}
	return src
}

func (f *kvFeed) learnLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-f.learnCh:
			f.learnBytes.Add(-r.size())
			if err := f.learnOne(ctx, r); err != nil {
				f.a.log.Debug("request not matched to its engine blocks", "err", err)
			}
		}
	}
}

// learnOne matches one request's text keys to its engine blocks. Text key
// i covers the first (i+1)·C characters of the canonical prompt; the
// engine block that ends it is the one holding the same share of the
// engine's tokens, rounded up (a key is reported held only once the block
// covering all of its text is).
func (f *kvFeed) learnOne(ctx context.Context, r learnReq) error {
	body := r.body(f.a.cfg.EngineModel)
	req, err := features.ParseRequest(r.endpoint, body)
	if err != nil {
		return err
	}
	prompt := req.Prompt
	c := f.blockChars(prompt, r.keys)
	if c == 0 {
		return fmt.Errorf("the Llm-Prefix does not match the prompt")
	}
	tokens, err := f.tokenize(ctx, body)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	bs := f.blockSize
	if bs == 0 {
		// No event has named it yet (the replica's first request): the
		// block size the engine's metrics declare, so this request's keys
		// are learned before its blocks are reported stored.
		bs = f.a.engineBlockSize()
	}
	if bs == 0 || len(tokens) < bs {
		return nil
	}
	full := len(tokens) / bs
	chains := make([]uint64, full)
	var chain uint64
	for j := range full {
		chain = chainHash(chain, tokens[j*bs:(j+1)*bs])
		chains[j] = chain
	}
	L, T := len(prompt), len(tokens)
	for i, k := range r.keys {
		t := ((i+1)*c*T + L - 1) / L // tokens the text up to key i needs
		j := (t+bs-1)/bs - 1
		if j >= full {
			break
		}
		ch := chains[j]
		ts := f.texts[ch]
		if len(ts) >= maxTextsBlock || containsKey(ts, k) {
			continue
		}
		if len(f.texts) >= maxTexts {
			f.pruneTextsLocked()
		}
		f.texts[ch] = append(ts, k)
		if _, stored := f.byChain[ch]; stored {
			f.holdLocked(k)
		}
	}
	return nil
}

func containsKey(ks []uint64, k uint64) bool {
	for _, x := range ks {
		if x == k {
			return true
		}
	}
	return false
}

// pruneTextsLocked forgets the text keys of blocks the engine does not
// hold. mu should be held.
func (f *kvFeed) pruneTextsLocked() {
	for ch := range f.texts {
		if _, ok := f.byChain[ch]; !ok {
			delete(f.texts, ch)
		}
	}
}

// blockChars finds the prefix_block_chars the gateway cut the prompt
// with: the C whose first block hashes to the first key, near len/keys
// (the keys are min(len/C, max) blocks). 0 when none matches.
func (f *kvFeed) blockChars(prompt []byte, keys []uint64) int {
	f.mu.Lock()
	c := f.blockC
	f.mu.Unlock()
	ok := func(c int) bool {
		return c > 0 && c <= len(prompt) && len(prompt)/c >= len(keys) && xxhash.Sum64(prompt[:c]) == keys[0]
	}
	if ok(c) {
		return c
	}
	hi := len(prompt) / len(keys)
	lo := max(16, len(prompt)/(len(keys)+1))
	for c := hi; c >= lo; c-- {
		if ok(c) {
			f.mu.Lock()
			f.blockC = c
			f.mu.Unlock()
			return c
		}
	}
	return 0
}

// body is a request body for model holding only r's token source: what
// the gateway's canonical prompt and the engine's /tokenize read (vLLM's
// /tokenize takes the chat messages or the completions prompt).
func (r *learnReq) body(model string) []byte {
	m, _ := json.Marshal(model) // a string always marshals
	name := `,"messages":`
	if r.endpoint == subjects.EndpointCompletions {
		name = `,"prompt":`
	}
	b := make([]byte, 0, len(m)+len(name)+len(r.source)+12)
	b = append(append(append(b, `{"model":`...), m...), name...)
	return append(append(b, r.source...), '}')
}

// tokenize asks the engine for the token ids of body, a learnReq.body.
func (f *kvFeed) tokenize(ctx context.Context, b []byte) ([]uint32, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, f.a.cfg.EngineURL+"/tokenize", bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	hr.Header.Set("Content-Type", "application/json")
	if f.a.cfg.EngineAPIKey != "" {
		hr.Header.Set("Authorization", "Bearer "+f.a.cfg.EngineAPIKey)
	}
	resp, err := f.a.engine.client.Do(hr)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/tokenize: %s", resp.Status)
	}
	var tr struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(nil, resp.Body, 16<<20)).Decode(&tr); err != nil {
		return nil, err
	}
	return tr.Tokens, nil
}

// flush publishes what changed since the last flush, in updates of at most
// MaxKVUpdateKeys keys.
func (f *kvFeed) flush() {
	f.mu.Lock()
	if len(f.pending) == 0 && !f.reset {
		f.mu.Unlock()
		return
	}
	kvBlocks := f.a.kvBlocks()
	if kvBlocks == 0 {
		f.mu.Unlock()
		return // brokers bound a replica by its capacity: wait to know it
	}
	var updates []subjects.KVUpdate
	u := subjects.KVUpdate{Replica: f.a.cfg.Replica, Model: f.a.cfg.Model, Reset: f.reset, Resend: f.resend, KVBlocks: kvBlocks}
	for k, stored := range f.pending {
		if stored {
			u.Stored = append(u.Stored, k)
		} else if !f.reset || f.resend {
			u.Evicted = append(u.Evicted, k)
		}
		if len(u.Stored)+len(u.Evicted) == subjects.MaxKVUpdateKeys {
			updates = append(updates, u)
			u = subjects.KVUpdate{Replica: f.a.cfg.Replica, Model: f.a.cfg.Model, KVBlocks: kvBlocks}
		}
	}
	updates = append(updates, u)
	for i := range updates {
		f.seq++
		updates[i].Seq = f.seq
	}
	f.pending = map[uint64]bool{}
	f.reset, f.resend = false, false
	f.mu.Unlock()
	for i := range updates {
		b, err := json.Marshal(&updates[i])
		if err == nil {
			err = f.a.nc.Publish(f.a.subj.KV(f.a.cfg.Replica), b)
		}
		if err != nil {
			f.a.log.Warn("KV-cache update not sent", "err", err)
			f.mu.Lock()
			f.resyncLocked()
			f.mu.Unlock()
			return
		}
	}
}

// state is the feed's part of the heartbeat: live, it has heard its
// engine since its last loss (kv_events); refused, why the engine's last
// refused message was refused, while that was within kvRefusedHold
// (kv_events_refused).
func (f *kvFeed) state() (live bool, refused string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if time.Since(f.refusedAt) < kvRefusedHold {
		refused = f.refused
	}
	return f.live && !f.reset, refused
}
