package batch

import (
	"bytes"
	"context"
	"encoding/json"
	"sort"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/subjects"
)

// Codes of the error-file lines Switchyard writes itself.
const (
	CodeBatchExpired = "batch_expired"
	CodeItemLost     = "batch_item_lost"
)

// finish finalizes rec into ending (completed, expired or cancelled): the
// items left are dropped, the output and error files assembled from the
// results bucket in line order, and the record closed. Only the batcher
// holding the claim does it; one that dies midway leaves the claim to go
// stale, and another does it again from the same results.
func (b *Batcher) finish(ctx context.Context, rec *Record, ending string) {
	if ending == "" {
		ending = StatusCompleted
	}
	if ending == StatusCompleted && rec.Status == StatusInProgress {
		// The items stream says none is left: believed only when every
		// line has its result. Stream information read during a leader
		// change can say none is left of items that are there; the
		// batch goes on, and is finalized at the next pass that finds
		// every result (or expires at its window if items were truly
		// lost), never completed with lines it did not run.
		results, err := b.collect(ctx, rec.ID)
		if err != nil {
			b.log.Warn("finalize: read results", "batch", rec.ID, "err", err)
			return
		}
		if len(results) < rec.RequestCounts.Total {
			b.log.Warn("no item left in the stream, but lines lack their results: not finalized yet",
				"batch", rec.ID, "results", len(results), "lines", rec.RequestCounts.Total)
			return
		}
	}
	now := b.cfg.Now()
	rec = b.claim(ctx, rec, func(r *Record) error {
		r.Ending = ending
		if r.Status != StatusCancelling {
			r.Status = StatusFinalizing
			if r.FinalizingAt == nil {
				r.FinalizingAt = unixPtr(now)
			}
		}
		return nil
	})
	if rec == nil {
		return
	}
	subject := b.subj.BatchItems(rec.Tenant, rec.ID)
	if ending != StatusCompleted {
		if err := b.items.Purge(ctx, jetstream.WithPurgeSubject(subject)); err != nil {
			b.log.Warn("finalize: drop the items left", "batch", rec.ID, "err", err)
			return
		}
	}
	results, err := b.collect(ctx, rec.ID)
	if err != nil {
		b.log.Warn("finalize: read results", "batch", rec.ID, "err", err)
		return
	}
	var out, errs bytes.Buffer
	var completed, failed int
	write := func(v []byte) {
		if v[0] == kindOutput {
			completed++
			out.Write(v[1:])
			out.WriteByte('\n')
		} else {
			failed++
			errs.Write(v[1:])
			errs.WriteByte('\n')
		}
	}
	if ending == StatusCancelled || len(results) >= rec.RequestCounts.Total {
		lines := make([]int, 0, len(results))
		for n := range results {
			lines = append(lines, n)
		}
		sort.Ints(lines)
		for _, n := range lines {
			write(results[n])
		}
	} else if err := b.withMissing(ctx, rec, ending, results, write); err != nil {
		b.log.Warn("finalize: read the input", "batch", rec.ID, "err", err)
		return
	}
	var outID, errID *string
	if out.Len() > 0 {
		f, err := b.store.PutFile(ctx, rec.Tenant, rec.ID+"_output.jsonl", PurposeBatchOutput, &out)
		if err != nil {
			b.log.Warn("finalize: output file", "batch", rec.ID, "err", err)
			return
		}
		outID = &f.ID
	}
	if errs.Len() > 0 {
		f, err := b.store.PutFile(ctx, rec.Tenant, rec.ID+"_error.jsonl", PurposeBatchOutput, &errs)
		if err != nil {
			b.log.Warn("finalize: error file", "batch", rec.ID, "err", err)
			return
		}
		errID = &f.ID
	}
	done := b.cfg.Now()
	_, err = updateRecord(ctx, b.store.batches, rec.Tenant, rec.ID, func(r *Record) error {
		if r.Owner != b.cfg.ID || Done(r.Status) {
			return ErrUnchanged // another took over: its files count
		}
		r.Status, r.Owner, r.Ending, r.OwnedUnixMs = ending, "", "", 0
		r.OutputFileID, r.ErrorFileID = outID, errID
		r.RequestCounts.Completed, r.RequestCounts.Failed = completed, failed
		switch ending {
		case StatusCompleted:
			r.CompletedAt = unixPtr(done)
		case StatusExpired:
			r.ExpiredAt = unixPtr(done)
		case StatusCancelled:
			r.CancelledAt = unixPtr(done)
		}
		return nil
	})
	if err != nil {
		b.log.Warn("finalize: record", "batch", rec.ID, "err", err)
		return
	}
	b.log.Info("batch finalized", "batch", rec.ID, "tenant", rec.Tenant, "status", ending, "completed", completed, "failed", failed)
	// The results are in the files now.
	if s, err := b.js.Stream(ctx, "KV_"+subjects.ResultsBucket); err == nil {
		_ = s.Purge(ctx, jetstream.WithPurgeSubject("$KV."+subjects.ResultsBucket+"."+rec.ID+".>"))
	}
}

// collectTimeout bounds the reading of a batch's results, a watch that
// ends only when its last result arrives; a finalizing that runs out of
// it is done again from the start.
const collectTimeout = 2 * time.Minute

// collect reads every result of batch: line → kind byte and line JSON.
func (b *Batcher) collect(ctx context.Context, batch string) (map[int][]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, collectTimeout)
	defer cancel()
	w, err := b.results.WatchFiltered(ctx, []string{batch + ".>"}, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Stop() }()
	out := map[int][]byte{}
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e := <-w.Updates():
			if e == nil {
				return out, nil
			}
			n, err := strconv.Atoi(e.Key()[len(batch)+1:])
			if err == nil && len(e.Value()) > 1 {
				out[n] = e.Value()
			}
		}
	}
}

// withMissing writes the results in line order, and for each line without
// one an error line: batch_expired past the window, batch_item_lost if a
// completed batch lacks one (it never should).
func (b *Batcher) withMissing(ctx context.Context, rec *Record, ending string, results map[int][]byte, write func([]byte)) error {
	var r jetstream.ObjectResult
	err := b.store.unlessStale(ctx, objectName(rec.Tenant, rec.InputFileID), func() (err error) {
		r, err = b.store.files.Get(ctx, objectName(rec.Tenant, rec.InputFileID))
		return err
	})
	if err != nil {
		return err
	}
	defer r.Close()
	code, msg := CodeBatchExpired, "This request could not be executed before the completion window expired."
	if ending == StatusCompleted {
		code, msg = CodeItemLost, "This request was lost before it ran."
	}
	_, err = EachLine(r, func(n int, raw []byte) error {
		if v, ok := results[n]; ok {
			write(v)
			return nil
		}
		l, _ := ParseLine(raw)
		line, err := json.Marshal(OutputLine{ID: requestID(rec.ID, n), CustomID: l.CustomID,
			Error: &OutputLineFail{Code: code, Message: msg}})
		if err != nil {
			return err
		}
		write(append([]byte{kindError}, line...))
		return nil
	})
	return err
}

// requestID is the id of a line's output: batch_req_<batch>_<line>, the
// same however often the line is tried.
func requestID(batch string, line int) string {
	return "batch_req_" + batch[len("batch_"):] + "_" + strconv.Itoa(line)
}
