package reply

// Leg is the answer to a prefill leg (docs/protocol.md, "Disaggregated
// serving"), the whole of it in one message: a head with the prefill
// engine's status and body that is also the end. A prefill replica that
// refuses a leg answers with a Rejection instead; Decode reads either, and
// the status is the answer's.
func Leg(status int, body []byte) Frame {
	return Frame{Kind: Head, Seq: 1, Status: status, End: true, Body: body}
}
