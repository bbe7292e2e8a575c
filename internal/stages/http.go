package stages

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// Handlers serve a recorder's stage table over HTTP: GET /stages is the
// summary (with the bus floor measured then, by summary), POST
// /stages/reset starts a new one. The end-to-end bench's stack serves them
// on its control listener, `switchyard dev --stages` beside the dashboard;
// `switchyard bench --stages` and `make bench-e2e` read them with Fetch.
func Handlers(summary func() (Summary, error), reset func()) map[string]http.Handler {
	return map[string]http.Handler{
		"GET " + PathSummary: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			sum, err := summary()
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(sum)
		}),
		"POST " + PathReset: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			reset()
			w.WriteHeader(http.StatusNoContent)
		}),
	}
}

// The paths Handlers serve.
const (
	PathSummary = "/stages"
	PathReset   = "/stages/reset"
)

// Reset asks the stage table served at base (scheme://host[:port]) to
// start anew.
func Reset(ctx context.Context, base string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(base, "/")+PathReset, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("POST %s: %s", req.URL, resp.Status)
	}
	return nil
}

// Fetch reads the stage table served at base.
func Fetch(ctx context.Context, base string) (*Summary, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(base, "/")+PathSummary, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
		return nil, fmt.Errorf("GET %s: %s: %s", req.URL, resp.Status, strings.TrimSpace(string(b)))
	}
	var sum Summary
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&sum); err != nil {
		return nil, fmt.Errorf("GET %s: %w", req.URL, err)
	}
	return &sum, nil
}

// WriteTable writes the summary as the Markdown stage table
// docs/benchmarks.md keeps: p50 and p99 of each stage, the total, and the
// bus floor measured in the same run.
func (s *Summary) WriteTable(w io.Writer, title string) {
	fmt.Fprintf(w, "Stage budget of Switchyard's requests in this phase (%s; %d requests recorded, each stage the time since the stage before it that the request passed, milliseconds):\n\n", title, s.Requests)
	fmt.Fprintf(w, "| stage | requests | p50 | p99 |\n|---|---:|---:|---:|\n")
	for _, st := range s.Stages {
		fmt.Fprintf(w, "| %s | %d | %.3f | %.3f |\n", st.Stage, st.Requests, st.P50, st.P99)
	}
	fmt.Fprintf(w, "| **body received → first byte to the client** | %d | %.3f | %.3f |\n", s.Total.Requests, s.Total.P50, s.Total.P99)
	if f := s.BusFloor; f.Requests > 0 {
		fmt.Fprintf(w, "| bus floor: a bare NATS request and reply through the same server | %d | %.3f | %.3f |\n", f.Requests, f.P50, f.P99)
	}
	fmt.Fprintf(w, "\n")
}
