package lab

import (
	"math/rand/v2"
	"time"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// Model is the alias every lab request asks for, and ModelID the model it
// resolves to.
const (
	Model   = "chat"
	ModelID = "sim-model"
	Version = "v1"
)

var (
	_ Picker        = (*Switchyard)(nil)
	_ deltaReader   = (*Switchyard)(nil)
	_ Picker        = (*ExcludeSaturated)(nil)
	_ kvObserver    = (*Switchyard)(nil)
	_ usageObserver = (*Switchyard)(nil)
)

// Switchyard is the real routing policy (broker/policy) as a Picker: one
// broker's Router, fed the table, heartbeats and requests the way the
// broker feeds it.
type Switchyard struct {
	r *policy.Router
	d policy.Decision
	q policy.Request
	// KVRefused counts the KV updates the policy's index refused in part
	// or whole (out of bounds or out of sequence).
	KVRefused int
}

// NewSwitchyard returns a policy Router on the table snap.
func NewSwitchyard(snap *table.Snapshot, self string) *Switchyard {
	return NewSwitchyardConfig(snap, policy.Config{Self: self})
}

// NewSwitchyardConfig returns a policy Router configured by cfg on the
// table snap.
func NewSwitchyardConfig(snap *table.Snapshot, cfg policy.Config) *Switchyard {
	r := policy.New(cfg)
	r.SetTable(snap)
	return &Switchyard{r: r}
}

// Router is the policy Router, for inspection.
func (p *Switchyard) Router() *policy.Router { return p.r }

// ObserveHeartbeat implements Picker.
func (p *Switchyard) ObserveHeartbeat(hb *subjects.Heartbeat, now time.Time) {
	p.r.ObserveHeartbeat(hb, now)
}

// ObserveKV applies a replica adapter's KV-cache update to the policy's
// exact prefix index, as the broker does when one arrives on llm.kv.
func (p *Switchyard) ObserveKV(u *subjects.KVUpdate, _ time.Time) {
	if p.r.ObserveKV(u) != nil {
		p.KVRefused++
	}
}

// ObserveLoadDelta takes an adapter's load delta, as the decider does.
func (p *Switchyard) ObserveLoadDelta(d *subjects.LoadDelta, now time.Time) {
	p.r.ObserveLoadDelta(d, now)
}

// Pick implements Picker: the request's headers as the gateway would set
// them, one committed decision.
func (p *Switchyard) Pick(req *Request, now time.Time, rng *rand.Rand) Pick {
	p.q = policy.Request{
		Tenant: req.Tenant, Model: Model, Endpoint: subjects.EndpointChat,
		Conversation: req.Conversation, PromptTokens: req.PromptTokens, MaxTokens: req.MaxTokens,
		Prefix: req.Prefix, ID: req.ID,
	}
	p.d = p.r.Decide(&p.q, now, rng)
	return Pick{Replica: p.d.Replica, Prefill: p.d.Prefill, Reason: p.d.Reason, Err: p.d.Err}
}

// ObserveEnd implements usageObserver: the adapter's usage event for a
// request this router admitted, which settles what it held for it.
func (p *Switchyard) ObserveEnd(req *Request, now time.Time) {
	if req.ID != "" {
		p.r.ObserveUsage(&subjects.Usage{Tenant: req.Tenant, RequestID: req.ID, PromptTokens: req.PromptTokens}, now)
	}
}

// ExcludeSaturated turns the policy's "deprioritize saturated replicas" into
// "exclude them", to show the cascade exclusion sets off. It does so without
// touching the policy: a heartbeat that reports a saturated replica (kv ≥
// saturation_kv, or a full queue, the policy's own definition) reaches the
// wrapped Picker with its state set to draining, so the replica is no
// candidate until a heartbeat reports it unsaturated again.
type ExcludeSaturated struct {
	Picker
	Saturation float64
	// Trace, when set, hears every heartbeat's verdict.
	Trace func(now time.Time, replica string, excluded bool)
}

// ObserveHeartbeat implements Picker.
func (p *ExcludeSaturated) ObserveHeartbeat(hb *subjects.Heartbeat, now time.Time) {
	excluded := hb.KVUsage >= p.Saturation || hb.MaxQueue > 0 && hb.Waiting >= hb.MaxQueue
	if excluded {
		c := *hb
		c.State = subjects.StateDraining
		hb = &c
	}
	if p.Trace != nil {
		p.Trace(now, hb.Replica, excluded)
	}
	p.Picker.ObserveHeartbeat(hb, now)
}
