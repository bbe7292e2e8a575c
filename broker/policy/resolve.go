package policy

import (
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

// lookupTenant finds the tenant's table entry; a tenant missing from the
// table gets the default tenant's rules, and shares its quota bucket.
func (st *decision) lookupTenant() {
	st.tenant, st.tenantKey = st.snap.TenantRules(st.req.Tenant)
	st.tier = table.TierStandard
	if st.tenant != nil && st.tenant.Tier != "" {
		st.tier = st.tenant.Tier
	}
}

// splitModel splits "model:adapter"; ':' is never part of a name.
func splitModel(s string) (name, adapter string, explicit bool) {
	name, adapter, explicit = strings.Cut(s, ":")
	return name, adapter, explicit
}

// resolve follows name through cascade aliases to an alias with targets or
// a model id, recording every name on st.path.
func (st *decision) resolve(name string, res *resolved) *subjects.APIError {
	for {
		if slices.Contains(st.path[:st.npath], name) || st.npath == maxHops {
			return errAliasLoop(name)
		}
		st.path[st.npath] = name
		st.npath++
		a := st.snap.Aliases[name]
		if a == nil {
			if st.snap.Models[name] != nil {
				*res = resolved{model: name}
				return nil
			}
			return errModelNotFound(name)
		}
		if len(a.Cascade) == 0 {
			*res = resolved{alias: a, aliasName: name}
			return nil
		}
		next := st.cascade(a)
		if next == "" {
			return errNoCascadeRule(name)
		}
		name = next
	}
}

// cascade returns the alias of the first rule of a whose condition holds.
func (st *decision) cascade(a *table.Alias) string {
	for i := range a.Cascade {
		if st.holds(&a.Cascade[i].When) {
			return a.Cascade[i].Alias
		}
	}
	return ""
}

// holds reports whether every set field of w holds. The regex runs last,
// so the prompt is rendered only when the cheap conditions passed.
func (st *decision) holds(w *table.CascadeWhen) bool {
	q := st.req
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
	if w.Tier != "" && w.Tier != st.tier {
		return false
	}
	if w.Regex != "" {
		re := w.Re() // compiled by table.Decode; a hand-built table has none
		p := st.prompt()
		if re == nil || p == nil || !re.Match(p) {
			return false
		}
	}
	return true
}

// prompt calls req.Prompt at most once per decision.
func (st *decision) prompt() []byte {
	if !st.promptRead {
		st.promptRead = true
		if st.req.Prompt != nil {
			st.promptBytes = st.req.Prompt()
		}
	}
	return st.promptBytes
}

// permitted applies the tenant's allowed_models to the names resolved from
// path[from:] and the chosen model: an alias allows what it leads to, a
// model id allows every alias leading to it. The explicit "model:adapter"
// form needs the tenant to own the adapter, or allowed_models to list that
// exact form.
func (st *decision) permitted(from int) bool {
	t := st.tenant
	if st.explicit {
		if t == nil {
			return false
		}
		if slices.Contains(t.AllowedModels, st.req.Model) {
			return true
		}
		owned := false
		for _, l := range t.Adapters {
			if l == st.adapter {
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
	for _, n := range st.path[from:st.npath] {
		if slices.Contains(t.AllowedModels, n) {
			return true
		}
	}
	return slices.Contains(t.AllowedModels, st.target.Model)
}

// tenantAdapter is the LoRA the tenant maps the most specific name of
// path[from:] (or the chosen model) to, "" when none.
func (st *decision) tenantAdapter(from int) string {
	t := st.tenant
	if t == nil || len(t.Adapters) == 0 {
		return ""
	}
	for i := st.npath - 1; i >= from; i-- {
		if l, ok := t.Adapters[st.path[i]]; ok {
			return l
		}
	}
	return t.Adapters[st.target.Model]
}
