package adapter

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/switchyard-llm/switchyard/subjects"
	replyproto "github.com/switchyard-llm/switchyard/subjects/reply"
)

// Disaggregated serving (docs/protocol.md, "Disaggregated serving"). The
// broker names the prefill replica of a split request in
// Llm-Route-Prefill; the decode replica's adapter, like llm-d's sidecar,
// sends the prefill leg to that replica's adapter on
// llm.replica.<prefill>.prefill.<decode>, takes the kv_transfer_params of its
// answer and calls its own engine with them. A leg that is refused or
// fails before answering leaves the decode replica to prefill itself, and
// the head says so. The prefill adapter calls its engine with max_tokens 1,
// not streamed, and reports no usage: the request is counted once, by the
// decode leg.

// maxPrefillWait bounds a prefill leg without a deadline of its own.
const maxPrefillWait = 2 * time.Minute

// maxPrefillAnswer bounds a prefill's answer (its block ids grow with the
// prompt: about 50 KB at 128k tokens).
const maxPrefillAnswer = 1 << 20

// Why a split request was prefilled by its decode replica after all
// (switchyard_adapter_prefill_fallbacks_total, and the reason's suffix).
const (
	wholeRefused        = "refused"         // no prefill replica answered, or it turned the leg away
	wholeFailed         = "failed"          // the prefill engine failed or the leg timed out
	wholeBadAnswer      = "bad_answer"      // the answer held no usable kv_transfer_params
	wholeDecodeRejected = "decode_rejected" // this engine refused the parameters (blocks unknown or expired)
)

// prefillKey names a prefill leg in flight: the decode replica that sent it
// and its request id, both as the subjects prove them. A cancel reaches
// only the leg of the decode replica its subject proves it comes from, and
// two decode replicas' legs never collide, whatever ids they carry: no
// adapter can take another's request id first and have that replica's
// leg refused.
type prefillKey struct{ decode, id string }

// legBounds are the most prefill legs this replica keeps in flight from
// one decode replica, and from all of them. Any adapter may send legs in
// its own name (docs/security.md), so without a bound one compromised
// adapter could fill the engine's batch and its queue with legs, and every
// other decode replica's legs would wait behind them. One sender gets at
// most the replica's max batch (--max-batch, else the engine's
// max_num_seqs): a leg beyond a full batch can only wait in the engine's
// queue, where it holds a place another sender's leg would wait in, and a
// decode replica whose leg is refused prefills the request itself at once,
// as it does for any refused leg. All senders together get the max batch
// and the max queue behind it: what the replica declares it holds
// (max_batch, max_queue), the numbers brokers weigh it full by.
func (a *Adapter) legBounds() (perSender, total int) {
	lim := a.engineLimits()
	return lim.batch, lim.batch + lim.queue
}

// onPrefill is the prefill endpoint of a prefill replica: it serves
// prefill legs. The subject's last token is the decode replica that sent
// the leg, which only that replica's adapter may publish
// (docs/security.md); a header naming a replica proves nothing and is not
// read. Only that replica's adapter can cancel the leg (onPrefillCancel).
func (a *Adapter) onPrefill(r micro.Request) {
	h := nats.Header(r.Headers())
	subj := r.Subject()
	id, decode := h.Get(subjects.HdrRequestID), subj[strings.LastIndexByte(subj, '.')+1:]
	if h.Get(subjects.HdrPrefillCancel) != "" {
		// A cancel has its own subject (onPrefillCancel); one here is
		// neither a leg nor believed.
		a.log.Warn("a prefill cancel on the leg subject is not believed", "request", id)
		return
	}
	reply := r.Reply()
	if !strings.HasPrefix(reply, "_INBOX.") {
		a.log.Warn("prefill leg without an inbox reply dropped", "reply", reply, "request", id)
		return
	}
	if subjects.ValidToken(id) != nil || subjects.ValidToken(decode) != nil {
		a.metrics.prefillLegs.WithLabelValues("refused").Inc()
		a.answerPrefill(reply, http.StatusBadRequest, subjects.NewError(http.StatusBadRequest, subjects.CodeInvalidRequest,
			"a prefill leg names its request ("+subjects.HdrRequestID+") and, last in its subject, its decode replica").Body())
		return
	}
	key := prefillKey{decode: decode, id: id}
	perSender, total := a.legBounds()
	ctx, release, busy := a.book.takeLeg(key, perSender, total, a.cfg.Replica)
	if busy != nil {
		a.metrics.prefillLegs.WithLabelValues("refused").Inc()
		a.refuseLeg(reply, busy)
		return
	}
	go func() {
		defer release()
		a.servePrefill(ctx, reply, h, r.Data())
	}()
}

