package gateway

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
)

// when is where an attempt ended and what the request has left.
type when struct {
	accepted, wrote bool
	resumable       bool // the answer has a continuation (result.cont)
	spent           bool // the request's retries and resumes are spent
}

func (w when) res() when   { w.resumable = true; return w }
func (w when) spend() when { w.spent = true; return w }

type judgeRow struct {
	kind failure
	want map[when]verdict
}

// judgeRows is the relay's rule, a row per failure kind.
func judgeRows() []judgeRow {
	routing := when{}                              // before the accept
	accepted := when{accepted: true}               // accepted, nothing written
	streaming := when{accepted: true, wrote: true} // after the first byte
	// before the accept of an attempt whose stream the client has: a
	// continuation, or a stream begun while its cold model loaded
	begun := when{wrote: true}
	return []judgeRow{
		{failNone, map[when]verdict{routing: answered, accepted: answered, streaming: answered, streaming.res(): answered}},
		{failOffline, map[when]verdict{routing: httpError, routing.res(): httpError, begun: endStream}},
		{failNoResponders, map[when]verdict{routing: retry, routing.spend(): httpError, routing.res(): retry, begun: retry, begun.spend(): endStream}},
		{failBrokersBack, map[when]verdict{routing: wait, routing.spend(): wait, routing.res(): wait, begun: wait}},
		{failReplicasBack, map[when]verdict{routing: wait, routing.spend(): wait, routing.res(): wait, begun: wait}},
		{failNotRouted, map[when]verdict{routing: retry, routing.spend(): httpError, routing.res(): retry, begun.spend(): endStream}},
		{failAcceptTimeout, map[when]verdict{routing: retry, routing.spend(): httpError, routing.res(): retry, begun.spend(): endStream}},
		{failRefused, map[when]verdict{routing: retry, accepted: retry, accepted.res(): retry, accepted.spend(): httpError, streaming: retry, streaming.spend(): endStream}},
		{failSequenceGap, map[when]verdict{accepted: httpError, accepted.res(): resume, accepted.res().spend(): httpError, streaming: endStream, streaming.res(): resume, streaming.res().spend(): endStream}},
		{failSilence, map[when]verdict{accepted: httpError, accepted.res(): resume, streaming: endStream, streaming.res(): resume, streaming.res().spend(): endStream}},
		{failGone, map[when]verdict{accepted: httpError, accepted.res(): resume, streaming: endStream, streaming.res(): resume, streaming.res().spend(): endStream}},
		{failEngine, map[when]verdict{accepted: httpError, accepted.res(): resume, streaming: endStream, streaming.res(): resume, streaming.res().spend(): endStream}},
		{failHandover, map[when]verdict{accepted: httpError, accepted.res(): resume, streaming: endStream, streaming.res(): resume, streaming.res().spend(): endStream}},
		{failLost, map[when]verdict{routing: retry, routing.spend(): httpError, accepted: httpError, accepted.res(): httpError, streaming: endStream, streaming.res(): endStream}},
		{failOverflow, map[when]verdict{routing: httpError, accepted: httpError, streaming: endStream, streaming.res(): endStream}},
		{failDeadline, map[when]verdict{routing: httpError, accepted: httpError, streaming: endStream, streaming.res(): endStream}},
		{failClientGone, map[when]verdict{routing: abandon, accepted: abandon, streaming: abandon, streaming.res(): abandon}},
		{failClientWrite, map[when]verdict{streaming: abandon, streaming.res(): abandon}},
		{failUnplaced, map[when]verdict{routing: httpError, begun: endStream, begun.res(): endStream}},
		{failCold, map[when]verdict{routing: hold, routing.spend(): hold, routing.res(): hold, begun: hold}},
		{failRejected, map[when]verdict{routing: rejected, routing.res(): rejected, begun: endStream}},
	}
}

// TestJudge is the before/after-first-byte rule over every failure kind, at
// each point an attempt can fail, with and without a continuation, and with
// the request's budgets open and spent.
func TestJudge(t *testing.T) {
	for _, tt := range judgeRows() {
		var with, without bool
		for w, want := range tt.want {
			with, without = with || w.resumable, without || !w.resumable
			b := budgets{retries: 2, resumes: 1, shared: &retryBudget{ratio: 0.2}}
			if w.spent {
				b.retries, b.resumes = 0, 0
			}
			r := result{kind: tt.kind, accepted: w.accepted, wrote: w.wrote}
			if w.resumable {
				r.cont = []byte(`{}`)
			}
			if got := judge(r, &b); got != want {
				t.Errorf("kind %d %+v: %s, want %s", tt.kind, w, got, want)
			}
		}
		if !with || !without {
			t.Errorf("kind %d: rows with a continuation %v, without %v; want both", tt.kind, with, without)
		}
	}
}

