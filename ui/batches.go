package ui

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/batch"
	"github.com/switchyard-llm/switchyard/subjects"
)

// batchView is one batch in the dashboard's list.
type batchView struct {
	ID        string              `json:"id"`
	Tenant    string              `json:"tenant"`
	Status    string              `json:"status"`
	Endpoint  string              `json:"endpoint"`
	Counts    batch.RequestCounts `json:"request_counts"`
	CreatedAt int64               `json:"created_at"`
}

// maxFinishedShown is how many finished batches the list keeps below the
// running ones.
const maxFinishedShown = 10

// serveBatches is GET /ui/batches: the running batches with their
// progress, then the latest finished ones, read from the llm-batches
// bucket (none when it does not exist yet).
func (u *UI) serveBatches(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	views := []batchView{}
	if u.nc != nil {
		js, err := jetstream.New(u.nc)
		var kv jetstream.KeyValue
		if err == nil {
			kv, err = js.KeyValue(ctx, subjects.BatchesBucket)
		}
		var recs []*batch.Record
		if err == nil {
			recs, err = batch.List(ctx, kv, "")
		}
		if err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
			http.Error(w, "batches: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		finished := 0
		for _, running := range []bool{true, false} {
			for _, rec := range recs {
				if batch.Done(rec.Status) == running {
					continue
				}
				if !running {
					if finished == maxFinishedShown {
						break
					}
					finished++
				}
				views = append(views, batchView{ID: rec.ID, Tenant: rec.Tenant, Status: rec.Status,
					Endpoint: rec.Endpoint, Counts: rec.RequestCounts, CreatedAt: rec.CreatedAt})
			}
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-cache")
	_ = json.NewEncoder(w).Encode(views)
}
