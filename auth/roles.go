package auth

import (
	"fmt"
	"time"

	"github.com/nats-io/jwt/v2"

	"github.com/switchyard-llm/switchyard/subjects"
)

// Role kinds. Adapter and Tenant need an id (the replica, the tenant).
const (
	RoleGateway = "gateway"
	// RoleGatewayRelay is a gateway started with --decide broker: it
	// relays its HTTP requests to the brokers and decides nothing, so it
	// holds none of a decider's subjects.
	RoleGatewayRelay = "gateway-relay"
	RoleBroker       = "broker"
	RoleOperator     = "operator"
	RoleObserver     = "observer"
	RoleAdapter      = "adapter"
	RoleTenant       = "tenant"
	RoleLoader       = "loader"
	RoleBatcher      = "batcher"
)

// LongestRequest is the longest request a gateway accepts (X-Request-Timeout
// is at most 86400 s). What must outlive a request — an adapter's right to
// answer, a tenant import's response mapping — outlives this.
const LongestRequest = 24 * time.Hour

// Response allowances. An adapter streams many messages for as long as a
// request lasts; a broker answers at most a routed notice and a rejection
// (or one micro/explain reply), at once. The server keeps an entry per
// request until it is used up or expires, so neither is unlimited on both.
const (
	adapterRespExpires = LongestRequest + 5*time.Minute
	brokerRespMax      = 3
	brokerRespExpires  = 30 * time.Second
	importThreshold    = LongestRequest + 5*time.Minute
)

// Role names one identity: a kind and, for adapters and tenants, an id.
type Role struct {
	Kind string
	ID   string // replica for RoleAdapter, tenant for RoleTenant
	// Region is the region of a gateway or broker run with --region: it
	// may also read that region's copy of the routing table
	// (subjects.TableCopy). Empty: the table's bucket only.
	Region string
}

// InRegion is r with region set, for the roles that read the routing table
// in a region (gateway, gateway-relay, broker); an error for the others or
// a bad region.
func (r Role) InRegion(region string) (Role, error) {
	switch r.Kind {
	case RoleGateway, RoleGatewayRelay, RoleBroker:
	default:
		return Role{}, fmt.Errorf("%w: role %s takes no --region", ErrRole, r.Kind)
	}
	if err := subjects.ValidToken(region); err != nil {
		return Role{}, fmt.Errorf("%w: --region %q: %v", ErrRole, region, err)
	}
	r.Region = region
	return r, nil
}

// ParseRole validates a kind and its id.
func ParseRole(kind, id string) (Role, error) {
	switch kind {
	case RoleGateway, RoleGatewayRelay, RoleBroker, RoleOperator, RoleObserver, RoleLoader, RoleBatcher:
		if id != "" {
			return Role{}, fmt.Errorf("%w: role %s takes no --replica or --tenant", ErrRole, kind)
		}
	case RoleAdapter, RoleTenant:
		if err := subjects.ValidToken(id); err != nil {
			what := "--replica"
			if kind == RoleTenant {
				what = "--tenant"
			}
			return Role{}, fmt.Errorf("%w: role %s needs %s: %w", ErrRole, kind, what, err)
		}
	default:
		return Role{}, fmt.Errorf("%w: unknown role %q (want gateway, gateway-relay, broker, operator, observer, loader, batcher, adapter or tenant)", ErrRole, kind)
	}
	return Role{Kind: kind, ID: id}, nil
}

// Name is the user's name and its creds file's base name: "gateway",
// "adapter-l70-gen-0", "tenant-acme".
func (r Role) Name() string {
	if r.ID == "" {
		return r.Kind
	}
	return r.Kind + "-" + r.ID
}

// account is the name of the account the role's user lives in.
func (r Role) account() string {
	if r.Kind == RoleTenant {
		return tenantAccount(r.ID)
	}
	return switchyardAccount
}

// grants are the rights of one user.
type grants struct {
	pub, sub []string
	resp     *jwt.ResponsePermission
}

