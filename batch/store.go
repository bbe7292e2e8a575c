package batch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/subjects"
)

// Store is the files and batch records, as a gateway or a batcher sees
// them. Every call names the tenant: another tenant's file or batch is
// ErrNotFound, as an unknown one is.
type Store struct {
	js      jetstream.JetStream
	files   jetstream.ObjectStore
	batches jetstream.KeyValue
	now     func() time.Time
}

// OpenStore opens the files object store and the batches bucket, creating
// each (with replicas) when it is absent.
func OpenStore(ctx context.Context, js jetstream.JetStream, replicas int) (*Store, error) {
	files, err := ensureObjects(ctx, js, subjects.FilesBucket, replicas)
	if err != nil {
		return nil, err
	}
	batches, err := ensureKV(ctx, js, subjects.BatchesBucket, replicas, 0)
	if err != nil {
		return nil, err
	}
	return &Store{js: js, files: files, batches: batches, now: time.Now}, nil
}

func ensureObjects(ctx context.Context, js jetstream.JetStream, name string, replicas int) (jetstream.ObjectStore, error) {
	obs, err := js.ObjectStore(ctx, name)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		obs, err = js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: name, Replicas: max(replicas, 1),
			Description: "Switchyard: batch input and output files"})
		if errors.Is(err, jetstream.ErrBucketExists) || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			obs, err = js.ObjectStore(ctx, name)
		}
	}
	if err != nil {
		return nil, errors.New("object store " + name + ": " + err.Error())
	}
	return obs, nil
}

func ensureKV(ctx context.Context, js jetstream.JetStream, name string, replicas int, ttl time.Duration) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, name)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: name, Replicas: max(replicas, 1), TTL: ttl, History: 1})
		if errors.Is(err, jetstream.ErrBucketExists) || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			kv, err = js.KeyValue(ctx, name)
		}
	}
	if err != nil {
		return nil, errors.New("KV bucket " + name + ": " + err.Error())
	}
	return kv, nil
}

// Object metadata keys of a file.
const (
	metaTenant   = "tenant"
	metaFilename = "filename"
	metaPurpose  = "purpose"
	metaCreated  = "created_at"
)

func objectName(tenant, id string) string { return tenant + "/" + id }

func fileOf(info *jetstream.ObjectInfo) *File {
	created, _ := strconv.ParseInt(info.Metadata[metaCreated], 10, 64)
	_, id, _ := strings.Cut(info.Name, "/")
	return &File{ID: id, Object: "file", Bytes: int64(info.Size), CreatedAt: created,
		Filename: info.Metadata[metaFilename], Purpose: info.Metadata[metaPurpose], Status: "processed"}
}

// PutFile stores r as a new file of tenant. A read error (the Checker's)
// fails the put, and the object store keeps none of what was sent.
func (s *Store) PutFile(ctx context.Context, tenant, filename, purpose string, r io.Reader) (*File, error) {
	now := s.now()
	id := NewFileID(now)
	info, err := s.files.Put(ctx, jetstream.ObjectMeta{
		Name: objectName(tenant, id),
		Metadata: map[string]string{metaTenant: tenant, metaFilename: filename, metaPurpose: purpose,
			metaCreated: strconv.FormatInt(now.Unix(), 10)},
	}, r)
	if err != nil {
		return nil, err
	}
	return fileOf(info), nil
}

// File is tenant's file id.
func (s *Store) File(ctx context.Context, tenant, id string) (*File, error) {
	if !ValidID("file-", id) {
		return nil, ErrNotFound
	}
	var info *jetstream.ObjectInfo
	err := s.unlessStale(ctx, objectName(tenant, id), func() (err error) {
		info, err = s.files.GetInfo(ctx, objectName(tenant, id))
		return err
	})
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	if info.Metadata[metaTenant] != tenant {
		return nil, ErrNotFound
	}
	return fileOf(info), nil
}

// OpenFile reads tenant's file id; close the reader.
func (s *Store) OpenFile(ctx context.Context, tenant, id string) (io.ReadCloser, *File, error) {
	f, err := s.File(ctx, tenant, id)
	if err != nil {
		return nil, nil, err
	}
	var r jetstream.ObjectResult
	err = s.unlessStale(ctx, objectName(tenant, id), func() (err error) {
		r, err = s.files.Get(ctx, objectName(tenant, id))
		return err
	})
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, nil, ErrNotFound
	}
	if err != nil {
		return nil, nil, err
	}
	return r, f, nil
}