// onPrefillCancel cancels a prefill leg: the one named by Llm-Request-Id
// that the decode replica of the subject's last token sent. Only that
// replica's adapter may publish the subject (docs/security.md), so a cancel
// is believed exactly as far as the permission proves who sent it.
func (a *Adapter) onPrefillCancel(r micro.Request) {
	subj := r.Subject()
	decode := subj[strings.LastIndexByte(subj, '.')+1:]
	key := prefillKey{decode: decode, id: r.Headers().Get(subjects.HdrRequestID)}
	a.book.cancelLeg(key)
}

// servePrefill runs one prefill leg on the engine and answers with the
// engine's status and body.
func (a *Adapter) servePrefill(ctx context.Context, reply string, h nats.Header, body []byte) {
	endpoint := h.Get(subjects.HdrEndpoint)
	if endpoint != subjects.EndpointChat && endpoint != subjects.EndpointCompletions {
		a.metrics.prefillLegs.WithLabelValues("refused").Inc()
		a.answerPrefill(reply, http.StatusBadRequest, subjects.NewError(http.StatusBadRequest, subjects.CodeInvalidRequest,
			"a prefill leg is a chat or completions request").Body())
		return
	}
	ctx, cancel := legDeadline(ctx, h)
	defer cancel()
	b, e := prefillBody(body, a.servedModel(h), endpoint == subjects.EndpointChat, a.priorityField(h))
	if e != nil {
		a.metrics.prefillLegs.WithLabelValues("refused").Inc()
		a.answerPrefill(reply, e.Status, e.Body())
		return
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.cfg.EngineURL+endpoint, bytes.NewReader(b))
	if err != nil {
		a.answerPrefill(reply, http.StatusBadRequest, subjects.NewError(http.StatusBadRequest, subjects.CodeInvalidRequest, err.Error()).Body())
		return
	}
	req.Header.Set("Content-Type", "application/json")
	a.continueTrace(ctx, h, req)
	resp, err := a.engine.client.Do(req)
	resp = a.engine.judgeAnswer(req, resp, err, h.Get(subjects.HdrRouteLora) != "", false)
	if err != nil {
		outcome := "error"
		if ctx.Err() != nil {
			outcome = "cancelled"
		}
		a.metrics.prefillLegs.WithLabelValues(outcome).Inc()
		e := callError(ctx, err)
		a.answerPrefill(reply, e.Status, e.Body())
		return
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, maxPrefillAnswer+1))
	switch {
	case err != nil || len(out) > maxPrefillAnswer:
		a.metrics.prefillLegs.WithLabelValues("error").Inc()
		a.answerPrefill(reply, http.StatusBadGateway, subjects.NewError(http.StatusBadGateway, subjects.CodeUpstreamError,
			"the prefill answer could not be read whole").Body())
		return
	case resp.StatusCode != http.StatusOK:
		a.metrics.prefillLegs.WithLabelValues("error").Inc()
	default:
		a.metrics.prefillLegs.WithLabelValues("ok").Inc()
	}
	a.answerPrefill(reply, resp.StatusCode, out)
}

// answerPrefill answers a leg with the engine's status and body, or the
// status and error body of a leg that did not reach the engine.
func (a *Adapter) answerPrefill(reply string, status int, body []byte) {
	f := replyproto.Leg(status, body)
	if err := a.nc.PublishMsg(f.Msg(reply)); err != nil {
		a.log.Warn("prefill answer not sent", "err", err)
	}
}

// refuseLeg answers a leg with e as the reply protocol's rejection: its
// status, the OpenAI error body and the Retry-After e asks for.
func (a *Adapter) refuseLeg(reply string, e *subjects.APIError) {
	f := replyproto.Rejection(e)
	if err := a.nc.PublishMsg(f.Msg(reply)); err != nil {
		a.log.Warn("prefill refusal not sent", "err", err)
	}
}

// legDeadline bounds a leg by the request's deadline, else maxPrefillWait.
func legDeadline(ctx context.Context, h nats.Header) (context.Context, context.CancelFunc) {
	at := time.Now().Add(maxPrefillWait)
	if d, e := subjects.ParseDeadline(h.Get(subjects.HdrDeadline)); e == nil && !d.IsZero() && d.Before(at) {
		at = d
	}
	return context.WithDeadline(ctx, at)
}

