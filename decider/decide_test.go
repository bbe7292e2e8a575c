package decider

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/deploy/examples"
	"github.com/switchyard-llm/switchyard/features"
	"github.com/switchyard-llm/switchyard/natsconn/natstest"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// twinDecider is a decider over the dev table with three general replicas
// of llama-3-70b-instruct v1.5.0, a canary of v1.6.0 and a LoRA-capable
// replica of llama-3-8b-instruct, each with a fresh heartbeat: two made
// with the same now hold the same state.
func twinDecider(tb testing.TB, now time.Time) *Decider {
	tb.Helper()
	_, url := natstest.Start(tb)
	nc, err := nats.Connect(url)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	dec, err := New(nc, Config{ID: "twin", Now: func() time.Time { return now }})
	if err != nil {
		tb.Fatal(err)
	}
	snap, errs := table.FromFlat(examples.Flat())
	if len(errs) > 0 {
		tb.Fatal(errs)
	}
	replicas := map[string]string{
		"r-0": `{"model":"llama-3-70b-instruct","version":"v1.5.0","pool":"general","max_batch":32,"max_queue":128,"state":"ready"}`,
		"r-1": `{"model":"llama-3-70b-instruct","version":"v1.5.0","pool":"general","max_batch":32,"max_queue":128,"state":"ready"}`,
		"r-2": `{"model":"llama-3-70b-instruct","version":"v1.5.0","pool":"general","max_batch":32,"max_queue":128,"state":"ready"}`,
		"c-0": `{"model":"llama-3-70b-instruct","version":"v1.6.0","pool":"canary","max_batch":32,"max_queue":128,"state":"ready"}`,
		"s-0": `{"model":"llama-3-8b-instruct","version":"v1.0.0","pool":"general","max_batch":32,"max_queue":128,"max_loras":2,"state":"ready"}`,
	}
	for id, js := range replicas {
		v, err := table.Decode("replicas."+id, []byte(js))
		if err != nil {
			tb.Fatal(err)
		}
		snap.Set(v, nil)
	}
	snap.Revision = 4711
	dec.SetTable(snap)
	for id, r := range snap.Replicas {
		dec.router.ObserveHeartbeat(&subjects.Heartbeat{
			Replica: id, Model: r.Model, Version: r.Version, Pool: r.Pool, State: subjects.StateReady,
			KVUsage: 0.3, Running: 4, Waiting: 1, MaxBatch: 32, MaxQueue: 128, ScrapeOK: true,
		}, now)
	}
	return dec
}

// replicaReads are the headers of a forwarded request the replica's adapter
// reads: the features it needs and the route headers.
var replicaReads = []string{
	subjects.HdrModel, subjects.HdrEndpoint, subjects.HdrPriority, subjects.HdrPromptTokens, subjects.HdrMaxTokens,
	subjects.HdrDeadline, subjects.HdrPrefix, subjects.HdrResume, subjects.HdrResumeTokens, subjects.HdrRequestID,
	subjects.HdrStream, subjects.HdrTraceparent, subjects.HdrRouteModel, subjects.HdrRouteVersion, subjects.HdrRoutePool,
	subjects.HdrRouteReplica, subjects.HdrRouteReason, subjects.HdrRouteLora, subjects.HdrRoutePrefill,
	subjects.HdrRouteTableRev, subjects.HdrTenant, subjects.HdrBroker, subjects.HdrPredictedTTFT,
	subjects.HdrRouteBudget, subjects.HdrPrice, subjects.HdrKeyID, subjects.HdrBudgetHold, subjects.HdrReply,
}

