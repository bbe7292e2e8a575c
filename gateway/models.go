package gateway

import (
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"strconv"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// modelEntry is one entry of GET /v1/models. OpenAI's fields come first;
// ResolvesTo (an alias's target models, or the aliases its cascade may pick)
// and Parent (an adapter's base) tell a client what a name stands for.
type modelEntry struct {
	ID         string   `json:"id"`
	Object     string   `json:"object"`
	Created    int64    `json:"created"`
	OwnedBy    string   `json:"owned_by"`
	ResolvesTo []string `json:"resolves_to,omitempty"`
	Parent     string   `json:"parent,omitempty"`
}

// ownedBy is the owner of the names the routing table defines; a tenant's
// adapters are owned by the tenant.
const ownedBy = "switchyard"

// serveModels lists every name the tenant may ask for: the aliases and
// models it may use, and its own adapters as "name:adapter".
func (g *Gateway) serveModels(w http.ResponseWriter, r *http.Request) {
	list, ok := g.modelsFor(w, r)
	if !ok {
		return
	}
	out := struct {
		Object string       `json:"object"`
		Data   []modelEntry `json:"data"`
	}{Object: "list", Data: list}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// modelsFor is the model list of the request's tenant; false when the
// request was answered with an error instead (no table yet, a bad key).
func (g *Gateway) modelsFor(w http.ResponseWriter, r *http.Request) ([]modelEntry, bool) {
	t := g.snapshot(w)
	if t == nil {
		return nil, false
	}
	tenant, apiErr := g.tenantOf(r, t)
	if apiErr != nil {
		writeError(w, apiErr)
		return nil, false
	}
	return modelList(t, tenant), true
}

// modelList is the tenant's view of the table: aliases, then models, then
// the tenant's adapters, each sorted by name.
func modelList(t *table.Snapshot, tenant string) []modelEntry {
	out := []modelEntry{}
	for _, name := range t.AliasNames() {
		if !t.TenantMayUse(tenant, name) {
			continue
		}
		a := t.Aliases[name]
		var to []string
		for _, tg := range a.Targets {
			if !slices.Contains(to, tg.Model) {
				to = append(to, tg.Model)
			}
		}
		for _, c := range a.Cascade {
			if !slices.Contains(to, c.Alias) {
				to = append(to, c.Alias)
			}
		}
		out = append(out, modelEntry{ID: name, Object: "model", OwnedBy: ownedBy, ResolvesTo: to})
	}
	for _, name := range slices.Sorted(maps.Keys(t.Models)) {
		if t.Aliases[name] == nil && t.TenantMayUse(tenant, name) {
			out = append(out, modelEntry{ID: name, Object: "model", OwnedBy: ownedBy})
		}
	}
	if tn := t.Tenants[tenant]; tn != nil {
		for _, base := range slices.Sorted(maps.Keys(tn.Adapters)) {
			out = append(out, modelEntry{ID: base + ":" + tn.Adapters[base], Object: "model", OwnedBy: tenant, Parent: base})
		}
	}
	return out
}

// serveModel describes one name the tenant may ask for, as the OpenAI SDKs'
// models.retrieve expects: exactly what /v1/models lists, 404 for anything
// else.
func (g *Gateway) serveModel(w http.ResponseWriter, r *http.Request) {
	list, ok := g.modelsFor(w, r)
	if !ok {
		return
	}
	id := r.PathValue("id")
	for _, m := range list {
		if m.ID == id {
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(m)
			return
		}
	}
	e := subjects.NewError(http.StatusNotFound, subjects.CodeModelNotFound, "the model "+strconv.Quote(id)+" does not exist or you do not have access to it")
	e.Param = "model"
	writeError(w, e)
}
