// Package kv is the JetStream KV side of the routing table: a Watcher that
// keeps an immutable table.Snapshot of the bucket (persisting the last good
// one so a restart can route while JetStream is away), and the writes made by
// adapters and `switchyard table`.
package kv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// Where the snapshot in force came from (Watcher.Source).
const (
	SourceKV       = "kv"
	SourceStateDir = "state-dir"
)

// Defaults of Config.
const (
	DefaultInitialTimeout = 2 * time.Second
	DefaultMinRetry       = 250 * time.Millisecond
	DefaultMaxRetry       = 5 * time.Second
	DefaultCheckEvery     = 10 * time.Second
)

// errBehind ends a watch that missed what the bucket holds (see CheckEvery).
var errBehind = errors.New("the watch is behind the bucket: a message was lost on the way")

// errSwitch ends a watch of a region's copy that stopped hearing from the
// primary while the primary answers (the link is back, the copy's mirror
// not yet), or of the primary once the copy hears from it again: the next
// watch reads the fresher of the two (Watcher.open).
var errSwitch = errors.New("switching between the region's copy and the bucket")

// ErrRunning is returned by a second call to Run.
var ErrRunning = errors.New("watcher already running")

// Config configures a Watcher. Only the zero values noted have defaults.
type Config struct {
	// Bucket is the KV bucket (default subjects.DefaultBucket).
	Bucket string
	// Region, when set, is the region the watcher reads in: it reads its
	// region's copy of Bucket (CopyName, made by EnsureCopy) when the copy
	// is up to date, else Bucket while it answers (Watcher.open has the
	// rule). While the copy it reads stops hearing from Bucket
	// (CopyQuiet), Unreachable counts: the copy's table is the last good one.
	Region string
	// StateDir keeps the last good snapshot in StateDir/table.json. Empty
	// means no persistence.
	StateDir string
	// Logger receives rejected values and watch trouble (nil: discarded).
	Logger *slog.Logger
	// OnInvalid is told of every rejected value, e.g. to count it.
	OnInvalid func(key string, err error)
	// OnSnapshot is told of every published snapshot, on the watch
	// goroutine: it must return quickly.
	OnSnapshot func(*table.Snapshot)
	// InitialTimeout bounds opening the bucket and reading its initial
	// values before the persisted snapshot is used (default 2s).
	InitialTimeout time.Duration
	// MinRetry and MaxRetry bound the backoff between watch attempts
	// (defaults 250ms and 5s).
	MinRetry, MaxRetry time.Duration
	// CheckEvery is how often a watch compares the last revision it saw
	// with the bucket's (default 10s). An ordered consumer finds a lost
	// message only when the next one comes: across a NATS gateway (a
	// region's link to the bucket's), the messages sent while the link
	// was down are lost without the client's own connection dropping, so
	// without a later write the watch would keep the old table. Behind
	// at two checks in a row, the watch starts again.
	CheckEvery time.Duration
}

// epochBack is how far before New a Watcher's epoch lies (see
// Watcher.unreachable).
const epochBack = 10 * 365 * 24 * time.Hour

// copyPause is how long a region's copy that could not be read or watched
// is left alone, the bucket read instead: credentials without the region
// (switchyard auth creds --region) are refused every time, and each try
// costs a timeout and an error in the log.
const copyPause = time.Minute

// Watcher keeps the routing table of one bucket. Snapshot is safe for
// concurrent use; Run owns the watch.
type Watcher struct {
	js  jetstream.JetStream
	cfg Config
	log *slog.Logger

	snap   atomic.Pointer[table.Snapshot]
	source atomic.Pointer[string]
	since  atomic.Int64 // unix nanoseconds the snapshot in force is from
	// unreachable is since when the bucket has been out of reach, in ns
	// after epoch (at least 1), 0 while it is in reach (see Unreachable):
	// measured on the monotonic clock, which a step of the wall clock
	// leaves alone.
	unreachable atomic.Int64
	epoch       time.Time
	// copyNote is the last thing logged of the region's copy, and
	// copyPaused until when the copy is left alone (it could not be read
	// or watched); both owned by the Run goroutine.
	copyNote   string
	copyPaused time.Time
	ready      chan struct{}
	running    atomic.Bool
	readyDone  bool // owned by the Run goroutine
	stateRead  bool // owned by the Run goroutine
}