// Files lists tenant's files, newest first.
func (s *Store) Files(ctx context.Context, tenant, purpose string) ([]File, error) {
	infos, err := s.files.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return []File{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := []File{}
	for _, info := range infos {
		if info.Metadata[metaTenant] != tenant || !strings.HasPrefix(info.Name, tenant+"/") {
			continue
		}
		if f := fileOf(info); purpose == "" || f.Purpose == purpose {
			out = append(out, *f)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID > out[j].ID })
	return out, nil
}

// DeleteFile deletes tenant's file id.
func (s *Store) DeleteFile(ctx context.Context, tenant, id string) error {
	if _, err := s.File(ctx, tenant, id); err != nil {
		return err
	}
	return s.files.Delete(ctx, objectName(tenant, id))
}

// CheckInput reads tenant's input file for a batch on endpoint: every line
// must be a request for that endpoint. It returns the file's line count and
// its requests, or the 400 (404 for a file that is not tenant's) that the
// batch creation gets.
func (s *Store) CheckInput(ctx context.Context, tenant, fileID, endpoint string) (lines, requests int, apiErr *subjects.APIError) {
	r, f, err := s.OpenFile(ctx, tenant, fileID)
	if errors.Is(err, ErrNotFound) {
		return 0, 0, fileNotFound(fileID)
	}
	if err != nil {
		return 0, 0, unavailable(err)
	}
	defer r.Close()
	if f.Purpose != PurposeBatch {
		e := subjects.NewError(400, subjects.CodeInvalidRequest, "file "+fileID+" has purpose "+strconv.Quote(f.Purpose)+`, not "batch"`)
		e.Param = "input_file_id"
		return 0, 0, e
	}
	read := &countingReader{r: r}
	var otherEndpoint *subjects.APIError
	lines, err = EachLine(read, func(n int, raw []byte) error {
		l, msg := ParseLine(raw)
		if msg != "" {
			return lineError(n, msg)
		}
		if l.URL != endpoint {
			otherEndpoint = lineError(n, "url "+strconv.Quote(l.URL)+" does not match the batch's endpoint "+strconv.Quote(endpoint))
			return otherEndpoint
		}
		requests++
		return nil
	})
	if otherEndpoint != nil {
		// The client's: the Checker did not know the endpoint. (Not
		// waited for the digest: a garbled read that still parses as a
		// line for another endpoint would pass for the client's.)
		return 0, 0, otherEndpoint
	}
	if err == nil && requests == 0 {
		err = emptyFile()
	}
	var ae *subjects.APIError
	if errors.As(err, &ae) {
		// The file passed the Checker when it was stored, so a line
		// it now fails to parse, or no line at all, is believed only
		// when the whole file was read as stored (the object store
		// checks its digest at the end): a read the stream cut short
		// or garbled while its leader moved is the store's failure,
		// a 503, not the client's 400.
		if _, derr := io.Copy(io.Discard, read); derr != nil {
			return 0, 0, unavailable(derr)
		}
		if read.n != f.Bytes {
			return 0, 0, unavailable(fmt.Errorf("read %d of the file's %d bytes", read.n, f.Bytes))
		}
		return 0, 0, ae
	}
	if err != nil {
		return 0, 0, unavailable(err)
	}
	return lines, requests, nil
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func fileNotFound(id string) *subjects.APIError {
	e := subjects.NewError(404, subjects.CodeNotFound, "No such File object: "+id)
	e.Param = "input_file_id"
	return e
}

func unavailable(err error) *subjects.APIError {
	e := subjects.NewError(503, subjects.CodeRouterUnavailable, "the batch store is unavailable: "+err.Error())
	e.RetryAfter = time.Second
	return e
}

// CreateBatch writes a new record.
func (s *Store) CreateBatch(ctx context.Context, rec *Record) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	_, err = s.batches.Create(ctx, rec.Key(), b)
	return err
}

// Batch is tenant's batch id.
func (s *Store) Batch(ctx context.Context, tenant, id string) (*Record, error) {
	rec, _, err := getRecord(ctx, s.batches, tenant, id)
	return rec, err
}

func getRecord(ctx context.Context, kv jetstream.KeyValue, tenant, id string) (*Record, uint64, error) {
	if !ValidID("batch_", id) || subjects.ValidToken(tenant) != nil {
		return nil, 0, ErrNotFound
	}
	e, err := kv.Get(ctx, recordKey(tenant, id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, ErrNotFound
	}
	if err != nil {
		return nil, 0, err
	}
	var rec Record
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return nil, 0, err
	}
	if rec.Tenant != tenant || rec.ID != id {
		return nil, 0, ErrNotFound
	}
	return &rec, e.Revision(), nil
}

// Batches lists tenant's batches, newest first; tenant "" lists every
// tenant's (operators).
func (s *Store) Batches(ctx context.Context, tenant string) ([]*Record, error) {
	return listRecords(ctx, s.batches, tenant)
}

// List is Batches on the bucket alone, for a reader that opens it without
// creating anything (the dashboard).
func List(ctx context.Context, kv jetstream.KeyValue, tenant string) ([]*Record, error) {
	return listRecords(ctx, kv, tenant)
}

func listRecords(ctx context.Context, kv jetstream.KeyValue, tenant string) ([]*Record, error) {
	// The listing is a watch that ends when its last key arrives, not a
	// request with the client's timeout: bound it.
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	filter := ">"
	if tenant != "" {
		filter = tenant + ".*"
	}
	lister, err := kv.ListKeysFiltered(ctx, filter)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	if err := ctx.Err(); err != nil {
		return nil, err // the keys stopped short
	}
	var out []*Record
	for _, k := range keys {
		t, id, ok := strings.Cut(k, ".")
		if !ok {
			continue
		}
		rec, _, err := getRecord(ctx, kv, t, id)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID > out[j].ID })
	return out, nil
}