// TestJudgeSharedBudget: a retry holds a unit of the gateway's retry
// budget and is refused when it is full, but for one after no-responders;
// a resume needs it open but holds none.
func TestJudgeSharedBudget(t *testing.T) {
	shared := &retryBudget{ratio: 0.2} // at least 3 at once
	b := budgets{retries: 5, resumes: 1, shared: shared}
	refused := result{kind: failRefused}
	for i := range 3 {
		if v := judge(refused, &b); v != retry {
			t.Fatalf("retry %d: %s, want retry", i+1, v)
		}
	}
	if v := judge(refused, &b); v != httpError {
		t.Errorf("a retry with the budget full: %s, want http_error", v)
	}
	// An attempt nothing listened for reached no replica: its retry adds
	// no work, and spends the request's retries but no unit.
	unheard := budgets{retries: 1, shared: shared}
	if v := judge(result{kind: failNoResponders}, &unheard); v != retry || unheard.held {
		t.Errorf("a retry after no-responders with the budget full: %s, holding a unit %v; want retry, holding none", v, unheard.held)
	}
	if v := judge(result{kind: failNoResponders}, &unheard); v != httpError {
		t.Errorf("a second retry after no-responders, the request's one spent: %s, want http_error", v)
	}
	unheard.release()
	if n := shared.retrying.Load(); n != 3 {
		t.Errorf("%d units held after a retry that holds none ended, want the 3 retries'", n)
	}
	silent := result{kind: failSilence, accepted: true, wrote: true, cont: []byte(`{}`)}
	if v := judge(silent, &b); v != endStream {
		t.Errorf("a resume with the budget full: %s, want end_stream", v)
	}
	shared.release()
	if v := judge(silent, &b); v != resume {
		t.Errorf("a resume with the budget open: %s, want resume", v)
	}
	if n := shared.retrying.Load(); n != 2 {
		t.Errorf("%d units held after the resume, want the 2 retries' left", n)
	}
	if v := judge(silent, &b); v != endStream {
		t.Errorf("a second resume: %s, want end_stream (one is allowed)", v)
	}
}

// TestJudgeRowsEveryKind reads the failure kinds from rule.go: a kind
// without a row in judgeRows fails here.
func TestJudgeRowsEveryKind(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "rule.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST || len(gd.Specs) == 0 {
			continue
		}
		if vs := gd.Specs[0].(*ast.ValueSpec); vs.Type == nil || types(vs.Type) != "failure" {
			continue
		}
		for _, s := range gd.Specs {
			for _, n := range s.(*ast.ValueSpec).Names {
				kinds = append(kinds, n.Name)
			}
		}
	}
	if len(kinds) < 2 {
		t.Fatalf("found %d failure kinds in rule.go", len(kinds))
	}
	rows := map[failure]bool{}
	for _, r := range judgeRows() {
		rows[r.kind] = true
	}
	for i, name := range kinds { // iota: the i-th name is kind i
		if !rows[failure(i)] {
			t.Errorf("%s has no row in judgeRows", name)
		}
	}
	if len(rows) != len(kinds) {
		t.Errorf("%d rows for %d kinds", len(rows), len(kinds))
	}
}

func types(e ast.Expr) string {
	if id, ok := e.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// TestNamedErrors: a failure made specific is still its name for
// errors.Is, and the client reads it in the OpenAI shape.
func TestNamedErrors(t *testing.T) {
	e := errSilence.about("l8-gen-0")
	if !errors.Is(e, errSilence) || errors.Is(e, errGone) || errors.Is(errGone.about("x"), errSilence) {
		t.Errorf("errors.Is on %v: want errSilence only", e)
	}
	if a := apiError(e); a.Status != 504 || a.Code != subjects.CodeUpstreamTimeout || a.Message != "replica l8-gen-0 went silent" {
		t.Errorf("apiError(%v) = %+v", e, a)
	}
	if a := apiError(errOffline); a.Status != 503 || a.RetryAfter != time.Second || a.Message != "the gateway is not connected to NATS" {
		t.Errorf("apiError(errOffline) = %+v", a)
	}
	busy := errBusy.about("r2", " (429)")
	busy.retryAfter = 7 * time.Second
	if a := apiError(fmt.Errorf("attempt 2: %w", busy)); a.Code != subjects.CodeAllReplicasBusy || a.RetryAfter != 7*time.Second || a.Message != "replica r2 turned the request away (429)" {
		t.Errorf("apiError(wrapped busy) = %+v", a)
	}
	wire := subjects.NewError(400, "bad", "from the replica")
	if a := apiError(wire); a == wire || a.Status != 400 || a.Code != "bad" || a.Message != wire.Message {
		t.Errorf("apiError(a replica's error) = %+v, want a copy of %+v", a, wire)
	}
	if apiError(nil) != nil {
		t.Error("apiError(nil) is not nil")
	}
}

// TestReplicasBackWindow: a request waits for its gone replicas only
// within the offline wait after the first, before its deadline, and while
// one of them still counts as gone: one excluded since for a failure of
// its own is no reason to wait.
func TestReplicasBackWindow(t *testing.T) {
	now := time.Now()
	const wait = 3 * time.Second
	fresh := func() *upstream {
		u := &upstream{deadline: now.Add(time.Minute)}
		u.gone.met("r-0", now.Add(-time.Second))
		return u
	}
	if u := fresh(); !u.replicasBack(wait, now) {
		t.Error("a replica gone a second ago: no wait, want one")
	}
	if u := fresh(); u.replicasBack(wait, now.Add(2*time.Second)) {
		t.Error("past the offline wait after the first gone: a wait, want none")
	}
	u := fresh()
	u.deadline = now.Add(offlinePoll / 2)
	if u.replicasBack(wait, now) {
		t.Error("the deadline within a poll: a wait, want none")
	}
	u = fresh()
	u.excludeFailed("r-0")
	if u.replicasBack(wait, now) || len(u.exclude) != 1 {
		t.Errorf("the gone replica since excluded for a failure of its own: wait %v, exclude %q; want no wait, it excluded", u.replicasBack(wait, now), u.exclude)
	}
}