// TestDecideInProcessAsABroker decides each request twice, on two deciders
// holding the same state and drawing the same random numbers: in process
// as a gateway that decides does (Decide), and as a broker does for a
// gateway that sends it the request (Encode, then Handle on llm.gw.<tenant>).
// The decisions must agree in every field.
func TestDecideInProcessAsABroker(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	local, broker := twinDecider(t, now), twinDecider(t, now)
	prompt := []byte(strings.Repeat("You are a careful assistant. ", 400))
	prefix := features.AppendPrefix(nil, prompt, 256, 64)
	// The prefix's blocks are warm on r-2 for both.
	for _, dec := range []*Decider{local, broker} {
		dec.router.ObservePlacement(&subjects.Placement{Model: "llama-3-70b-instruct", Replica: "r-2", Blocks: prefix})
	}
	deadline := time.UnixMilli(now.Add(time.Minute).UnixMilli())
	chat := func(tenant, model string) policy.Request {
		return policy.Request{Tenant: tenant, Model: model, Endpoint: subjects.EndpointChat,
			Priority: subjects.PriorityInteractive, PromptTokens: 40, Deadline: deadline}
	}
	type row struct {
		name   string
		q      policy.Request
		key    string
		reason string // what the route's reason must name
		status int    // the refusal's status; 0: forwarded
	}
	rows := []row{
		{name: "alias", q: chat("default", "chat-large")},
		{name: "model id", q: chat("default", "llama-3-70b-instruct")},
		{name: "session", q: func() policy.Request { q := chat("default", "chat-large"); q.Conversation = "conv-42"; return q }(), reason: policy.ReasonSession},
		{name: "prefix affinity", q: func() policy.Request {
			q := chat("default", "llama-3-70b-instruct")
			q.Prefix, q.PromptTokens = prefix, len(prompt)/4
			return q
		}(), reason: policy.ReasonPrefix},
		{name: "lora", q: chat("team-x", "chat-small"), reason: policy.ReasonLora},
		{name: "max tokens and objective", q: func() policy.Request {
			q := chat("acme", "chat-large")
			q.MaxTokens, q.TTFTObjective = 64, 800*time.Millisecond
			return q
		}()},
		{name: "batch", q: func() policy.Request {
			q := chat("default", "chat-large")
			q.Priority = subjects.PriorityBatch
			return q
		}()},
		{name: "code flag", q: func() policy.Request {
			q := chat("default", "auto")
			q.Features = []string{features.FeatureCode}
			return q
		}()},
		{name: "excluded and avoided", q: func() policy.Request {
			q := chat("default", "llama-3-70b-instruct")
			q.Exclude, q.Avoid = []string{"r-0"}, []string{"r-1"}
			return q
		}()},
		{name: "continuation", q: func() policy.Request {
			q := chat("default", "llama-3-70b-instruct")
			q.ResumeFrom, q.ResumeTokens, q.Exclude = "r-0", 12, []string{"r-0"}
			return q
		}()},
		{name: "key", q: chat("acme", "chat-large"), key: "eb62f102b47160ce1588bde4fd8784c43f691ab45303f6efe78e1e772065d72e"},
		{name: "model too long", q: chat("default", strings.Repeat("m", subjects.MaxModelChars+1)), status: 400},
		{name: "model not allowed", q: chat("intern", "chat-large"), status: 403},
		{name: "unknown model", q: chat("default", "no-such-model"), status: 404},
		// (A body over the size limit is the gateway's 413, answered
		// before any decision.)
		{name: "over the context", q: func() policy.Request { q := chat("default", "code"); q.PromptTokens = 200000; return q }(), status: 400},
		{name: "cold model", q: chat("default", "mixtral"), status: 503},
		{name: "no replicas", q: chat("default", "qwen-coder-32b"), status: 503},
	}
	for i := range 6 { // the trial tenant's quota is 5 requests a minute
		r := row{name: fmt.Sprintf("quota %d", i+1), q: chat("trial", "chat-small")}
		if i == 5 {
			r.status = 429
		}
		rows = append(rows, r)
	}
	for i, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			id := fmt.Sprintf("req-%d", i)
			base := func() nats.Header {
				return nats.Header{subjects.HdrRequestID: {id}, subjects.HdrStream: {"1"},
					subjects.HdrTraceparent: {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
			}
			reply := "_INBOX.gw.1." + id

			local.rng = rand.New(rand.NewPCG(uint64(i), 7))
			sl := NewScratch()
			in := &Request{Policy: r.q, Key: r.key, Header: base(), Reply: reply}
			routeL, errL := local.Decide(sl, in)

			broker.rng = rand.New(rand.NewPCG(uint64(i), 7))
			sb := NewScratch()
			h := base()
			(&Request{Policy: r.q, Key: r.key}).Encode(h)
			a := broker.Handle(sb, "llm.gw."+r.q.Tenant, reply, h, nil)

			if r.status != 0 {
				if errL == nil || a.Do != DoRefuse {
					t.Fatalf("want a %d refusal from both: in process %v (%v), broker %v (%v)", r.status, errL, routeL.Replica, a.Err, a.Do)
				}
				if errL.Status != r.status {
					t.Errorf("status %d, want %d (%s)", errL.Status, r.status, errL.Message)
				}
				if !reflect.DeepEqual(errL, a.Err) {
					t.Errorf("refusals differ:\n in process %+v\n broker     %+v", errL, a.Err)
				}
				return
			}
			if errL != nil || a.Do != DoForward {
				t.Fatalf("want both forwarded: in process %v, broker %v (%v)", errL, a.Do, a.Err)
			}
			routeB := a.Route
			for _, f := range []struct {
				name string
				l, b any
			}{
				{"replica", routeL.Replica, routeB.Replica},
				{"pool", routeL.Pool, routeB.Pool},
				{"reason", routeL.Reason, routeB.Reason},
				{"budget", routeL.Budget, routeB.Budget},
				{"placement", routeL.Placement, routeB.Placement},
				{"explanation", routeL.Decision.Wire(&sl.req), routeB.Decision.Wire(&sb.req)},
				{"subject", routeL.Msg.Subject, routeB.Msg.Subject},
				{"reply", routeL.Msg.Reply, routeB.Msg.Reply},
			} {
				if !reflect.DeepEqual(f.l, f.b) {
					t.Errorf("%s differs:\n in process %+v\n broker     %+v", f.name, f.l, f.b)
				}
			}
			for _, k := range replicaReads {
				if l, b := routeL.Msg.Header.Values(k), routeB.Msg.Header.Values(k); !reflect.DeepEqual(l, b) {
					t.Errorf("header %s differs: in process %q, broker %q", k, l, b)
				}
			}
			if !strings.Contains(routeL.Reason, r.reason) {
				t.Errorf("reason %q, want one with %q", routeL.Reason, r.reason)
			}
			if routeL.Replica == "" || routeL.Msg.Header.Get(subjects.HdrRouteReplica) != routeL.Replica {
				t.Errorf("route names replica %q, its header %q", routeL.Replica, routeL.Msg.Header.Get(subjects.HdrRouteReplica))
			}
			if routeL.Msg.Header.Get(subjects.HdrKey) != "" || routeB.Msg.Header.Get(subjects.HdrKey) != "" {
				t.Error("the key's hash went on to the replica")
			}
		})
	}
}

