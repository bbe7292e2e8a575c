// Package subjects is the wire contract between Switchyard's parts: subject
// names, header names, the reply protocol and the messages that cross NATS
// (heartbeats, decisions, placements, usage). It imports nothing but the
// standard library, so every part, pure or not, can share it.
package subjects

import (
	"errors"
	"fmt"
	"strings"
)

// DefaultPrefix is the first token of every Switchyard subject (--prefix).
const DefaultPrefix = "llm"

// Queue groups and micro service names.
const (
	BrokerService  = "switchyard-broker"
	AdapterService = "switchyard-adapter"
	BrokerQueue    = "switchyard-broker"
	DefaultBucket  = "llm-routing"
	// LoaderQueue is the loaders' queue group on llm.control.load, and
	// LoadsBucket the KV bucket where a loader claims a load, so that one
	// load runs however many loaders and brokers there are.
	LoaderQueue = "switchyard-loader"
	LoadsBucket = "llm-loads"
	// ResponsesBucket remembers which replica holds each stored response
	// of the Responses API (package owners): adapters write it, brokers
	// read it.
	ResponsesBucket = "llm-responses"
	// The Files and Batch APIs (package batch): uploaded and produced files
	// in an object store, batch records and per-line results in KV buckets,
	// and the items of running batches in a work-queue stream that the
	// batchers (queue group BatcherQueue) consume.
	FilesBucket   = "llm-files"
	BatchesBucket = "llm-batches"
	ResultsBucket = "llm-batch-results"
	ItemsStream   = "LLM_BATCH_ITEMS"
	BatcherQueue  = "switchyard-batcher"
	// BudgetsBucket holds the spend of every budget's current period and
	// the leases deciders hold on it (package budget); LedgerStream is the
	// stream of settled requests, one record each, on Ledger(tenant).
	BudgetsBucket = "llm-budgets"
	LedgerStream  = "LEDGER"
)

// ErrBadToken is returned for an id that cannot be a subject token.
var ErrBadToken = errors.New("invalid subject token")

// Subjects builds the subjects of one deployment. The zero value uses
// DefaultPrefix.
type Subjects struct {
	Prefix string
}

// New returns the subject builder for prefix ("" means DefaultPrefix).
func New(prefix string) Subjects {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return Subjects{Prefix: prefix}
}

func (s Subjects) p() string {
	if s.Prefix == "" {
		return DefaultPrefix
	}
	return s.Prefix
}

// Route is where a tenant's requests go: llm.route.<tenant>.
func (s Subjects) Route(tenant string) string { return s.p() + ".route." + tenant }

// RouteAll is the brokers' endpoint subject for direct clients.
func (s Subjects) RouteAll() string { return s.p() + ".route.*" }

// Gateway is where gateways send a tenant's requests: llm.gw.<tenant>. No
// tenant account imports it, so a broker knows a request on it came from a
// gateway, and one on llm.route.<tenant> from a direct client.
func (s Subjects) Gateway(tenant string) string { return s.p() + ".gw." + tenant }

// GatewayAll is the brokers' endpoint subject for gateways.
func (s Subjects) GatewayAll() string { return s.p() + ".gw.*" }

// Batch is where the batchers send a tenant's batch items: llm.batch.<tenant>.
// Only the batcher identity may publish it; the tenant comes from the batch
// record a gateway wrote, so the subject speaks for the tenant as
// llm.gw.<tenant> does.
func (s Subjects) Batch(tenant string) string { return s.p() + ".batch." + tenant }

// BatchAll is the brokers' endpoint subject for batchers.
func (s Subjects) BatchAll() string { return s.p() + ".batch.*" }

// BatchItems is the subject of one batch's items in the work-queue stream:
// llm.batchitem.<tenant>.<batch>.
func (s Subjects) BatchItems(tenant, batch string) string {
	return s.p() + ".batchitem." + tenant + "." + batch
}

// BatchItemsOf matches every item of one tenant's batches.
func (s Subjects) BatchItemsOf(tenant string) string { return s.p() + ".batchitem." + tenant + ".*" }

// BatchItemsAll matches every batch item: the stream's subjects.
func (s Subjects) BatchItemsAll() string { return s.p() + ".batchitem.>" }

// Replica is one adapter's request subject.
func (s Subjects) Replica(id string) string { return s.p() + ".replica." + id }