// permissions says what each role may publish and subscribe. Everything not
// listed is denied; docs/security.md has the same table with its reasons.
func permissions(r Role, prefix, bucket string) grants {
	p := prefix + "."
	kv := "$KV." + bucket + "."
	tableRead := bucketRead(bucket)
	if r.Region != "" {
		tableRead = append(tableRead, copyRead("KV_"+subjects.TableCopy(bucket, r.Region))...)
	}
	inbox := "_INBOX.>"
	srv := func(service string) []string {
		return []string{"$SRV.*", "$SRV.*." + service, "$SRV.*." + service + ".>"}
	}
	switch r.Kind {
	case RoleGateway, RoleGatewayRelay:
		// It stores uploaded files and writes batch records (creating
		// their buckets); the batchers do the rest. $SRV.PING of the
		// brokers: /readyz asks whether one answers. It hears heartbeats,
		// decisions and ejections for the dashboard, load statuses for the
		// requests it holds while their model loads, and the KV-cache key
		// updates (llm.kv.*, and their resend, llm.kvsync) for the
		// dashboard's cached blocks per replica.
		pub := append([]string{p + "gw.*", p + "replica.*.cancel", "$SRV.PING." + subjects.BrokerService, p + "kvsync"}, tableRead...)
		pub = append(pub, objectsWrite(subjects.FilesBucket)...)
		pub = append(pub, kvWrite(subjects.BatchesBucket)...)
		if r.Kind == RoleGatewayRelay {
			// GET /v1/usage reads a key's and its tenant's spend (a
			// gateway that decides reads it as a decider).
			pub = append(pub, budgetsRead()...)
		}
		sub := []string{p + "reply.>", p + "routed.>", p + "heartbeat.*", p + "decision.>", p + "eject.*", p + "control.load.status", p + "kv.*", inbox}
		if r.Kind == RoleGateway {
			// It decides its HTTP requests as a broker would (gateway
			// --decide local): the request straight to the replica,
			// placements, sampled decisions, ejections, cold loads and
			// its presence among the deciders; it hears placements,
			// usage (it settles only its own reservations) and the
			// other deciders' presence. Never llm.route.* or
			// llm.explain.*: direct tenants and explain stay the
			// brokers'. The KV-cache key updates feed its exact prefix
			// index too, and the load deltas (llm.load.*) its load view,
			// as a broker's. A relay (--decide broker) gets none of it.
			pub = append(pub, deciderPub(p)...)
			sub = append(sub, p+"placement.*", p+"usage.*", p+"broker.presence", p+"load.*")
		}
		return grants{pub: pub, sub: sub}
	case RoleBroker:
		// It reads the stored-response owners to route a turn that
		// continues one. It tells a gateway where it routed a request on
		// the gateway's routed subject (llm.routed.>), which no adapter
		// may publish: a gateway believes a routed notice only there.
		return grants{
			pub: append(append(deciderPub(p), append(tableRead, p+"routed.>")...), bucketRead(subjects.ResponsesBucket)...),
			sub: append([]string{
				p + "route.*", p + "gw.*", p + "batch.*", p + "explain.*", p + "heartbeat.*", p + "load.*", p + "placement.*",
				p + "usage.*", p + "broker.presence", p + "control.load.status", p + "kv.*", inbox,
			}, srv(subjects.BrokerService)...),
			resp: &jwt.ResponsePermission{MaxMsgs: brokerRespMax, Expires: brokerRespExpires},
		}
	case RoleAdapter:
		return grants{
			// The reply space, explicitly: _R_.> is a direct tenant's
			// reply, carried in Llm-Reply (a message forwarded with it as
			// its reply is refused by the server, so allow_responses cannot
			// cover it), and a stream must go on after its adapter
			// reconnects to another server, where the allowance of the old
			// connection is gone. The server tracks no allowance entry for
			// a reply the user may publish anyway.
			// It records which stored responses its engine holds,
			// creating the owners bucket when it is the first.
			// It sends the prefill legs of split requests to prefill
			// replicas (llm.replica.<prefill>.prefill.<replica>), the only
			// request subject it may publish: never a whole request. Leg
			// and cancel name it last, so a prefill replica knows which
			// decode replica sent a leg and stops only the legs the
			// canceller sent.
			pub: append(append([]string{
				p + "heartbeat." + r.ID, p + "load." + r.ID, p + "usage.*", kv + "replicas." + r.ID, p + "kv." + r.ID,
				// The ledger record of each request it served (the
				// LEDGER stream's acknowledgement comes to its inbox).
				p + "ledger.*",
				p + "replica.*.prefill." + r.ID, p + "replica.*.prefill.cancel." + r.ID,
				p + "reply.>", "_INBOX.>", "_R_.>",
				"$JS.API.STREAM.CREATE.KV_" + subjects.ResponsesBucket, "$KV." + subjects.ResponsesBucket + ".>",
			}, tableRead...), bucketRead(subjects.ResponsesBucket)...),
			sub: append([]string{p + "replica." + r.ID, p + "replica." + r.ID + ".cancel", p + "replica." + r.ID + ".prefill.*",
				p + "replica." + r.ID + ".prefill.cancel.*",
				p + "kvsync", inbox}, srv(subjects.AdapterService)...),
			resp: &jwt.ResponsePermission{MaxMsgs: -1, Expires: adapterRespExpires},
		}
	case RoleOperator:
		return grants{
			pub: []string{"$JS.API.>", "$JS.FC.>", "$JS.ACK.>", kv + ">", "$KV." + subjects.BatchesBucket + ".>", p + "explain.*", "$SRV.>"},
			sub: []string{p + "decision.>", p + "heartbeat.*", p + "eject.*", p + "control.load", p + "control.load.status", p + "events.budget.*", inbox},
		}
	case RoleObserver:
		return grants{
			pub: append([]string{"$SRV.PING", "$SRV.PING.>", "$SRV.INFO", "$SRV.INFO.>", "$SRV.STATS", "$SRV.STATS.>"}, tableRead...),
			sub: []string{p + "decision.>", p + "heartbeat.*", p + "eject.*", p + "control.load.status", p + "events.budget.*", inbox},
		}
	case RoleLoader:
		// Claims loads in its own bucket (creating it), reads the table,
		// and drains or deletes the registrations of the replicas of a
		// model it unloads.
		loads := subjects.LoadsBucket
		pub := append([]string{
			p + "control.load.status",
			"$JS.API.STREAM.CREATE.KV_" + loads, "$KV." + loads + ".>",
			kv + "replicas.*",
		}, tableRead...)
		return grants{
			pub: append(pub, bucketRead(loads)...),
			sub: []string{p + "control.load", p + "heartbeat.*", p + "usage.*", inbox},
		}
	case RoleBatcher:
		// Sends batch items on llm.batch.<tenant> (the only identity that
		// may: the tenant is the batch record's), and works the items
		// stream, the results and batches buckets and the files store.
		// It reads the load view (heartbeats and load deltas) to pace its
		// lines on the pool's free room, and announces itself to the
		// other batchers, which share that room.
		items := subjects.ItemsStream
		pub := []string{
			p + "batch.*", p + "batchitem.>", p + "batcher.presence",
			"$JS.API.INFO",
			"$JS.API.STREAM.CREATE." + items, "$JS.API.STREAM.INFO." + items, "$JS.API.STREAM.PURGE." + items,
			"$JS.API.CONSUMER.CREATE." + items + ".>", "$JS.API.CONSUMER.INFO." + items + ".>",
			"$JS.API.CONSUMER.MSG.NEXT." + items + ".>", "$JS.ACK." + items + ".>",
		}
		pub = append(pub, objectsWrite(subjects.FilesBucket)...)
		pub = append(pub, kvWrite(subjects.BatchesBucket)...)
		pub = append(pub, kvWrite(subjects.ResultsBucket)...)
		return grants{pub: pub, sub: []string{p + "heartbeat.*", p + "load.*", p + "batcher.presence", inbox}}
	case RoleTenant:
		// In its own account: nothing of the Switchyard account exists
		// there but the one imported route subject.
		return grants{pub: []string{p + "route." + r.ID}, sub: []string{inbox}}
	}
	return grants{}
}

