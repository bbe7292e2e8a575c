package batch

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/subjects"
)

// An object store's reads are direct gets, which any replica of its stream
// answers, and a replica may not yet hold a file written a moment ago (or
// a server restarted a moment ago still catching up). A miss is therefore
// asked of the stream's leader, which holds every write it acknowledged,
// and while the leader has the file the read is tried again.
const (
	staleTries = 40
	staleEvery = 50 * time.Millisecond
)

// errUnconfirmed is a miss the stream's leader could not confirm: the
// file may be there, so it is not a 404 (nor a failed batch).
var errUnconfirmed = errors.New("the files stream's leader did not answer whether the file is there")

// unlessStale runs read and, while it finds no object that the leader
// has (or the leader cannot say), again.
func (s *Store) unlessStale(ctx context.Context, name string, read func() error) error {
	err := read()
	for try := 0; errors.Is(err, jetstream.ErrObjectNotFound); try++ {
		switch has, known := s.leaderHas(ctx, name); {
		case known && !has:
			return err
		case try == staleTries:
			return errUnconfirmed
		}
		t := time.NewTimer(staleEvery)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		err = read()
	}
	return err
}

// leaderHas asks the files stream's leader whether name's metadata is
// there and not deleted; known is false when it gave no answer (no
// leader, JetStream unavailable).
func (s *Store) leaderHas(ctx context.Context, name string) (has, known bool) {
	return s.leaderLast(ctx, "OBJ_"+subjects.FilesBucket, "$O."+subjects.FilesBucket+".M."+base64.URLEncoding.EncodeToString([]byte(name)),
		func(_, data []byte) bool {
			var info struct {
				Deleted bool `json:"deleted"`
			}
			return json.Unmarshal(data, &info) == nil && !info.Deleted
		})
}

// leaderHasRecord asks the batches bucket's leader whether tenant's batch
// id has a record, one that getRecord takes as it (not deleted, and naming
// that tenant and batch): a KV read is a direct get too, and an item whose
// batch a lagging replica does not show yet is not to be dropped for it.
func (s *Store) leaderHasRecord(ctx context.Context, tenant, id string) (has, known bool) {
	bucket := s.batches.Bucket()
	return s.leaderLast(ctx, "KV_"+bucket, "$KV."+bucket+"."+recordKey(tenant, id),
		func(hdr, data []byte) bool {
			var rec Record
			return !bytes.Contains(hdr, []byte(kvOperation)) && json.Unmarshal(data, &rec) == nil &&
				rec.Tenant == tenant && rec.ID == id
		})
}

// kvOperation is the header JetStream's KV puts on a delete or purge
// marker (a put has none).
const kvOperation = "KV-Operation"

// leaderLast asks stream's leader (a message get, which only the leader
// answers) for subject's last message and whether present says it is
// there (headers and data as stored); known is false when it gave no
// answer.
func (s *Store) leaderLast(ctx context.Context, stream, subject string, present func(hdr, data []byte) bool) (has, known bool) {
	prefix := s.js.Options().APIPrefix
	if prefix == "" {
		prefix = jetstream.DefaultAPIPrefix
	}
	req, _ := json.Marshal(map[string]string{"last_by_subj": subject})
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	msg, err := s.js.Conn().RequestWithContext(ctx, strings.TrimSuffix(prefix, ".")+".STREAM.MSG.GET."+stream, req)
	if err != nil {
		return false, false
	}
	var resp struct {
		Message *struct {
			Header []byte `json:"hdrs"`
			Data   []byte `json:"data"`
		} `json:"message"`
		Error *jetstream.APIError `json:"error"`
	}
	if json.Unmarshal(msg.Data, &resp) != nil {
		return false, false
	}
	if resp.Error != nil {
		return false, resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound
	}
	if resp.Message == nil {
		return false, false
	}
	return present(resp.Message.Header, resp.Message.Data), true
}