// listTimeout bounds a listing of the batches.
const listTimeout = 10 * time.Second

// Update applies fn to tenant's batch id with compare-and-set, again on a
// conflict. fn returning ErrUnchanged leaves the record as it is.
func (s *Store) Update(ctx context.Context, tenant, id string, fn func(*Record) error) (*Record, error) {
	return updateRecord(ctx, s.batches, tenant, id, fn)
}

// ErrUnchanged, from an Update's fn, writes nothing.
var ErrUnchanged = errors.New("unchanged")

func updateRecord(ctx context.Context, kv jetstream.KeyValue, tenant, id string, fn func(*Record) error) (*Record, error) {
	for range 32 {
		rec, rev, err := getRecord(ctx, kv, tenant, id)
		if err != nil {
			return nil, err
		}
		if err := fn(rec); errors.Is(err, ErrUnchanged) {
			return rec, nil
		} else if err != nil {
			return rec, err
		}
		b, err := json.Marshal(rec)
		if err != nil {
			return nil, err
		}
		_, err = kv.Update(ctx, rec.Key(), b, rev)
		if err == nil {
			return rec, nil
		}
		if !conflict(err) {
			return nil, err
		}
	}
	return nil, errors.New("batch " + id + ": too many concurrent updates")
}

// Cancel moves tenant's batch id to cancelling: the batchers stop taking
// its items and finalize it with what completed.
func (s *Store) Cancel(ctx context.Context, tenant, id string) (*Record, *subjects.APIError) {
	rec, err := s.Update(ctx, tenant, id, func(r *Record) error {
		switch r.Status {
		case StatusValidating, StatusInProgress:
			r.Status, r.CancellingAt = StatusCancelling, unixPtr(s.now())
			return nil
		case StatusCancelling, StatusCancelled:
			return ErrUnchanged
		}
		return subjects.NewError(400, subjects.CodeInvalidRequest, "Cannot cancel a batch with status "+strconv.Quote(r.Status)+".")
	})
	var ae *subjects.APIError
	switch {
	case errors.As(err, &ae):
		return nil, ae
	case errors.Is(err, ErrNotFound):
		return nil, BatchNotFound(id)
	case err != nil:
		return nil, unavailable(err)
	}
	return rec, nil
}

// BatchNotFound is the 404 of an unknown batch (or another tenant's).
func BatchNotFound(id string) *subjects.APIError {
	return subjects.NewError(404, subjects.CodeNotFound, "No batch found with id "+strconv.Quote(id)+".")
}

// conflict reports whether err is a compare-and-set that lost the race.
func conflict(err error) bool {
	var apiErr *jetstream.APIError
	if errors.Is(err, jetstream.ErrKeyExists) {
		return true
	}
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}