// prefillBody is the body of a prefill leg, as vLLM's NIXL proxies write
// it: the request with one token to generate, not streamed, and
// kv_transfer_params asking the engine to hold the blocks for a remote
// decode; priority is the engine's priority field (priorityField).
func prefillBody(body []byte, model string, chat bool, priority bodyField) ([]byte, *subjects.APIError) {
	quoted, _ := quote(model)
	maxKeys := []string{"max_tokens"}
	if chat {
		maxKeys = append(maxKeys, "max_completion_tokens")
	}
	out, _, err := setFields(body, []bodyField{
		{keys: []string{"model"}, value: quoted},
		{keys: maxKeys, value: []byte("1")},
		{keys: []string{"stream"}, value: []byte("false")},
		{keys: []string{"stream_options"}, value: []byte("null")},
		{keys: []string{"kv_transfer_params"}, value: []byte(`{"do_remote_decode":true,"do_remote_prefill":false,` +
			`"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)},
		priority,
	})
	if err != nil {
		return nil, subjects.NewError(http.StatusBadRequest, subjects.CodeInvalidRequest, err.Error())
	}
	return out, nil
}

// prefillLeg runs the prefill leg of a split request and returns the
// kv_transfer_params the decode engine is to be called with; nil when the
// request is served whole, with the cause when it was to be split. When
// the leg is not used it takes Llm-Route-Prefill off h and says why in
// Llm-Route-Reason, so the head explains what happened.
func (a *Adapter) prefillLeg(ctx context.Context, h nats.Header, body []byte) []byte {
	target := h.Get(subjects.HdrRoutePrefill)
	if target == "" {
		return nil
	}
	endpoint := h.Get(subjects.HdrEndpoint)
	if subjects.ValidToken(target) != nil || h.Get(subjects.HdrMethod) != "" ||
		endpoint != subjects.EndpointChat && endpoint != subjects.EndpointCompletions || h.Get(subjects.HdrResume) != "" {
		a.servedWhole(h, wholeRefused)
		return nil
	}
	legCtx, cancel := legDeadline(ctx, h)
	defer cancel()
	m := &nats.Msg{Subject: a.subj.Prefill(target, a.cfg.Replica), Data: body, Header: nats.Header{}}
	for _, k := range []string{subjects.HdrRequestID, subjects.HdrEndpoint, subjects.HdrRouteLora, subjects.HdrDeadline, subjects.HdrPriority, subjects.HdrTraceparent, subjects.HdrTracestate} {
		if v := h.Get(k); v != "" {
			m.Header.Set(k, v)
		}
	}
	resp, err := a.nc.RequestMsgWithContext(legCtx, m)
	if err != nil {
		if !errors.Is(err, nats.ErrNoResponders) {
			// The leg may still run there: stop it, on the subject only
			// this adapter may publish.
			cm := &nats.Msg{Subject: a.subj.PrefillCancel(target, a.cfg.Replica), Header: nats.Header{subjects.HdrRequestID: {h.Get(subjects.HdrRequestID)}, subjects.HdrPrefillCancel: {"1"}}}
			_ = a.nc.PublishMsg(cm)
		}
		switch {
		case ctx.Err() != nil:
			// The client is gone: there is nobody to serve whole.
		case errors.Is(err, nats.ErrNoResponders):
			a.servedWhole(h, wholeRefused)
		default:
			a.servedWhole(h, wholeFailed)
		}
		return nil
	}
	status := replyproto.Decode(resp).Status
	if status == 0 {
		// A prefill replica of an earlier version answers with Llm-Status
		// alone, no Llm-Seq: read it as it was sent.
		status, _ = strconv.Atoi(resp.Header.Get(subjects.HdrStatus))
	}
	switch status {
	case http.StatusOK:
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		a.servedWhole(h, wholeRefused)
		return nil
	default:
		a.log.Warn("prefill leg failed", "request", h.Get(subjects.HdrRequestID), "prefill", target, "status", status)
		a.servedWhole(h, wholeFailed)
		return nil
	}
	kv, ok := decodeParams(resp.Data)
	if !ok {
		a.servedWhole(h, wholeBadAnswer)
		return nil
	}
	return kv
}

// decodeParams turns a prefill's answer into the decode leg's
// kv_transfer_params: the prefill's, with do_remote_prefill set.
func decodeParams(answer []byte) ([]byte, bool) {
	var a struct {
		KV map[string]json.RawMessage `json:"kv_transfer_params"`
	}
	if json.Unmarshal(answer, &a) != nil || a.KV == nil {
		return nil, false
	}
	for _, k := range []string{"remote_engine_id", "remote_block_ids", "remote_host", "remote_port"} {
		if v := a.KV[k]; len(v) == 0 || string(v) == "null" {
			return nil, false
		}
	}
	a.KV["do_remote_prefill"], a.KV["do_remote_decode"] = json.RawMessage("true"), json.RawMessage("false")
	b, err := json.Marshal(a.KV)
	return b, err == nil
}

// servedWhole records that a split request is prefilled here after all:
// counted, and explained on the head (no Llm-Route-Prefill, and the
// reason's "+prefill-whole:<cause>").
func (a *Adapter) servedWhole(h nats.Header, cause string) {
	a.metrics.prefillWhole.WithLabelValues(cause).Inc()
	a.log.Info("split request prefilled by its decode replica", "request", h.Get(subjects.HdrRequestID),
		"prefill", h.Get(subjects.HdrRoutePrefill), "cause", cause)
	delete(h, subjects.HdrRoutePrefill)
	reason := h.Get(subjects.HdrRouteReason)
	h.Set(subjects.HdrRouteReason, strings.TrimPrefix(reason+"+prefill-whole:"+cause, "+"))
}
