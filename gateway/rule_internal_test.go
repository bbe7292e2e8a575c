package gateway

import "testing"

// TestJudge is the before/after-first-byte rule over every failure kind, at
// each point an attempt can fail: before the accept, accepted with nothing
// written, and after bytes reached the client.
func TestJudge(t *testing.T) {
	type when struct {
		accepted, wrote bool
	}
	routing, accepted, streaming := when{}, when{accepted: true}, when{accepted: true, wrote: true}
	held := when{wrote: true} // a stream begun while its cold model loaded
	tests := []struct {
		kind failure
		want map[when]verdict
	}{
		{failNone, map[when]verdict{routing: answered, accepted: answered, streaming: answered}},
		{failOffline, map[when]verdict{routing: httpError}},
		{failNoResponders, map[when]verdict{routing: retry}},
		{failNotRouted, map[when]verdict{routing: retry}},
		{failAcceptTimeout, map[when]verdict{routing: retry}},
		{failRefused, map[when]verdict{routing: retry, accepted: retry}},
		{failSequenceGap, map[when]verdict{accepted: httpError, streaming: endStream}},
		{failSilence, map[when]verdict{accepted: httpError, streaming: endStream}},
		{failEngine, map[when]verdict{accepted: httpError, streaming: endStream}},
		{failLost, map[when]verdict{routing: retry, accepted: httpError, streaming: endStream}},
		{failOverflow, map[when]verdict{routing: httpError, accepted: httpError, streaming: endStream}},
		{failDeadline, map[when]verdict{routing: httpError, accepted: httpError, streaming: endStream}},
		{failClientGone, map[when]verdict{routing: abandon, accepted: abandon, streaming: abandon}},
		{failClientWrite, map[when]verdict{streaming: abandon}},
		{failCold, map[when]verdict{routing: hold, held: hold}},
		{failRejected, map[when]verdict{routing: rejected, held: endStream}},
	}
	for _, tt := range tests {
		for w, want := range tt.want {
			if got := judge(result{kind: tt.kind, accepted: w.accepted, wrote: w.wrote}); got != want {
				t.Errorf("kind %d accepted=%v wrote=%v: %s, want %s", tt.kind, w.accepted, w.wrote, got, want)
			}
		}
	}
}
