package batch

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"

	"github.com/switchyard-llm/switchyard/subjects"
)

// Line is one line of a batch input file.
type Line struct {
	CustomID string          `json:"custom_id"`
	Method   string          `json:"method"`
	URL      string          `json:"url"`
	Body     json.RawMessage `json:"body"`
}

// ParseLine decodes and checks one non-blank line. The error names what is
// wrong, not where: the caller adds the line number.
func ParseLine(raw []byte) (Line, string) {
	var l Line
	if err := json.Unmarshal(raw, &l); err != nil {
		return l, "not a JSON object: " + err.Error()
	}
	switch {
	case l.CustomID == "":
		return l, "custom_id is required"
	case len(l.CustomID) > MaxCustomID:
		return l, "custom_id must be at most " + strconv.Itoa(MaxCustomID) + " characters"
	case l.Method != http.MethodPost:
		return l, `method must be "POST"`
	case !validEndpoint(l.URL):
		return l, "url must be one of /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses, not " + strconv.Quote(l.URL)
	}
	var body struct {
		Model  *string `json:"model"`
		Stream bool    `json:"stream"`
	}
	if len(l.Body) == 0 || l.Body[0] != '{' || json.Unmarshal(l.Body, &body) != nil {
		return l, "body must be a JSON object"
	}
	if body.Model == nil || *body.Model == "" {
		return l, "body.model is required"
	}
	if body.Stream {
		return l, "body.stream is not supported in a batch"
	}
	return l, ""
}

// lineError is the 400 for line n (1-based).
func lineError(n int, msg string) *subjects.APIError {
	return subjects.NewError(http.StatusBadRequest, subjects.CodeInvalidRequest, "line "+strconv.Itoa(n)+": "+msg)
}

// Checker is an io.Reader that passes an upload through while it checks
// each line as it arrives: a bad line, a duplicate custom_id, too many
// lines or bytes, or no line at all end the read with an *APIError, so
// the object store's put fails and keeps nothing.
type Checker struct {
	src       io.Reader
	maxBytes  int64
	maxLines  int
	read      int64
	line      int // lines completed
	requests  int // non-blank lines
	partial   []byte
	customIDs map[string]int
	err       error
}

// NewChecker checks src under the upload limits.
func NewChecker(src io.Reader, maxBytes int64, maxLines int) *Checker {
	return &Checker{src: src, maxBytes: maxBytes, maxLines: maxLines, customIDs: map[string]int{}}
}

// Lines is the number of lines read, Requests the non-blank ones.
func (c *Checker) Lines() int    { return c.line }
func (c *Checker) Requests() int { return c.requests }

// Err is the error that ended the read, nil after a good file.
func (c *Checker) Err() error { return c.err }

func (c *Checker) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.src.Read(p)
	c.read += int64(n)
	if c.read > c.maxBytes {
		c.err = subjects.NewError(http.StatusRequestEntityTooLarge, subjects.CodeRequestTooLarge,
			"the file is over the limit of "+strconv.FormatInt(c.maxBytes, 10)+" bytes")
		return 0, c.err
	}
	data := p[:n]
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			c.partial = append(c.partial, data...)
			if len(c.partial) > MaxLineBytes {
				c.err = lineError(c.line+1, "longer than "+strconv.Itoa(MaxLineBytes)+" bytes")
				return 0, c.err
			}
			break
		}
		c.partial = append(c.partial, data[:i]...)
		data = data[i+1:]
		if e := c.endLine(); e != nil {
			c.err = e
			return 0, e
		}
	}
	if err == io.EOF {
		if len(c.partial) > 0 {
			if e := c.endLine(); e != nil {
				c.err = e
				return 0, e
			}
		}
		if c.requests == 0 {
			c.err = emptyFile()
			return 0, c.err
		}
	}
	return n, err
}

func (c *Checker) endLine() error {
	c.line++
	raw := bytes.TrimSpace(c.partial)
	c.partial = c.partial[:0]
	if len(raw) > MaxLineBytes {
		return lineError(c.line, "longer than "+strconv.Itoa(MaxLineBytes)+" bytes")
	}
	if len(raw) == 0 {
		return nil
	}
	c.requests++
	if c.requests > c.maxLines {
		return lineError(c.line, "the file is over the limit of "+strconv.Itoa(c.maxLines)+" lines")
	}
	l, msg := ParseLine(raw)
	if msg != "" {
		return lineError(c.line, msg)
	}
	if first, dup := c.customIDs[l.CustomID]; dup {
		return lineError(c.line, "custom_id "+strconv.Quote(l.CustomID)+" is already used on line "+strconv.Itoa(first))
	}
	c.customIDs[l.CustomID] = c.line
	return nil
}

// emptyFile is the 400 of a batch file without a request.
func emptyFile() *subjects.APIError {
	return subjects.NewError(http.StatusBadRequest, subjects.CodeInvalidRequest, "the file is empty: a batch file holds one request per line")
}

// EachLine calls fn with every non-blank line of r and its 1-based number;
// an error from fn stops the walk. Lines are at most MaxLineBytes.
func EachLine(r io.Reader, fn func(n int, raw []byte) error) (lines int, err error) {
	br := newLineReader(r)
	for {
		raw, err := br.next()
		if err == io.EOF {
			return lines, nil
		}
		if err != nil {
			return lines, err
		}
		lines++
		if raw = bytes.TrimSpace(raw); len(raw) == 0 {
			continue
		}
		if err := fn(lines, raw); err != nil {
			return lines, err
		}
	}
}