// deciderPub is what every decider publishes: the request for the chosen
// replica, placements, sampled decisions, cold-load requests, its
// presence, ejections, the KV-cache resend, budget events, the ping of
// the adapters' micro service (it times the answers by region: the spill
// penalty, README "Regions"; never another $SRV subject), and the spend
// of the budgets (their bucket's keys, compare-and-set: never the
// bucket's creation or purge, and never the ledger, which adapters write).
// It reads the ledger: the records of a dead decider's requests correct
// the spend its expired lease left.
func deciderPub(p string) []string {
	return append(append([]string{
		p + "replica.*", p + "placement.*", p + "decision.>", p + "control.load", p + "broker.presence",
		p + "eject.*", p + "kvsync", p + "events.budget.*", "$KV." + subjects.BudgetsBucket + ".>",
		"$SRV.PING." + subjects.AdapterService,
	}, budgetsRead()...), ledgerRead()...)
}

// ledgerRead are the subjects that read the ledger with an ordered
// consumer, the fewest that do: a decider's permissions ride in the JWT
// of its connection's first line.
func ledgerRead() []string {
	st := subjects.LedgerStream
	return []string{"$JS.API.STREAM.INFO." + st, "$JS.API.CONSUMER.*." + st + ".>", "$JS.API.CONSUMER.MSG.NEXT." + st + ".>"}
}

