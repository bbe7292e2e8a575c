package policy

import (
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// maxHops bounds alias resolution: cascades and fallbacks together visit at
// most this many names, and never one twice, so a loop in the table ends in
// a reason code instead of a hang.
const maxHops = 16

// resolved is where a name leads: an alias with targets, or a bare model id.
type resolved struct {
	alias     *table.Alias
	aliasName string
	model     string // set when alias is nil
}

// resolution is what a request resolves to: the tenant whose rules
// apply, the names it went through, the model and version (target), the
// pool and the adapter, and what changed the route on the way (the
// modifiers of the reason). Its methods read the table, never the replicas.
type resolution struct {
	snap *table.Snapshot
	req  *Request
	rng  *rand.Rand // the canary draw without a conversation

	tenant    *table.Tenant // nil: no rules
	tenantKey string        // quota bucket key
	tier      string

	adapter  string // LoRA to apply, "" for none
	explicit bool   // the request named "model:adapter"

	path        [maxHops]string // names resolved so far (loop safety)
	npath       int
	promptRead  bool
	promptBytes []byte

	primary, target, stable table.Target
	pool                    string
	poolFallback            bool
	canaryGone              bool
	fallback                string // alias fallen back to
}

// start readies res for req and finds the tenant's table entry; a tenant
// missing from the table gets the default tenant's rules, and shares its
// quota bucket.
func (res *resolution) start(snap *table.Snapshot, req *Request, rng *rand.Rand) {
	res.snap, res.req, res.rng = snap, req, rng
	res.tenant, res.tenantKey = snap.TenantRules(req.Tenant)
	res.tier = table.TierStandard
	if res.tenant != nil && res.tenant.Tier != "" {
		res.tier = res.tenant.Tier
	}
}

// modifiers are the route modifiers met (see step.reasons).
func (res *resolution) modifiers() int {
	m := 0
	if res.canaryGone {
		m |= modCanaryGone
	}
	if res.poolFallback {
		m |= modPoolFallback
	}
	return m
}

// splitModel splits "model:adapter"; ':' is never part of a name.
func splitModel(s string) (name, adapter string, explicit bool) {
	name, adapter, explicit = strings.Cut(s, ":")
	return name, adapter, explicit
}

// resolve follows name through cascade aliases to an alias with targets or
// a model id, recording every name on res.path.
func (res *resolution) resolve(name string, to *resolved) *subjects.APIError {
	for {
		if slices.Contains(res.path[:res.npath], name) || res.npath == maxHops {
			return errAliasLoop(name)
		}
		res.path[res.npath] = name
		res.npath++
		a := res.snap.Aliases[name]
		if a == nil {
			if res.snap.Models[name] != nil {
				*to = resolved{model: name}
				return nil
			}
			return errModelNotFound(name)
		}
		if len(a.Cascade) == 0 {
			*to = resolved{alias: a, aliasName: name}
			return nil
		}
		next := res.cascade(a)
		if next == "" {
			return errNoCascadeRule(name)
		}
		name = next
	}
}

// cascade returns the alias of the first rule of a whose condition holds.
func (res *resolution) cascade(a *table.Alias) string {
	for i := range a.Cascade {
		if res.holds(&a.Cascade[i].When) {
			return a.Cascade[i].Alias
		}
	}
	return ""
}

// holds reports whether every set field of w holds. The regex runs last,
// so the prompt is rendered only when the cheap conditions passed.
func (res *resolution) holds(w *table.CascadeWhen) bool {
	q := res.req
	if w.MaxPromptTokens != nil && q.PromptTokens > *w.MaxPromptTokens {
		return false
	}
	if w.MinPromptTokens != nil && q.PromptTokens < *w.MinPromptTokens {
		return false
	}
	for _, f := range w.Features {
		if !slices.Contains(q.Features, f) {
			return false
		}
	}
	if w.Tier != "" && w.Tier != res.tier {
		return false
	}
	if w.Regex != "" {
		re := w.Re() // compiled by table.Decode; a hand-built table has none
		p := res.prompt()
		if re == nil || p == nil || !re.Match(p) {
			return false
		}
	}
	return true
}

// prompt calls req.Prompt at most once per decision.
func (res *resolution) prompt() []byte {
	if !res.promptRead {
		res.promptRead = true
		if res.req.Prompt != nil {
			res.promptBytes = res.req.Prompt()
		}
	}
	return res.promptBytes
}

// permitted applies the tenant's allowed_models to the names resolved from
// path[from:] and the chosen model: an alias allows what it leads to, a
// model id allows every alias leading to it. The explicit "model:adapter"
// form needs the tenant to own the adapter, or allowed_models to list that
// exact form.
func (res *resolution) permitted(from int) bool {
	t := res.tenant
	if res.explicit {
		if t == nil {
			return false
		}
		if slices.Contains(t.AllowedModels, res.req.Model) {
			return true
		}
		owned := false
		for _, l := range t.Adapters {
			if l == res.adapter {
				owned = true
				break
			}
		}
		if !owned {
			return false
		}
	}
	if t == nil || len(t.AllowedModels) == 0 {
		return true
	}
	for _, n := range res.path[from:res.npath] {
		if slices.Contains(t.AllowedModels, n) {
			return true
		}
	}
	return slices.Contains(t.AllowedModels, res.target.Model)
}

// tenantAdapter is the LoRA the tenant maps the most specific name of
// path[from:] (or the chosen model) to, "" when none.
func (res *resolution) tenantAdapter(from int) string {
	t := res.tenant
	if t == nil || len(t.Adapters) == 0 {
		return ""
	}
	for i := res.npath - 1; i >= from; i-- {
		if l, ok := t.Adapters[res.path[i]]; ok {
			return l
		}
	}
	return t.Adapters[res.target.Model]
}