// New returns a Watcher of cfg.Bucket; call Run to start it.
func New(js jetstream.JetStream, cfg Config) *Watcher {
	if cfg.Bucket == "" {
		cfg.Bucket = subjects.DefaultBucket
	}
	if cfg.InitialTimeout <= 0 {
		cfg.InitialTimeout = DefaultInitialTimeout
	}
	if cfg.MinRetry <= 0 {
		cfg.MinRetry = DefaultMinRetry
	}
	if cfg.MaxRetry < cfg.MinRetry {
		cfg.MaxRetry = max(DefaultMaxRetry, cfg.MinRetry)
	}
	if cfg.CheckEvery <= 0 {
		cfg.CheckEvery = DefaultCheckEvery
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// The epoch lies well before any spell out of reach, so that one
	// backdated to before this process started is measured in full.
	return &Watcher{js: js, cfg: cfg, log: log.With("bucket", cfg.Bucket), ready: make(chan struct{}), epoch: time.Now().Add(-epochBack)}
}

// Snapshot is the table in force: nil until Ready is closed, never nil after.
// It must not be modified.
func (w *Watcher) Snapshot() *table.Snapshot { return w.snap.Load() }

// Ready is closed once a snapshot is in force: the bucket's initial values,
// or the persisted snapshot when the bucket could not be read in time.
func (w *Watcher) Ready() <-chan struct{} { return w.ready }

// Source says where the snapshot in force came from: SourceKV,
// SourceStateDir, or "" before Ready.
func (w *Watcher) Source() string {
	if s := w.source.Load(); s != nil {
		return *s
	}
	return ""
}

// Unreachable is how long the bucket has been out of reach, the table in
// force staying: since a watch broke, since a check of the bucket
// (CheckEvery) failed, as in a region cut off from the bucket's, or, read
// through a region's copy, since the copy last heard from the bucket; 0
// while the bucket is in reach.
func (w *Watcher) Unreachable() time.Duration {
	if n := w.unreachable.Load(); n != 0 {
		return max(time.Since(w.epoch)-time.Duration(n), time.Nanosecond)
	}
	return 0
}

// reach records that the bucket is in reach.
func (w *Watcher) reach() { w.unreachable.Store(0) }

// away records that the bucket is out of reach, for already so far: the
// first record of a spell sets its start.
func (w *Watcher) away(already time.Duration) {
	w.unreachable.CompareAndSwap(0, max(int64(time.Since(w.epoch)-already), 1))
}

// Age is how long ago the snapshot in force was built from the bucket (for a
// persisted snapshot: when it was saved). Zero before Ready.
func (w *Watcher) Age() time.Duration {
	if n := w.since.Load(); n != 0 {
		return time.Since(time.Unix(0, n))
	}
	return 0
}

// Run watches the bucket until ctx is done, then returns nil. When the bucket
// cannot be read it serves the persisted snapshot, keeps the last good one
// when a watch breaks, and retries with backoff until it can watch again.
func (w *Watcher) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	retry := w.cfg.MinRetry
	for {
		synced, err := w.watch(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if synced {
			retry = w.cfg.MinRetry
		}
		if errors.Is(err, errSwitch) {
			continue // the table in force stays until the next watch has it all
		}
		w.log.Warn("routing table watch unavailable; keeping the table in force", "err", err, "retry_in", retry)
		if !errors.Is(err, errBehind) {
			w.away(0)
		}
		w.fallBack()
		t := time.NewTimer(retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		retry = min(2*retry, w.cfg.MaxRetry)
	}
}

// update is one message of the bucket's stream, as the watch loop sees it.
type update struct {
	key     string
	value   []byte
	op      jetstream.KeyValueOp
	rev     uint64
	pending uint64 // messages still to come when this one was sent
	// open is true for a message of an atomic batch other than its commit:
	// the rest of the batch may not be stored yet, whatever pending says.
	open bool
}

// watch runs one watch of the bucket. synced reports whether it got as far
// as the initial values.
//
// It reads the bucket's stream with an ordered consumer rather than
// KeyValue.WatchAll, because it needs the batch headers: JetStream stores an
// atomic batch all or nothing, but a consumer may see its first messages
// before the last is stored, with nothing pending.
func (w *Watcher) watch(ctx context.Context) (synced bool, err error) {
	openCtx, cancel := context.WithTimeout(ctx, w.cfg.InitialTimeout)
	defer cancel()
	stream, isCopy, err := w.open(openCtx)
	if err != nil {
		return false, fmt.Errorf("opening bucket: %w", err)
	}
	// A copy keeps the primary's subjects.
	pre := subjectPrefix + w.cfg.Bucket + "."
	cons, err := stream.OrderedConsumer(openCtx, jetstream.OrderedConsumerConfig{
		FilterSubjects:   []string{pre + ">"},
		DeliverPolicy:    jetstream.DeliverLastPerSubjectPolicy,
		MaxResetAttempts: resetAttempts,
	})
	if err != nil && isCopy {
		w.pauseCopy("the region's copy of the routing table cannot be watched", err)
	}
	if err != nil {
		return false, fmt.Errorf("watching bucket: %w", err)
	}

	quit := make(chan struct{})
	updates := make(chan update, 256)
	failed := make(chan error, 1)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		u, ok := toUpdate(m, pre)
		if !ok {
			return
		}
		select {
		case updates <- u:
		case <-quit:
		}
	}, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		// The consumer recovers from lost connections and restarted
		// servers by itself; these errors come once its own retries are
		// spent, and the watch starts again from scratch.
		if gaveUp(err) {
			select {
			case failed <- err:
			default:
			}
		}
	}))
	if err != nil {
		return false, fmt.Errorf("watching bucket: %w", err)
	}
	defer func() {
		close(quit)
		cc.Stop()
		<-cc.Closed()
		// The server would drop the consumer only after minutes idle.
		if info := cons.CachedInfo(); info != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			_ = w.js.DeleteConsumer(dctx, stream.CachedInfo().Config.Name, info.Name)
			cancel()
		}
	}()
	cancel()

	initial := time.NewTimer(w.cfg.InitialTimeout)
	defer initial.Stop()
	check := time.NewTicker(w.cfg.CheckEvery)
	defer check.Stop()
	// seen is the last stream sequence the watch got, or that the bucket
	// held when it opened, once the initial values are in (a sequence
	// removed from the stream is never delivered); behindAt is the
	// bucket's last sequence at a check that found the watch behind it.
	openedAt := stream.CachedInfo().State.LastSeq
	var seen, behindAt uint64

	// The initial values are built into an empty table, so keys deleted
	// while this watcher was away disappear; a key whose value is now
	// invalid keeps its last good value (from the table in force).
	next := table.NewSnapshot()
	changed := false
	done := func() {
		seen = max(seen, openedAt)
		if q := quiet(stream.CachedInfo()); isCopy && q > 0 {
			w.away(q) // the copy's table, the bucket out of reach
		} else {
			w.reach()
		}
		synced = true
		initial.Stop()
		w.publish(next, SourceKV)
		next, changed = nil, false
	}
	if info := cons.CachedInfo(); info != nil && info.NumPending == 0 {
		done()
	}
	for {
		select {
		case <-ctx.Done():
			return synced, ctx.Err()
		case err := <-failed:
			return synced, err
		case <-initial.C:
			w.log.Warn("routing table initial values not in yet", "after", w.cfg.InitialTimeout)
			w.fallBack()
		case <-check.C:
			if !synced {
				continue
			}
			last, away, ok := w.check(ctx, stream)
			switch {
			case !ok:
				w.away(0)
			case away > 0:
				w.away(away)
			default:
				w.reach()
			}
			if w.cfg.Region != "" && ok && w.switchTo(ctx, isCopy, away > 0, seen) {
				return synced, errSwitch
			}
			switch {
			case !ok || last <= seen:
				behindAt = 0
			case behindAt != 0 && last == behindAt:
				return synced, errBehind
			default:
				behindAt = last // perhaps on its way: behind again next time, it was lost
			}
		case u := <-updates:
			seen = max(seen, u.rev)
			if next == nil {
				next = w.snap.Load().Clone()
			}
			if w.apply(next, u, !synced) {
				changed = true
			}
			// Publish only once caught up, so that keys written together
			// are seen together.
			if u.pending == 0 && !u.open && (!synced || changed) {
				done()
			}
		}
	}
}

