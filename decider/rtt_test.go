package decider

import (
	"encoding/json"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/switchyard-llm/switchyard/subjects"
)

// pingAnswer is replica's adapter's answer to a ping, naming region.
func pingAnswer(t *testing.T, replica, region string) []byte {
	t.Helper()
	b, err := json.Marshal(micro.Ping{Type: micro.PingResponseType, ServiceIdentity: micro.ServiceIdentity{
		Name: subjects.AdapterService, ID: "x", Version: "1", Metadata: map[string]string{"replica": replica, "region": region}}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

const ms = time.Millisecond

// TestRegionRTT: per round, the quickest answer of each region; over the
// rounds, the least; the round trip to a region is its adapters' less the
// decider's own region's, or its adapters' as they are without an answer
// from its own. An answer that is not an adapter's, names no known
// region, speaks for a replica not heard there or twice, or comes back out
// of range is not counted.
func TestRegionRTT(t *testing.T) {
	// The router has heard replicas <region>-<n> in their regions.
	heard := func(replica string) (string, bool) {
		r, _, ok := strings.Cut(replica, "-")
		return r, ok && r != "mars"
	}
	p := rttProbe{local: "eu", regionOf: heard}
	known := []string{"eu", "us", "ap"}
	round := func(answers map[string][]time.Duration) map[string]time.Duration {
		p.start(known)
		for r, ds := range answers {
			for i, d := range ds {
				if !p.answer(pingAnswer(t, r+"-"+strconv.Itoa(i), r), d) {
					t.Fatalf("an answer from %s after %v not counted", r, d)
				}
			}
		}
		return p.end()
	}
	// Without an answer from eu, us as it is.
	if got := round(map[string][]time.Duration{"us": {90 * ms, 80 * ms}}); !maps.Equal(got, map[string]time.Duration{"us": 80 * ms}) {
		t.Errorf("us alone: %v, want us 80ms", got)
	}
	// eu's own hop taken out: 80ms (the last rounds' least) less 2ms.
	got := round(map[string][]time.Duration{"eu": {3 * ms, 2 * ms}, "us": {95 * ms}, "ap": {1 * ms}})
	if want := map[string]time.Duration{"us": 78 * ms, "ap": 0}; !maps.Equal(got, want) {
		t.Errorf("eu 2ms, us 95ms (80ms a round before), ap 1ms: %v, want %v", got, want)
	}
	// The rounds' least: a queue in one round does not count; a round
	// past the window is forgotten.
	for range rttRounds - 1 {
		round(map[string][]time.Duration{"eu": {5 * ms}, "us": {300 * ms}})
	}
	if got := round(map[string][]time.Duration{"eu": {5 * ms}, "us": {150 * ms}}); got["us"] != 145*ms {
		t.Errorf("after the window: us %v, want 150ms less 5ms", got["us"])
	}
	for range rttRounds {
		round(nil)
	}
	if got := round(nil); len(got) != 0 {
		t.Errorf("no answers for %d rounds: %v, want nothing measured", rttRounds, got)
	}

	// What a sender could lie about.
	p.start(known)
	if !p.answer(pingAnswer(t, "us-0", "us"), 50*ms) {
		t.Fatal("us-0's answer not counted")
	}
	lies := map[string][]byte{
		"no region":                                  pingAnswer(t, "us-1", ""),
		"a bad token":                                pingAnswer(t, "us-1", "us.>"),
		"an unknown one":                             pingAnswer(t, "mars-1", "mars"),
		"no replica":                                 pingAnswer(t, "", "us"),
		"a replica heard in another region":          pingAnswer(t, "eu-1", "us"),
		"a replica the router has not heard":         pingAnswer(t, "mars-2", "us"),
		"a replica that answered already this round": pingAnswer(t, "us-0", "us"),
		"another service":                            []byte(`{"type": "io.nats.micro.v1.ping_response", "name": "switchyard-broker", "metadata": {"region": "us"}}`),
		"another type":                               []byte(`{"type": "io.nats.micro.v1.info_response", "name": "switchyard-adapter", "metadata": {"region": "us"}}`),
		"not JSON":                                   []byte(`us`),
		"too large":                                  append(pingAnswer(t, "us-1", "us"), []byte(strings.Repeat(" ", rttMaxBytes))...),
	}
	for what, data := range lies {
		if p.answer(data, 10*ms) {
			t.Errorf("an answer with %s counted", what)
		}
	}
	if p.answer(pingAnswer(t, "us-2", "us"), rttWait+ms) || p.answer(pingAnswer(t, "us-3", "us"), 0) {
		t.Error("an answer out of (0, rttWait] counted")
	}
	if got := p.end(); got["us"] != 50*ms {
		t.Errorf("lies measured %v, want us-0's 50ms alone", got)
	}
}
