package subjects_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
)

func TestValidToken(t *testing.T) {
	for _, ok := range []string{"a", "l70-gen-0", "team_x", strings.Repeat("z", 64)} {
		if err := subjects.ValidToken(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "a.b", "a b", "a*", ">", "ü", strings.Repeat("z", 65)} {
		if err := subjects.ValidToken(bad); !errors.Is(err, subjects.ErrBadToken) {
			t.Errorf("%q accepted (err %v)", bad, err)
		}
	}
}

func TestSubjects(t *testing.T) {
	s := subjects.New("")
	for got, want := range map[string]string{
		s.Route("acme"):                        "llm.route.acme",
		s.Replica("r-1"):                       "llm.replica.r-1",
		s.ReplicaCancel("r-1"):                 "llm.replica.r-1.cancel",
		s.Prefill("p-1", "d-1"):                "llm.replica.p-1.prefill.d-1",
		s.PrefillAll("p-1"):                    "llm.replica.p-1.prefill.*",
		s.PrefillCancel("p-1", "d-1"):          "llm.replica.p-1.prefill.cancel.d-1",
		s.PrefillCancelAll("p-1"):              "llm.replica.p-1.prefill.cancel.*",
		s.Heartbeat("r-1"):                     "llm.heartbeat.r-1",
		s.Load("r-1"):                          "llm.load.r-1",
		s.Placement("llama-3.1-8b"):            "llm.placement.llama-3_1-8b",
		s.Decision("general"):                  "llm.decision.general",
		s.Usage("acme"):                        "llm.usage.acme",
		s.Explain("acme"):                      "llm.explain.acme",
		subjects.New("sy").RouteAll():          "sy.route.*",
		subjects.TenantFromRoute(s.Route("t")): "t",
		s.RoutedPrefix("gw1"):                  "llm.routed.gw1",
		// A gateway hears a routed notice where only brokers publish; a
		// direct client on its own inbox.
		s.RoutedFor("llm.reply.gw1.req-1"): "llm.routed.gw1.req-1",
		s.RoutedFor("_INBOX.abc"):          "_INBOX.abc",
		s.RoutedFor("_R_.abc.def"):         "_R_.abc.def",
		s.RoutedFor("llm.reply."):          "llm.reply.",
	} {
		if got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
}

func TestRestrictive(t *testing.T) {
	for _, tc := range [][3]string{
		{"ready", "draining", "draining"},
		{"disabled", "ready", "disabled"},
		{"loading", "ready", "loading"},
		{"draining", "disabled", "disabled"},
		{"", "ready", "ready"},
		{"ready", "bogus", "bogus"},
	} {
		if got := subjects.Restrictive(tc[0], tc[1]); got != tc[2] {
			t.Errorf("Restrictive(%q, %q) = %q, want %q", tc[0], tc[1], got, tc[2])
		}
	}
}

func TestAPIErrorShape(t *testing.T) {
	e := subjects.NewError(503, subjects.CodeAllReplicasBusy, "busy")
	e.RetryAfter = 1500 * time.Millisecond
	var body struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    string  `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(e.Body(), &body); err != nil {
		t.Fatal(err)
	}
	if body.Error.Message != "busy" || body.Error.Type != "server_error" || body.Error.Code != "all_replicas_busy" || body.Error.Param != nil {
		t.Errorf("body %s", e.Body())
	}
	h := e.RetryAfterHeaders()
	if len(h) != 2 || h[0] != [2]string{"Retry-After", "2"} || h[1] != [2]string{"retry-after-ms", "1500"} {
		t.Errorf("retry headers %v: Retry-After rounds up to whole seconds", h)
	}
}