// ReplicaCancel carries a gateway's cancel for a request (header Llm-Request-Id).
func (s Subjects) ReplicaCancel(id string) string { return s.p() + ".replica." + id + ".cancel" }

// Prefill carries the prefill leg of a split request that decode replica
// decode sends to prefill replica prefill, as a request (docs/protocol.md,
// "Disaggregated serving"). Only decode's adapter may publish it: its last
// token is the sender's identity, proven by the subject's permission, so
// no adapter can send a leg, or take a request id, in another's name.
//
// A decode replica may be named "cancel": its leg subject
// (llm.replica.<prefill>.prefill.cancel) has one token fewer than any
// cancel (PrefillCancel), so neither subject matches the other's wildcard
// (PrefillAll, PrefillCancelAll) or the other's permission.
func (s Subjects) Prefill(prefill, decode string) string {
	return s.p() + ".replica." + prefill + ".prefill." + decode
}

// PrefillAll matches every prefill leg sent to prefill replica prefill.
func (s Subjects) PrefillAll(prefill string) string {
	return s.p() + ".replica." + prefill + ".prefill.*"
}

// PrefillCancel carries the cancel of a prefill leg that decode replica
// decode sent to prefill replica prefill. Only decode's adapter may
// publish it (its last token is the sender's identity, proven by the
// subject's permission), so only the adapter that started a leg can stop
// it.
func (s Subjects) PrefillCancel(prefill, decode string) string {
	return s.p() + ".replica." + prefill + ".prefill.cancel." + decode
}

// PrefillCancelAll matches every cancel of prefill replica prefill's legs.
func (s Subjects) PrefillCancelAll(prefill string) string {
	return s.p() + ".replica." + prefill + ".prefill.cancel.*"
}

// Heartbeat is one adapter's load heartbeat.
func (s Subjects) Heartbeat(id string) string { return s.p() + ".heartbeat." + id }

// HeartbeatAll matches every heartbeat; consumed with a plain subscription.
func (s Subjects) HeartbeatAll() string { return s.p() + ".heartbeat.*" }

// Load carries one replica's load deltas (LoadDelta), published only by
// that replica's adapter, between its heartbeats.
func (s Subjects) Load(id string) string { return s.p() + ".load." + id }

// LoadAll matches every replica's load deltas.
func (s Subjects) LoadAll() string { return s.p() + ".load.*" }

// Placement shares where a model's prefix blocks were sent.
func (s Subjects) Placement(model string) string { return s.p() + ".placement." + ModelToken(model) }

// PlacementAll matches every placement.
func (s Subjects) PlacementAll() string { return s.p() + ".placement.*" }

// KV carries one replica's KV-cache key updates (KVUpdate), published only
// by that replica's adapter.
func (s Subjects) KV(id string) string { return s.p() + ".kv." + id }

// KVAll matches every replica's key updates.
func (s Subjects) KVAll() string { return s.p() + ".kv.*" }

// KVSync asks every adapter with a KV-event feed to resend what its engine
// holds: a decider that starts late fills its index from the answers.
func (s Subjects) KVSync() string { return s.p() + ".kvsync" }

// Decision carries an explained decision, published per pool.
func (s Subjects) Decision(pool string) string { return s.p() + ".decision." + pool }

// DecisionAll matches every decision.
func (s Subjects) DecisionAll() string { return s.p() + ".decision.>" }

// Eject announces a broker's ejection of a replica.
func (s Subjects) Eject(replica string) string { return s.p() + ".eject." + replica }

// EjectAll matches every ejection.
func (s Subjects) EjectAll() string { return s.p() + ".eject.*" }

// Usage carries the tokens a request actually used, to settle token quotas.
func (s Subjects) Usage(tenant string) string { return s.p() + ".usage." + tenant }

// UsageAll matches every usage event.
func (s Subjects) UsageAll() string { return s.p() + ".usage.*" }

// Ledger is where an adapter records a tenant's settled requests, the
// subject of the LEDGER stream.
func (s Subjects) Ledger(tenant string) string { return s.p() + ".ledger." + tenant }

// LedgerAll matches every tenant's ledger subject.
func (s Subjects) LedgerAll() string { return s.p() + ".ledger.*" }

