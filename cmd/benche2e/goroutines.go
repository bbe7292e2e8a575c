package main

import (
	"bufio"
	"bytes"
	"fmt"
	"net/http"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
)

// The goroutines of the stack process, by the part they run: what an
// open stream costs in goroutines, part by part (the many-streams phase
// samples them halfway through each rate). The goroutine profile is read
// at debug level 1 (stacks grouped, collected without stopping the world
// for the whole dump, as level 2 would with thousands of streams open),
// and each goroutine is counted by its outermost frame: the function it
// was started with.

// modulePath is this module's import path: a goroutine started by one of
// its packages belongs to that package's part.
const modulePath = "github.com/switchyard-llm/switchyard/"

// partOf names the part of a goroutine by the function it was started
// with.
func partOf(fn string) string {
	switch {
	case strings.HasPrefix(fn, modulePath):
		pkg := strings.TrimPrefix(fn, modulePath)
		if i := strings.IndexAny(pkg, ".("); i >= 0 {
			pkg = pkg[:i]
		}
		return strings.TrimSuffix(pkg, "/")
	case strings.HasPrefix(fn, "github.com/nats-io/nats-server/"):
		return "nats-server"
	case strings.HasPrefix(fn, "github.com/nats-io/nats.go"), strings.HasPrefix(fn, "github.com/nats-io/nats%2ego"):
		return "nats.go"
	case strings.HasPrefix(fn, "net/http.(*conn)"), strings.HasPrefix(fn, "net/http.(*connReader)"), strings.HasPrefix(fn, "net/http.(*Server)"),
		strings.HasPrefix(fn, "net/http.(*http2serverConn)"), strings.HasPrefix(fn, "net/http.(*http2Server)"):
		return "net/http server"
	case strings.HasPrefix(fn, "net/http."):
		return "net/http client"
	case fn == "":
		return "unknown"
	}
	if i := strings.LastIndexByte(fn, '/'); i >= 0 {
		fn = fn[i+1:]
	}
	if i := strings.IndexByte(fn, '.'); i >= 0 {
		fn = fn[:i]
	}
	return fn
}

// goroutineParts counts the goroutines of a goroutine profile in pprof's
// debug=1 text ("N @ pcs" then one "#" line a frame, innermost first) by
// part; a line it cannot read is an error.
func goroutineParts(profile []byte) (map[string]int, error) {
	parts := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(profile))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	n, outer := 0, ""
	flush := func() {
		if n > 0 {
			parts[partOf(outer)] += n
		}
		n, outer = 0, ""
	}
	for sc.Scan() {
		l := sc.Text()
		f := strings.Fields(l)
		switch {
		case len(f) >= 2 && f[1] == "@":
			flush()
			n, _ = strconv.Atoi(f[0])
		case len(f) >= 3 && f[0] == "#":
			fn := f[2]
			if i := strings.LastIndex(fn, "+0x"); i >= 0 {
				fn = fn[:i]
			}
			outer = fn
		}
	}
	flush()
	return parts, sc.Err()
}

// serveGoroutines answers GET /goroutines with the process's goroutines by
// part.
func serveGoroutines(w http.ResponseWriter, _ *http.Request) {
	var b bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&b, 1); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	parts, err := goroutineParts(b.Bytes())
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	writeJSONTo(w, parts)
}

// perStream renders goroutines by part, per open stream when open > 0.
func perStream(parts map[string]int, open int) string {
	names := make([]string, 0, len(parts))
	total := 0
	for k, n := range parts {
		names = append(names, k)
		total += n
	}
	sort.Slice(names, func(i, j int) bool { return parts[names[i]] > parts[names[j]] })
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d in all", total)
	for _, k := range names {
		fmt.Fprintf(&sb, "; %s %d", k, parts[k])
		if open > 0 {
			fmt.Fprintf(&sb, " (%.2f a stream)", float64(parts[k])/float64(open))
		}
	}
	return sb.String()
}
