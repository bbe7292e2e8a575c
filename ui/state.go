package ui

import (
	"cmp"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// State is one push to the browser. A full state carries every kept
// decision and the whole table; the pushes after it carry only the
// decisions that are new and the table only when its revision moved.
type State struct {
	Full      bool           `json:"full"`
	NowUnixMs int64          `json:"now_unix_ms"`
	Policy    policyView     `json:"policy"`
	Models    []modelGroup   `json:"models"`
	Loads     []loadView     `json:"loads"`     // by model`
	Decisions []decisionView `json:"decisions"` // newest first
	Seen      uint64         `json:"decisions_seen"`
	Keep      int            `json:"decisions_kept"`
	Table     *tableView     `json:"table,omitempty"`
}

type policyView struct {
	StaleAfterMs int64 `json:"stale_after_ms"`
	DeadAfterMs  int64 `json:"dead_after_ms"`
}

type modelGroup struct {
	Model string      `json:"model"`
	Pools []poolGroup `json:"pools"`
}

type poolGroup struct {
	Pool     string        `json:"pool"`
	Replicas []replicaView `json:"replicas"`
}

// replicaView joins a replica's registration in the table with its latest
// heartbeat. State is the effective one: the more restrictive of the two.
type replicaView struct {
	ID      string `json:"id"`
	Version string `json:"version"`
	// Region is the replica's region, from its heartbeat ("": none).
	Region     string   `json:"region,omitempty"`
	Role       string   `json:"role,omitempty"` // as registered: prefill, decode or both; "" unregistered
	State      string   `json:"state"`
	Registered bool     `json:"registered"`
	Heartbeat  bool     `json:"heartbeat"`
	AgeMs      int64    `json:"age_ms"`
	KVUsage    float64  `json:"kv_usage"`
	Release    float64  `json:"release_threshold"`
	Saturation float64  `json:"saturation_kv"`
	Running    int      `json:"running"`
	Waiting    int      `json:"waiting"`
	MaxBatch   int      `json:"max_batch"`
	MaxQueue   int      `json:"max_queue"`
	Inflight   int      `json:"inflight"`
	Loras      []string `json:"loras,omitempty"`
	MaxLoras   int      `json:"max_loras,omitempty"`
	TTFTMs     float64  `json:"ttft_ewma_ms"`
	// WaitMs is the time to a first token brokers estimate from the
	// heartbeat (the larger of the TTFT average and the queue wait).
	WaitMs   float64 `json:"wait_ms"`
	ScrapeOK bool    `json:"scrape_ok"`
	// EngineFailures is the engine's streak of failed answers; a replica
	// ejected for it carries the end of the ejection.
	EngineFailures int   `json:"engine_failures"`
	EjectedUntilMs int64 `json:"ejected_until_unix_ms,omitempty"`
	Ejections      int   `json:"ejections,omitempty"`
	// KVEvents: the replica's KV-event feed is live (its heartbeat says
	// so) and the dashboard's index holds its keys exactly; CachedBlocks
	// is then the prefix blocks its engine caches, as the index holds
	// them (the request keys deciders match on).
	KVEvents     bool `json:"kv_events"`
	CachedBlocks int  `json:"cached_blocks"`
	// KVFeedFailing is why the replica's adapter refused its engine's last
	// KV-event message (the heartbeat's kv_events_refused): a feed that is
	// failing; "" otherwise.
	KVFeedFailing string `json:"kv_feed_failing,omitempty"`
}

// loadView is a cold model's latest load status (llm.control.load.status).
type loadView struct {
	Model      string `json:"model"`
	Version    string `json:"version,omitempty"`
	Phase      string `json:"phase"`
	Loader     string `json:"loader"`
	Error      string `json:"error,omitempty"`
	ElapsedMs  int64  `json:"elapsed_ms"`
	ExpectedMs int64  `json:"expected_ms,omitempty"`
	AgeMs      int64  `json:"age_ms"`
}

// loadViews lists the load statuses by model. Lock should be held.
func (u *UI) loadViews(now time.Time) []loadView {
	out := make([]loadView, 0, len(u.loads))
	for _, l := range u.loads {
		st := l.st
		out = append(out, loadView{Model: st.Model, Version: st.Version, Phase: st.Phase, Loader: st.Loader, Error: st.Error,
			ElapsedMs: st.ElapsedMillis, ExpectedMs: st.ExpectedMillis, AgeMs: max(0, now.Sub(l.at).Milliseconds())})
	}
	slices.SortFunc(out, func(a, b loadView) int { return cmp.Compare(a.Model, b.Model) })
	return out
}

type decisionView struct {
	Seq uint64 `json:"seq"`
	subjects.Decision
}

// tableView is the table as the dashboard shows it: every entry but the
// API keys, which it only counts (a key's hash is as good as the key to
// anyone holding a table of hashes).
type tableView struct {
	Revision uint64     `json:"revision"`
	Keys     []tableKey `json:"keys"`
	APIKeys  int        `json:"api_keys"`
}

type tableKey struct {
	Key   string          `json:"key"`
	Value json.RawMessage `json:"value"`
}

// state builds the push for clients that have seen decisions up to
// afterSeq and the table at revision afterRev (full: everything).
// Lock should be held.
func (u *UI) state(now time.Time, full bool, afterSeq, afterRev uint64) *State {
	t := u.table()
	pol := table.DefaultPolicy()
	if t != nil {
		pol = t.Policy
	}
	s := &State{
		Full:      full,
		NowUnixMs: now.UnixMilli(),
		Policy: policyView{
			StaleAfterMs: time.Duration(pol.StaleAfter).Milliseconds(),
			DeadAfterMs:  time.Duration(pol.DeadAfter).Milliseconds(),
		},
		Models: u.groups(now, t, pol),
		Loads:  u.loadViews(now),
		Seen:   u.seq,
		Keep:   u.cfg.MaxDecisions,
	}
	if full {
		afterSeq, afterRev = 0, 0
	}
	s.Decisions = u.decisionsAfter(afterSeq)
	if t != nil && (full || t.Revision != afterRev) {
		s.Table = tableOf(t)
	}
	return s
}

// groups lists every replica known from the table or a heartbeat, by model,
// then pool, then id. Lock should be held.
func (u *UI) groups(now time.Time, t *table.Snapshot, pol table.Policy) []modelGroup {
	var reg map[string]*table.Replica
	if t != nil {
		reg = t.Replicas
	}
	ids := map[string]bool{}
	for id := range reg {
		ids[id] = true
	}
	for id, h := range u.replicas {
		if reg[id] == nil && now.Sub(h.at) > forgetAfter {
			delete(u.replicas, id)
			u.kv.Remove(id)
			continue
		}
		ids[id] = true
	}
	type keyed struct {
		model, pool string
		r           replicaView
	}
	var all []keyed
	for id := range ids {
		k := keyed{r: replicaView{ID: id, Release: pol.AffinityReleaseThreshold, Saturation: pol.SaturationKV}}
		state := ""
		if r := reg[id]; r != nil {
			k.model, k.pool, k.r.Version = r.Model, r.Pool, r.Version
			k.r.Registered = true
			k.r.Role = cmp.Or(r.Role, table.RoleBoth)
			k.r.MaxBatch, k.r.MaxQueue, k.r.MaxLoras = r.MaxBatch, r.MaxQueue, r.MaxLoras
			state = r.State
		}
		if h, ok := u.replicas[id]; ok {
			hb := h.hb
			if k.model == "" {
				k.model, k.pool, k.r.Version = hb.Model, hb.Pool, hb.Version
			}
			k.r.Heartbeat = true
			k.r.Region = hb.Region
			k.r.AgeMs = max(0, now.Sub(h.at).Milliseconds())
			k.r.KVUsage, k.r.Running, k.r.Waiting, k.r.Inflight = hb.KVUsage, hb.Running, hb.Waiting, hb.Inflight
			k.r.MaxBatch, k.r.MaxQueue = cmp.Or(hb.MaxBatch, k.r.MaxBatch), cmp.Or(hb.MaxQueue, k.r.MaxQueue)
			k.r.Loras, k.r.MaxLoras = hb.Lora.Running, cmp.Or(hb.Lora.Max, k.r.MaxLoras)
			k.r.TTFTMs, k.r.ScrapeOK = hb.TTFTEWMAMillis, hb.ScrapeOK
			k.r.WaitMs = max(hb.TTFTEWMAMillis, hb.QueueWaitMillis)
			k.r.EngineFailures = hb.EngineFailures
			k.r.KVEvents = hb.KVEvents && u.kv.Synced(id)
			k.r.KVFeedFailing = hb.KVEventsRefused
			state = subjects.Restrictive(state, hb.State)
		}
		k.r.CachedBlocks = u.kv.Keys(id)
		k.r.State = state
		if e, ok := u.ejections[id]; ok {
			if e.UntilUnixMs > now.UnixMilli() {
				k.r.EjectedUntilMs, k.r.Ejections = e.UntilUnixMs, e.Count
			} else if now.UnixMilli()-e.UntilUnixMs > forgetAfter.Milliseconds() {
				delete(u.ejections, id)
			}
		}
		if t != nil {
			if p := t.Pools[k.pool]; p != nil {
				if p.AffinityReleaseThreshold != nil {
					k.r.Release = *p.AffinityReleaseThreshold
				}
				if p.SaturationKV != nil {
					k.r.Saturation = *p.SaturationKV
				}
			}
		}
		all = append(all, k)
	}
	slices.SortFunc(all, func(a, b keyed) int {
		return cmp.Or(cmp.Compare(a.model, b.model), cmp.Compare(a.pool, b.pool), cmp.Compare(a.r.ID, b.r.ID))
	})
	out := []modelGroup{}
	for _, k := range all {
		if len(out) == 0 || out[len(out)-1].Model != k.model {
			out = append(out, modelGroup{Model: k.model})
		}
		m := &out[len(out)-1]
		if len(m.Pools) == 0 || m.Pools[len(m.Pools)-1].Pool != k.pool {
			m.Pools = append(m.Pools, poolGroup{Pool: k.pool})
		}
		p := &m.Pools[len(m.Pools)-1]
		p.Replicas = append(p.Replicas, k.r)
	}
	return out
}

func tableOf(t *table.Snapshot) *tableView {
	v := &tableView{Revision: t.Revision, Keys: make([]tableKey, 0, len(t.Raw))}
	for _, k := range slices.Sorted(maps.Keys(t.Raw)) {
		if strings.HasPrefix(k, table.PrefixKeys) {
			v.APIKeys++
			continue
		}
		v.Keys = append(v.Keys, tableKey{Key: k, Value: t.Raw[k]})
	}
	return v
}