// BudgetEvent is where a decider tells that a tenant's budget (or one of
// its keys') crossed 80% or 100% of its limit.
func (s Subjects) BudgetEvent(tenant string) string { return s.p() + ".events.budget." + tenant }

// BudgetEventAll matches every tenant's budget events.
func (s Subjects) BudgetEventAll() string { return s.p() + ".events.budget.*" }

// ControlLoad asks an autoscaler to load a cold-tier model.
func (s Subjects) ControlLoad() string { return s.p() + ".control.load" }

// ControlLoadStatus carries each load's progress (LoadStatus), from the
// loader to brokers (Retry-After), gateways (held requests) and dashboards.
func (s Subjects) ControlLoadStatus() string { return s.p() + ".control.load.status" }

// Explain is the dry-run endpoint for a tenant.
func (s Subjects) Explain(tenant string) string { return s.p() + ".explain." + tenant }

// ExplainAll is the brokers' explain endpoint subject.
func (s Subjects) ExplainAll() string { return s.p() + ".explain.*" }

// BrokerPresence is where deciders (brokers, and gateways that decide)
// announce themselves (Presence) so each can count the others and enforce
// its share of a tenant quota.
func (s Subjects) BrokerPresence() string { return s.p() + ".broker.presence" }

// BatcherPresence is where each batcher announces itself, so batchers
// count each other and each takes its share of the batch room.
func (s Subjects) BatcherPresence() string { return s.p() + ".batcher.presence" }

// ReplyPrefix is the gateway's wildcard reply space: <prefix>.reply.<gateway>.>.
func (s Subjects) ReplyPrefix(gateway string) string { return s.p() + ".reply." + gateway }

// RoutedPrefix is where a gateway hears the brokers' routed notices:
// <prefix>.routed.<gateway>.<request-id>. Only brokers may publish there;
// adapters, which publish in the reply space, may not.
func (s Subjects) RoutedPrefix(gateway string) string { return s.p() + ".routed." + gateway }

// RoutedFor is where the routed notice of a request with reply subject
// reply goes: for a gateway's reply subject (<prefix>.reply.<gateway>.<id>)
// the gateway's routed subject <prefix>.routed.<gateway>.<id>, whose sender
// the gateway can believe; any other reply (a direct client's inbox) gets
// the notice itself.
func (s Subjects) RoutedFor(reply string) string {
	space := s.p() + ".reply."
	if len(reply) > len(space) && strings.HasPrefix(reply, space) {
		return s.p() + ".routed." + reply[len(space):]
	}
	return reply
}

// InReplySpace reports whether subject can be a reply to a request: a
// gateway's reply space (<prefix>.reply.>), a client inbox (_INBOX.>) or a
// service-import reply (_R_.>). An adapter answers only there, so a forged
// Llm-Reply cannot make it publish on another subject.
func (s Subjects) InReplySpace(subject string) bool {
	for _, space := range [...]string{s.p() + ".reply.", "_INBOX.", "_R_."} {
		if len(subject) > len(space) && strings.HasPrefix(subject, space) {
			return true
		}
	}
	return false
}

// IsServiceReply reports whether subject is a service-import reply (_R_.…),
// which no client may publish as a message's reply.
func IsServiceReply(subject string) bool { return strings.HasPrefix(subject, "_R_.") }

// TenantFromRoute returns the last token of a route or explain subject.
func TenantFromRoute(subject string) string {
	if i := strings.LastIndexByte(subject, '.'); i >= 0 {
		return subject[i+1:]
	}
	return subject
}

// ValidToken reports whether id can be used as a tenant or replica token:
// [A-Za-z0-9_-]{1,64}. Ids are validated, never escaped silently.
func ValidToken(id string) error {
	if len(id) == 0 || len(id) > 64 {
		return fmt.Errorf("%w: %q must be 1 to 64 characters", ErrBadToken, id)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("%w: %q may hold only letters, digits, '_' and '-'", ErrBadToken, id)
		}
	}
	return nil
}

// ModelToken makes a model id usable as one subject token ('.' → '_').
func ModelToken(model string) string {
	if strings.IndexByte(model, '.') < 0 {
		return model
	}
	return strings.ReplaceAll(model, ".", "_")
}

// TableCopy is the bucket holding region's copy of the routing table's
// bucket: bucket-region (switchyard table copy).
func TableCopy(bucket, region string) string { return bucket + "-" + region }
