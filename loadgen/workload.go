package loadgen

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/switchyard-llm/switchyard/internal/check"
)

// Sizes is a range of byte counts, drawn uniformly: Min == Max is a fixed
// size. The zero value means "not set".
type Sizes struct{ Min, Max int }

// maxPromptBytes bounds one generated prompt or shared prefix.
const maxPromptBytes = 4 << 20

// ParseSizes reads "N" or "MIN-MAX" (bytes).
func ParseSizes(s string) (Sizes, error) {
	lo, hi, isRange := strings.Cut(s, "-")
	a, err := strconv.Atoi(strings.TrimSpace(lo))
	if err != nil {
		return Sizes{}, fmt.Errorf("%q: want N or MIN-MAX bytes", s)
	}
	b := a
	if isRange {
		if b, err = strconv.Atoi(strings.TrimSpace(hi)); err != nil {
			return Sizes{}, fmt.Errorf("%q: want N or MIN-MAX bytes", s)
		}
	}
	z := Sizes{Min: a, Max: b}
	return z, z.validate()
}

func (z Sizes) validate() error {
	if z.Min < 1 || z.Max > maxPromptBytes || z.Min > z.Max {
		return fmt.Errorf("%d-%d: want 1 ≤ MIN ≤ MAX ≤ %d bytes", z.Min, z.Max, maxPromptBytes)
	}
	return nil
}

func (z Sizes) String() string {
	if z.Min == z.Max {
		return strconv.Itoa(z.Min)
	}
	return fmt.Sprintf("%d-%d", z.Min, z.Max)
}

// SharedPrefix is K system prompts of L bytes each; every request opens with
// one of them, the most popular most often (Zipf, exponent PrefixZipf).
type SharedPrefix struct{ K, L int }

// PrefixZipf is the popularity skew of the shared prefixes: with 8 of them
// the most popular takes about 40% of the requests and the least about 3%.
const PrefixZipf = 1.2

// ParseSharedPrefix reads "K:L".
func ParseSharedPrefix(s string) (SharedPrefix, error) {
	k, l, ok := strings.Cut(s, ":")
	p := SharedPrefix{}
	var err1, err2 error
	p.K, err1 = strconv.Atoi(k)
	p.L, err2 = strconv.Atoi(l)
	if !ok || err1 != nil || err2 != nil {
		return SharedPrefix{}, fmt.Errorf("%q: want K:L (K prompts of L bytes)", s)
	}
	if p.K < 1 || p.K > 10000 || p.L < 1 || p.L > maxPromptBytes {
		return SharedPrefix{}, fmt.Errorf("%q: want 1 ≤ K ≤ 10000 and 1 ≤ L ≤ %d", s, maxPromptBytes)
	}
	return p, nil
}

// Entry is one request of a workload file.
type Entry struct {
	// At is when it is sent, from the start of the run (HasAt false: the
	// line had no timestamp).
	At    time.Duration
	HasAt bool
	Body  []byte // the OpenAI request body, timestamp removed
	// Stream is the body's "stream".
	Stream bool
}

// Bounds of a workload file.
const (
	maxEntryBytes = 8 << 20
	maxEntries    = 1_000_000
)

// ReadWorkload reads JSONL: one request body a line (chat or the Messages
// API, with "messages"; completion, with "prompt"; the Responses API or
// embeddings, with "input"). A line may carry a
// "timestamp" field, seconds from the start of the run, which is removed
// before the body is sent. Blank lines are skipped.
func ReadWorkload(r io.Reader) ([]Entry, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxEntryBytes)
	var out []Entry
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		if len(out) == maxEntries {
			return nil, fmt.Errorf("workload: more than %d requests", maxEntries)
		}
		e, err := parseEntry(line)
		if err != nil {
			return nil, fmt.Errorf("workload line %d: %w", n, err)
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("workload: a line is longer than %d bytes", maxEntryBytes)
		}
		return nil, fmt.Errorf("workload: %w", err)
	}
	if len(out) == 0 {
		return nil, errors.New("workload: no request in the file")
	}
	return out, nil
}