// open is the stream the watch reads, and whether it is the region's copy:
// the copy when it mirrors the bucket, hears from it and holds the table in
// force; else the bucket, while it answers (after a cut the copy's mirror
// may take a while to start again: JetStream backs off its retries); else,
// the bucket out of reach, the copy when it holds the table in force; else
// nothing, and the table in force stays. A watch never goes back to an
// older revision than the one in force.
func (w *Watcher) open(ctx context.Context) (jetstream.Stream, bool, error) {
	var have uint64
	if s := w.snap.Load(); s != nil {
		have = s.Revision
	}
	cp := w.regionCopy(ctx)
	if cp != nil && caughtUp(cp.CachedInfo(), have) {
		return cp, true, nil
	}
	pctx, cancel := context.WithTimeout(ctx, w.cfg.InitialTimeout/2)
	p, err := w.js.Stream(pctx, streamPrefix+w.cfg.Bucket)
	cancel()
	if err == nil {
		if cp != nil {
			w.noteCopy("the region's copy of the routing table is quiet or behind; reading the bucket", nil)
		}
		return p, false, nil
	}
	if cp != nil {
		info := cp.CachedInfo()
		if info.Mirror.Active >= 0 && info.State.LastSeq >= have {
			return cp, true, nil
		}
		return nil, false, fmt.Errorf("region %s's copy is behind the table in force (revision %d of %d), and the bucket: %w",
			w.cfg.Region, info.State.LastSeq, have, err)
	}
	return nil, false, err
}