// budgetsRead are the subjects that bind the budgets bucket and get a key:
// the few a decider needs (a user's permissions travel in its JWT, which a
// connection's first line must hold).
func budgetsRead() []string {
	st := "KV_" + subjects.BudgetsBucket
	return []string{"$JS.API.STREAM.INFO." + st, "$JS.API.DIRECT.GET." + st + ".>", "$JS.API.STREAM.MSG.GET." + st}
}

// bucketRead are the JetStream API subjects that read a KV bucket: bind it,
// watch it (an ordered push consumer with flow control), get keys directly.
func bucketRead(bucket string) []string { return streamRead("KV_" + bucket) }

// copyRead are the subjects that watch a region's copy of the routing
// table: its stream's info and the watch's consumer (create, info, delete,
// next). Fewer than streamRead's: a deciding gateway's JWT is near the
// server's default 4 KB control line, which natsconn.MaxControlLine raises.
func copyRead(stream string) []string {
	return []string{
		"$JS.API.STREAM.INFO." + stream,
		"$JS.API.CONSUMER.CREATE." + stream + ".>", "$JS.API.CONSUMER.INFO." + stream + ".>", "$JS.API.CONSUMER.DELETE." + stream + ".>",
		"$JS.API.CONSUMER.MSG.NEXT." + stream + ".>",
	}
}

// streamRead are the JetStream API subjects that read a stream.
func streamRead(stream string) []string {
	return []string{
		"$JS.API.INFO",
		"$JS.API.STREAM.INFO." + stream,
		"$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST",
		"$JS.API.CONSUMER.CREATE." + stream, "$JS.API.CONSUMER.CREATE." + stream + ".>",
		"$JS.API.CONSUMER.DELETE." + stream + ".>",
		"$JS.API.CONSUMER.INFO." + stream + ".>",
		"$JS.API.CONSUMER.MSG.NEXT." + stream + ".>",
		"$JS.API.DIRECT.GET." + stream, "$JS.API.DIRECT.GET." + stream + ".>",
		"$JS.API.STREAM.MSG.GET." + stream,
		"$JS.FC." + stream + ".>",
	}
}

// kvWrite are the subjects that create, read and write a KV bucket, and
// purge keys from it.
func kvWrite(bucket string) []string {
	return append([]string{
		"$JS.API.STREAM.CREATE.KV_" + bucket, "$JS.API.STREAM.PURGE.KV_" + bucket, "$KV." + bucket + ".>",
	}, bucketRead(bucket)...)
}

// objectsWrite are the subjects that create, read and write an object
// store: its chunks and metadata, and the purge of a failed put's chunks.
func objectsWrite(bucket string) []string {
	stream := "OBJ_" + bucket
	return append([]string{
		"$JS.API.STREAM.CREATE." + stream, "$JS.API.STREAM.PURGE." + stream, "$O." + bucket + ".>",
	}, streamRead(stream)...)
}