func parseEntry(line []byte) (Entry, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(line, &m); err != nil {
		return Entry{}, fmt.Errorf("not a JSON object: %w", err)
	}
	if m["messages"] == nil && m["prompt"] == nil && m["input"] == nil {
		return Entry{}, errors.New(`none of "messages", "prompt" and "input"`)
	}
	var e Entry
	if ts, ok := m["timestamp"]; ok {
		var sec float64
		if err := json.Unmarshal(ts, &sec); err != nil || !(sec >= 0 && sec <= 86400) {
			return Entry{}, fmt.Errorf("timestamp %s: want seconds from the start, 0 to 86400", ts)
		}
		e.At, e.HasAt = time.Duration(sec*float64(time.Second)), true
		delete(m, "timestamp")
	}
	if s, ok := m["stream"]; ok {
		if err := json.Unmarshal(s, &e.Stream); err != nil {
			return Entry{}, fmt.Errorf("stream %s: want true or false", s)
		}
	}
	body, err := json.Marshal(m)
	if err != nil {
		return Entry{}, err
	}
	e.Body = body
	return e, nil
}

// outgoing is one request as built by a shaper.
type outgoing struct {
	body   []byte
	header http.Header
	stream bool
	usage  bool // read the stream's usage chunk (result.usage)
}

// shaper builds the requests of a run. It is called from the scheduler
// and, in a closed loop, from every worker, hence the mutex.
type shaper struct {
	cfg   *Config
	fixed []byte // the body when nothing shapes it

	mu       sync.Mutex
	rng      *rand.Rand
	zipf     *rand.Zipf
	prefixes []string
	convs    []conversation
	seq      int
}

// conversation is one multi-turn dialogue: its history grows a user turn
// and an assistant turn per request, until maxTurns, when it starts over
// under a new id.
type conversation struct {
	id      string
	gen     int
	history []map[string]string
}

// maxTurns bounds a conversation's history (then it starts over).
const maxTurns = 16

// shaped reports whether any option shapes the requests (otherwise every
// request is the same fixed body).
func (c *Config) shaped() bool {
	return c.PromptBytes != (Sizes{}) || c.SharedPrefix != (SharedPrefix{}) || c.Conversations > 0
}

func newShaper(cfg *Config) *shaper {
	s := &shaper{cfg: cfg, rng: rand.New(rand.NewSource(cfg.Seed))}
	if !cfg.shaped() && cfg.Workload == nil {
		s.fixed = Body(cfg.Model, cfg.Prompt, cfg.MaxTokens, cfg.Stream)
	}
	if p := cfg.SharedPrefix; p.K > 0 {
		for k := range p.K {
			s.prefixes = append(s.prefixes, filler(s.rng, fmt.Sprintf("You are assistant %d. ", k), p.L))
		}
		if p.K > 1 {
			s.zipf = rand.NewZipf(s.rng, PrefixZipf, 1, uint64(p.K-1))
		}
	}
	for c := range cfg.Conversations {
		s.convs = append(s.convs, conversation{id: fmt.Sprintf("bench-%d-%d", cfg.Seed, c)})
	}
	return s
}