// regionCopy is the region's copy of the bucket when there is one to read:
// nil without a region, while the copy is paused (copyPause), when none was
// made, when it cannot be read, or when it does not mirror the bucket.
func (w *Watcher) regionCopy(ctx context.Context) jetstream.Stream {
	if w.cfg.Region == "" || time.Now().Before(w.copyPaused) {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, w.cfg.InitialTimeout/2)
	defer cancel()
	s, err := w.js.Stream(ctx, streamPrefix+CopyName(w.cfg.Bucket, w.cfg.Region))
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		w.noteCopy("no copy of the routing table in the region; reading the bucket (switchyard table copy makes one)", nil)
		return nil
	case err != nil:
		// Credentials without the region (switchyard auth creds
		// --region) are refused: a timeout, or a permissions error.
		w.pauseCopy("the region's copy of the routing table cannot be read", err)
		return nil
	}
	if m := s.CachedInfo().Config.Mirror; m == nil || m.Name != streamPrefix+w.cfg.Bucket {
		w.pauseCopy("the region's copy of the routing table is not a mirror of the bucket; reading the bucket", ErrNotACopy)
		return nil
	}
	w.noteCopy("routing table read from the region's copy", nil)
	return s
}

// noteCopy logs what the watcher does with the region's copy when that
// changed.
func (w *Watcher) noteCopy(what string, err error) {
	if what == w.copyNote {
		return
	}
	w.copyNote = what
	log := w.log.Info
	if err != nil {
		log = w.log.Warn
	}
	log(what, "region", w.cfg.Region, "copy", CopyName(w.cfg.Bucket, w.cfg.Region), "err", err)
}

// pauseCopy leaves the region's copy alone for copyPause.
func (w *Watcher) pauseCopy(what string, err error) {
	w.copyPaused = time.Now().Add(copyPause)
	w.noteCopy(what, err)
}

// switchTo says whether the watch should move: from a copy that is away
// (not hearing from the bucket) to the bucket when the bucket answers, or
// from the bucket to the region's copy once the copy hears from it again
// and holds what the watch has seen (a copy keeps the bucket's sequence
// numbers).
func (w *Watcher) switchTo(ctx context.Context, isCopy, away bool, seen uint64) bool {
	if isCopy {
		if !away {
			return false
		}
		ctx, cancel := context.WithTimeout(ctx, w.cfg.InitialTimeout/2)
		defer cancel()
		_, err := w.js.Stream(ctx, streamPrefix+w.cfg.Bucket)
		return err == nil
	}
	s := w.regionCopy(ctx)
	return s != nil && caughtUp(s.CachedInfo(), seen)
}

// caughtUp says whether a copy can be read in place of the bucket: it hears
// from the bucket, was not behind it when it last did, and holds sequence
// seen.
func caughtUp(info *jetstream.StreamInfo, seen uint64) bool {
	return quiet(info) == 0 && info.Mirror != nil && info.Mirror.Lag == 0 && info.State.LastSeq >= seen
}

// quiet is how long a copy's mirror has not heard from its origin when that
// is past CopyQuiet, when it reports an error, or when it never heard from
// it (then: since the copy was made); 0 otherwise, and for a stream that is
// not a copy.
func quiet(info *jetstream.StreamInfo) time.Duration {
	m := info.Mirror
	switch {
	case m == nil:
		return 0
	case m.Active < 0:
		return max(time.Since(info.Created), time.Nanosecond)
	case m.Active > CopyQuiet || m.Error != nil:
		return max(m.Active, time.Nanosecond)
	}
	return 0
}

