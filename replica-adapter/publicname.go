package adapter

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
)

// The engine answers with the name it serves under ("lora-a", or the
// --engine-model name) in the "model" field of its body and of every stream
// chunk. Clients asked for a public name (an alias, a model id, or
// "model:adapter") and get that name back: the engine's names are an
// implementation detail of the replica.

// names is one request's model renaming: the engine's name in its answer
// (served), and the client's (public). Zero: no renaming.
type names struct{ served, public string }

// renaming is the renaming of served to public; an empty or identical name
// leaves the answer as it is.
func renaming(served, public string) names {
	if served == "" || public == "" || served == public {
		return names{}
	}
	return names{served, public}
}

// apply wraps resp's body in the renamer, unless n renames nothing.
func (n names) apply(resp *http.Response) {
	if n.served == "" {
		return
	}
	resp.Body = newRenamer(resp.Body, n.served, n.public)
	// The length changes; nothing downstream reads it, but it must not lie.
	resp.ContentLength = -1
	resp.Header.Del("Content-Length")
}

// renamer rewrites "model":"<served>" (with or without a space after the
// colon) to the public name as the body streams through. It never holds
// back more than a partial match at the end of a read, so a stream chunk is
// passed on whole: SSE events end in a blank line, which no match begins
// with.
type renamer struct {
	src      io.ReadCloser
	from, to [2][]byte
	pending  []byte // input not yet passed on: a possible partial match
	out      []byte // output not yet returned, in outBuf
	outBuf   []byte // reused by every read
	err      error
}

func newRenamer(src io.ReadCloser, served, public string) *renamer {
	s, _ := json.Marshal(served)
	p, _ := json.Marshal(public)
	r := &renamer{src: src}
	for i, sep := range [2]string{":", ": "} {
		r.from[i] = append([]byte(`"model"`+sep), s...)
		r.to[i] = append([]byte(`"model"`+sep), p...)
	}
	return r
}

func (r *renamer) Read(p []byte) (int, error) {
	for len(r.out) == 0 {
		if r.err != nil {
			if len(r.pending) > 0 {
				r.out, r.pending = r.pending, nil
				break
			}
			return 0, r.err
		}
		if len(p) == 0 {
			return 0, nil
		}
		// The engine's bytes are read into p, renamed into outBuf and
		// copied back: a stream holds no read buffer of its own, only the
		// output of its last read.
		n, err := r.src.Read(p)
		r.err = err
		data := p[:n]
		if len(r.pending) > 0 {
			data = append(r.pending, data...)
		}
		var keep int
		r.outBuf, keep = r.rename(r.outBuf[:0], data)
		r.out = r.outBuf
		r.pending = append([]byte(nil), data[len(data)-keep:]...)
	}
	n := copy(p, r.out)
	r.out = r.out[n:]
	return n, nil
}

// rename appends data to out with every match replaced, but for a tail
// after the last match that may begin one the next read completes; it
// returns out and that tail's length. A match's replacement never begins
// another match: the public name is quoted.
func (r *renamer) rename(out, data []byte) ([]byte, int) {
	for {
		at, which := -1, 0
		for i, f := range r.from {
			if j := bytes.Index(data, f); j >= 0 && (at < 0 || j < at) {
				at, which = j, i
			}
		}
		if at < 0 {
			break
		}
		out = append(out, data[:at]...)
		out = append(out, r.to[which]...)
		data = data[at+len(r.from[which]):]
	}
	keep := r.partial(data)
	return append(out, data[:len(data)-keep]...), keep
}

// partial is the length of the longest tail of data that is a proper
// prefix of a pattern: it may complete with the next read.
func (r *renamer) partial(data []byte) int {
	longest := 0
	for _, f := range r.from {
		for k := min(len(f)-1, len(data)); k > longest; k-- {
			if bytes.Equal(data[len(data)-k:], f[:k]) {
				longest = k
				break
			}
		}
	}
	return longest
}

func (r *renamer) Close() error { return r.src.Close() }