// next builds the next request for the shaper's target.
func (s *shaper) next() outgoing {
	hdr := http.Header{"Content-Type": contentType}
	if s.cfg.APIKey != "" {
		hdr.Set("Authorization", "Bearer "+s.cfg.APIKey)
	}
	if s.fixed != nil {
		return outgoing{body: s.fixed, header: hdr, stream: s.cfg.Stream}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	i := s.seq
	s.seq++
	if w := s.cfg.Workload; w != nil {
		e := &w[i%len(w)]
		return outgoing{body: e.Body, header: hdr, stream: e.Stream}
	}
	var msgs []map[string]string
	if s.prefixes != nil {
		k := 0
		if s.zipf != nil {
			k = int(s.zipf.Uint64())
		}
		msgs = append(msgs, map[string]string{"role": "system", "content": s.prefixes[k]})
	}
	prompt := s.cfg.Prompt
	if z := s.cfg.PromptBytes; z != (Sizes{}) {
		n := z.Min
		if z.Max > z.Min {
			n += s.rng.Intn(z.Max - z.Min + 1)
		}
		prompt = filler(s.rng, fmt.Sprintf("Request %d. ", i), n)
	}
	user := map[string]string{"role": "user", "content": prompt}
	if len(s.convs) > 0 {
		c := &s.convs[i%len(s.convs)]
		if len(c.history) >= 2*maxTurns {
			c.history, c.gen = nil, c.gen+1
		}
		msgs = append(msgs, c.history...)
		// The answer is not read back: a reply of about max_tokens words
		// stands for it, so histories grow as real ones do.
		c.history = append(c.history, user, map[string]string{"role": "assistant", "content": filler(s.rng, "", 5*s.cfg.MaxTokens)})
		hdr.Set("X-Conversation-Id", fmt.Sprintf("%s-%d", c.id, c.gen))
	}
	msgs = append(msgs, user)
	b, _ := json.Marshal(map[string]any{
		"model":      s.cfg.Model,
		"messages":   msgs,
		"max_tokens": s.cfg.MaxTokens,
		"stream":     s.cfg.Stream,
	})
	return outgoing{body: b, header: hdr, stream: s.cfg.Stream}
}

var words = strings.Fields(`the of and to in is that for it as with was on be by at this from
or an are which not have had but were all can one there their has more when would will been
into other some time two than may then its only over such most after first also could these
river stone light water north field music paper garden window market engine signal winter`)

// filler is head followed by random words, n bytes in all (at least head).
func filler(rng *rand.Rand, head string, n int) string {
	var b strings.Builder
	b.Grow(max(n, len(head)))
	b.WriteString(head)
	for b.Len() < n {
		w := words[rng.Intn(len(words))]
		if room := n - b.Len(); len(w)+1 > room {
			b.WriteString("xxxxxxxxxxxxxxxx"[:min(room, 16)])
			for b.Len() < n {
				b.WriteByte('x')
			}
			break
		}
		b.WriteString(w)
		b.WriteByte(' ')
	}
	return b.String()
}

// replaySpan is how long a replay at the file's timestamps lasts.
func replaySpan(w []Entry) time.Duration {
	var last time.Duration
	for _, e := range w {
		last = max(last, e.At)
	}
	return last
}

// validateShape range-checks the shaping options.
func (c *Config) validateShape() []error {
	var errs []error
	if c.PromptBytes != (Sizes{}) {
		if err := c.PromptBytes.validate(); err != nil {
			errs = append(errs, &check.Error{Flag: "prompt-bytes", Value: c.PromptBytes.String(), Want: err.Error()})
		}
	}
	errs = append(errs,
		check.Range("conversations", c.Conversations, 0, 100000),
		check.Range("concurrency", c.Concurrency, 0, 100000),
		check.Range("seed", c.Seed, 0, 1<<31),
	)
	if c.Workload != nil && (c.shaped()) {
		errs = append(errs, errors.New("--workload: the file gives the bodies; --prompt-bytes, --shared-prefix and --conversations do not apply"))
	}
	if c.Replay {
		switch {
		case c.Workload == nil:
			errs = append(errs, errors.New("replay at timestamps needs a workload"))
		case c.Concurrency > 0:
			errs = append(errs, errors.New("--concurrency: a closed loop cannot replay timestamps; give --rate"))
		default:
			for i, e := range c.Workload {
				if !e.HasAt {
					errs = append(errs, fmt.Errorf("workload request %d has no timestamp: give --rate to replay the file at a fixed rate", i+1))
					break
				}
			}
		}
	}
	if len(c.APIKey) > 4096 || strings.ContainsAny(c.APIKey, "\r\n") {
		errs = append(errs, errors.New("--api-key: at most 4096 bytes on one line"))
	}
	return errs
}

// describe says how the requests are shaped, for the report ("" when they
// are the one fixed short prompt).
func (c *Config) describe() string {
	var parts []string
	if c.Workload != nil {
		how := "in order, at the rate"
		if c.Replay {
			how = fmt.Sprintf("at their timestamps over %v", replaySpan(c.Workload).Round(time.Millisecond))
		}
		parts = append(parts, fmt.Sprintf("%d requests from a workload file, %s", len(c.Workload), how))
	}
	if c.PromptBytes != (Sizes{}) {
		parts = append(parts, fmt.Sprintf("user messages of %s bytes", c.PromptBytes))
	}
	if p := c.SharedPrefix; p.K > 0 {
		parts = append(parts, fmt.Sprintf("%d shared system prompts of %d bytes (Zipf %g)", p.K, p.L, PrefixZipf))
	}
	if c.Conversations > 0 {
		parts = append(parts, fmt.Sprintf("%d conversations (X-Conversation-Id, up to %d turns)", c.Conversations, maxTurns))
	}
	return strings.Join(parts, "; ")
}