// BenchmarkDecideInProcess is a gateway's decision per request, NATS I/O
// excluded: typed, as a gateway that decides makes it (the features the
// replica reads and the route headers written into the request's header),
// and through headers, as it was made before and as a broker makes it (the
// features encoded, Handle decoding them and writing the route headers).
func BenchmarkDecideInProcess(b *testing.B) {
	for _, via := range []string{"typed", "headers"} {
		for _, n := range []int{8, 1024} {
			b.Run(fmt.Sprintf("via=%s/candidates=%d", via, n), func(b *testing.B) {
				now := time.Unix(1_800_000_000, 0)
				dec := newTestBroker(b, n, now)
				s := NewScratch()
				sl := NewScratch()
				// The features of the gateway's request, typed.
				if e := dec.fillRequest(sl, "default", false, gatewayHeaders(), nil); e != nil {
					b.Fatal(e)
				}
				in := &Request{Policy: sl.req, Reply: "_INBOX.gw.1", Body: []byte(`{"model":"chat-large"}`)}
				in.Policy.Prompt = nil
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					// Each request's header is new, the request id in it.
					h := nats.Header{subjects.HdrRequestID: {"req-1"}}
					in.Policy.Conversation = strconv.Itoa(i & 1023)
					if via == "typed" {
						in.Header = h
						if _, e := dec.Decide(s, in); e != nil {
							b.Fatal(e)
						}
					} else {
						in.Encode(h)
						if a := dec.Handle(s, "llm.gw.default", in.Reply, h, in.Body); a.Do != DoForward {
							b.Fatal(a.Err)
						}
					}
					for len(dec.out) > 0 {
						<-dec.out
					}
				}
			})
		}
	}
}