// check reads the watched stream's last sequence; ok is false when it
// cannot be read (the bucket out of reach: nothing to compare). For a
// region's copy, away is how long the copy has not heard from the primary
// when that is past CopyQuiet, or when its mirror reports an error.
func (w *Watcher) check(ctx context.Context, stream jetstream.Stream) (last uint64, away time.Duration, ok bool) {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.InitialTimeout)
	defer cancel()
	info, err := stream.Info(ctx)
	if err != nil {
		return 0, 0, false
	}
	return info.State.LastSeq, quiet(info), true
}

// resetAttempts bounds how often the ordered consumer recreates itself
// (backing off 1s, 2s, 4s) before the watch starts over. Starting over also
// handles a bucket that was deleted and made again, whose revisions restart.
const resetAttempts = 4

// gaveUp reports the errors an ordered consumer hands over once it stops
// recreating itself.
func gaveUp(err error) bool {
	return errors.Is(err, jetstream.ErrStreamNotFound) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabled) ||
		errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, nats.ErrTimeout)
}

func toUpdate(m jetstream.Msg, pre string) (update, bool) {
	md, err := m.Metadata()
	if err != nil || len(m.Subject()) <= len(pre) {
		return update{}, false
	}
	u := update{
		key:     m.Subject()[len(pre):],
		value:   m.Data(),
		op:      jetstream.KeyValuePut,
		rev:     md.Sequence.Stream,
		pending: md.NumPending,
	}
	h := m.Headers()
	switch h.Get(hdrKVOperation) {
	case "DEL":
		u.op = jetstream.KeyValueDelete
	case "PURGE":
		u.op = jetstream.KeyValuePurge
	}
	// Markers left by per-key TTLs and limits (nats-server 2.11+).
	switch h.Get(jetstream.MarkerReasonHeader) {
	case "MaxAge", "Purge":
		u.op = jetstream.KeyValuePurge
	case "Remove":
		u.op = jetstream.KeyValueDelete
	}
	u.open = h.Get(hdrBatchID) != "" && h.Get(hdrBatchCommit) == ""
	return u, true
}

// apply puts one update into s and reports whether s changed. While the
// initial values are read into an empty table, a rejected value falls back to
// the key's value in the table in force.
func (w *Watcher) apply(s *table.Snapshot, u update, initial bool) bool {
	switch u.op {
	case jetstream.KeyValueDelete, jetstream.KeyValuePurge:
		s.Delete(u.key)
		s.Revision = max(s.Revision, u.rev)
		return true
	}
	v, err := table.Decode(u.key, u.value)
	if err != nil {
		w.log.Warn("routing table value rejected; the previous value stays in force",
			"key", u.key, "revision", u.rev, "err", err)
		if w.cfg.OnInvalid != nil {
			w.cfg.OnInvalid(u.key, err)
		}
		if prev := w.snap.Load(); initial && prev != nil {
			if raw, ok := prev.Raw[u.key]; ok {
				if pv, err := table.Decode(u.key, raw); err == nil {
					s.Set(pv, raw)
				}
			}
		}
		return false
	}
	s.Set(v, u.value)
	s.Revision = max(s.Revision, u.rev)
	return true
}

func (w *Watcher) publish(s *table.Snapshot, source string) {
	w.snap.Store(s)
	w.source.Store(&source)
	if source == SourceKV {
		w.since.Store(time.Now().UnixNano())
		if w.cfg.StateDir != "" {
			if err := saveState(w.cfg.StateDir, s); err != nil {
				w.log.Warn("could not persist the routing table", "dir", w.cfg.StateDir, "err", err)
			}
		}
	}
	w.log.Debug("routing table snapshot", "source", source, "revision", s.Revision, "keys", len(s.Raw))
	if w.cfg.OnSnapshot != nil {
		w.cfg.OnSnapshot(s)
	}
	if !w.readyDone {
		w.readyDone = true
		close(w.ready)
	}
}

// fallBack serves the persisted snapshot when nothing is in force yet.
func (w *Watcher) fallBack() {
	if w.readyDone || w.stateRead || w.cfg.StateDir == "" {
		return
	}
	w.stateRead = true
	s, saved, err := loadState(w.cfg.StateDir, w.log)
	if err != nil {
		w.log.Warn("no persisted routing table; waiting for the bucket", "dir", w.cfg.StateDir, "err", err)
		return
	}
	w.since.Store(saved.UnixNano())
	w.log.Warn("serving the persisted routing table until the bucket can be read",
		"revision", s.Revision, "saved", saved)
	w.publish(s, SourceStateDir)
}
