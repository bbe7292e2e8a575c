package kv

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/switchyard-llm/switchyard/table"
)

// StateFile is the name of the persisted snapshot inside the state dir.
const StateFile = "table.json"

// state is the persisted snapshot: the flat table plus the revision it was
// read at.
type state struct {
	Revision uint64                     `json:"revision"`
	Values   map[string]json.RawMessage `json:"values"`
}

// saveState writes s to dir/table.json through a temporary file and a
// rename, so a crash leaves either the old or the new file, never half of one.
func saveState(dir string, s *table.Snapshot) error {
	b, err := json.MarshalIndent(state{Revision: s.Revision, Values: s.Raw}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".table-*.json")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, StateFile))
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}

// loadState reads dir/table.json. Values that no longer validate (the file
// may come from an older version) are logged and left out.
func loadState(dir string, log *slog.Logger) (*table.Snapshot, time.Time, error) {
	path := filepath.Join(dir, StateFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, time.Time{}, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, time.Time{}, err
	}
	var st state
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, time.Time{}, fmt.Errorf("%s: %w", path, err)
	}
	s, errs := table.FromFlat(st.Values)
	for _, err := range errs {
		log.Warn("persisted routing table value rejected", "err", err)
	}
	s.Revision = st.Revision
	return s, fi.ModTime(), nil
}
