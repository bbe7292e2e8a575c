// The dashboard page. The server pushes "state" events on /ui/events: a full
// state first, then only what changed (new decisions, the table when its
// revision moves). Heartbeat ages tick here between pushes; nothing polls.
'use strict';
(() => {
  let decisions = []; // newest first, at most state.decisions_kept
  let table = null;
  let last = null; // the latest state
  let receivedAt = 0; // performance.now() when `last` arrived
  let openKey = '';
  const fresh = new Set();

  const $ = id => document.getElementById(id);

  // h builds an element; text goes in as text, never as HTML.
  function h(tag, cls, ...kids) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    for (const k of kids) {
      if (k === null || k === undefined || k === false) continue;
      e.append(k instanceof Node ? k : String(k));
    }
    return e;
  }

  // apply merges a push and reports whether the decisions changed.
  function apply(s) {
    let changed = true;
    if (s.full) {
      decisions = s.decisions || [];
      fresh.clear();
      table = s.table || null;
    } else {
      const top = decisions.length ? decisions[0].seq : 0;
      const added = (s.decisions || []).filter(d => d.seq > top);
      for (const d of added) fresh.add(d.seq);
      changed = added.length > 0;
      decisions = added.concat(decisions).slice(0, s.decisions_kept || 200);
      if (s.table) table = s.table;
    }
    last = s;
    receivedAt = performance.now();
    return changed;
  }

  // ---- replicas ----

  function ageOf(r) {
    return r.age_ms + (performance.now() - receivedAt);
  }

  // liveness is what the heartbeat says about a replica, next to its state.
  function liveness(r) {
    if (!r.heartbeat) return 'missing';
    const age = ageOf(r);
    if (age > last.policy.dead_after_ms) return 'dead';
    if (age > last.policy.stale_after_ms) return 'stale';
    return '';
  }

  function fmtAge(r) {
    if (!r.heartbeat) return 'no heartbeat';
    const s = ageOf(r) / 1000;
    return s < 60 ? s.toFixed(1) + ' s ago' : Math.round(s / 60) + ' min ago';
  }

  function kvBar(r) {
    const pct = Math.max(0, Math.min(1, r.kv_usage)) * 100;
    const fill = h('div', 'fill' + (r.kv_usage >= r.saturation_kv ? ' hot' : r.kv_usage >= r.release_threshold ? ' warn' : ''));
    fill.style.width = pct.toFixed(1) + '%';
    const bar = h('div', 'bar', fill);
    bar.title = `release threshold ${(r.release_threshold * 100).toFixed(0)}%, saturated at ${(r.saturation_kv * 100).toFixed(0)}%`;
    return h('div', 'kv', bar, h('span', 'pct', pct.toFixed(1) + '%'));
  }

  function stateBadge(r) {
    const live = liveness(r);
    const ejected = r.ejected_until_unix_ms > last.now_unix_ms;
    const label = live || (ejected ? 'ejected' : r.state || 'unknown');
    const b = h('span', 'badge st-' + label, label);
    b.title = (r.registered ? 'registered' : 'not in the table') + (r.state ? ', state ' + r.state : '');
    if (ejected) {
      b.title += `; ejected for ${r.engine_failures} engine failures in a row, for ${((r.ejected_until_unix_ms - last.now_unix_ms) / 1000).toFixed(0)} s more (ejection ${r.ejections})`;
    } else if (r.engine_failures) {
      b.title += `; ${r.engine_failures} engine failures in a row`;
    }
    return b;
  }

  // waitCell is the time to a first token the brokers estimate; deadlines
  // are admitted against it.
  function waitCell(r) {
    const td = h('td', 'num', r.wait_ms ? r.wait_ms.toFixed(0) + ' ms' : '—');
    td.title = `estimated wait to the first token (TTFT average ${(r.ttft_ewma_ms || 0).toFixed(0)} ms)`;
    return td;
  }

  // roleCell is what the replica serves of a disaggregated model: a
  // prefill replica takes only prefill legs, a decode replica the rest.
  function roleCell(r) {
    const role = r.role || '';
    const td = h('td', 'role' + (role === 'both' ? ' dim' : ' role-' + role), role || '—');
    td.title = role === 'prefill' ? 'runs the prefill legs of split requests, never a whole request'
      : role === 'decode' ? 'decodes split requests after their prefill leg; serves short prompts whole'
        : role === 'both' ? 'serves whole requests' : 'not in the table';
    return td;
  }

  function of(n, max) {
    return max ? `${n}/${max}` : String(n);
  }

  const columns = ['pool', 'replica', 'region', 'version', 'role', 'state', 'KV cache', 'cached blocks', 'running', 'waiting', 'in flight', 'LoRA', 'wait', 'heartbeat'];
  const numeric = new Set(['cached blocks', 'running', 'waiting', 'in flight', 'LoRA', 'wait', 'heartbeat']);

  // cachedCell is the prefix blocks the replica's engine caches, from the
  // KV-event index; a dash for a replica without a live feed.
  function cachedCell(r) {
    if (r.kv_feed_failing) {
      const td = h('td', 'num feed-failing', 'failing');
      td.title = `KV-event feed failing: its adapter refused the engine's last message (${r.kv_feed_failing}); brokers place this replica by their placements`;
      return td;
    }
    if (!r.kv_events) {
      const td = h('td', 'num dim', '—');
      td.title = 'no live KV-event feed: brokers place this replica by their placements';
      return td;
    }
    const td = h('td', 'num', String(r.cached_blocks));
    td.title = 'prefix blocks its engine caches, from its KV-cache events';
    return td;
  }


  function replicaRow(r, pool) {
    const age = h('td', 'num age', fmtAge(r));
    age.dataset.id = r.id;
    const lora = h('td', 'num', r.max_loras ? of((r.loras || []).length, r.max_loras) : '—');
    if ((r.loras || []).length) lora.title = r.loras.join(', ');
    return h('tr', pool ? 'first' : '',
      h('td', 'pool', pool),
      h('td', 'id', r.id),
      h('td', 'mono dim', r.region || ''),
      h('td', 'mono dim', r.version || ''),
      roleCell(r),
      h('td', '', stateBadge(r)),
      h('td', '', kvBar(r)),
      cachedCell(r),
      h('td', 'num', of(r.running, r.max_batch)),
      h('td', 'num', of(r.waiting, r.max_queue)),
      h('td', 'num', r.inflight),
      lora,
      waitCell(r),
      age);
  }

  // One table for every model, so the columns line up: a row per model,
  // then its replicas by pool, the pool named on its first replica.
  function renderReplicas() {
    const box = $('replicas');
    if (!last.models.length) {
      box.replaceChildren(h('p', 'empty', 'Waiting for heartbeats…'));
      return;
    }
    const head = h('tr', '', ...columns.map(c => h('th', 'c-' + c.replace(' ', '-') + (numeric.has(c) ? ' num' : ''), c)));
    const body = h('tbody');
    for (const m of last.models) {
      const mrow = h('tr', 'model', h('td', '', m.model || '(unknown model)'));
      mrow.firstChild.colSpan = columns.length;
      body.append(mrow);
      for (const p of m.pools) {
        p.replicas.forEach((r, i) => body.append(replicaRow(r, i === 0 ? (p.pool || '?') : '')));
      }
    }
    box.replaceChildren(h('table', 'replicas', h('thead', '', head), body));
  }

  function tickAges() {
    if (!last) return;
    const byId = new Map();
    for (const m of last.models) for (const p of m.pools) for (const r of p.replicas) byId.set(r.id, r);
    for (const td of document.querySelectorAll('td.age')) {
      const r = byId.get(td.dataset.id);
      if (!r) continue;
      td.textContent = fmtAge(r);
      const live = liveness(r);
      td.className = 'num age' + (live === 'dead' || live === 'missing' ? ' dead' : live === 'stale' ? ' stale' : '');
    }
  }

  // ---- decisions ----

  function fmtTime(ms) {
    const d = new Date(ms);
    const p = (n, w) => String(n).padStart(w, '0');
    return `${p(d.getHours(), 2)}:${p(d.getMinutes(), 2)}:${p(d.getSeconds(), 2)}.${p(d.getMilliseconds(), 3)}`;
  }

  function decisionCard(d) {
    const rejected = !!d.code;
    const route = h('span', 'd-route', d.requested_model || '?');
    if (d.model && d.model !== d.requested_model) {
      route.append(h('span', 'arrow', '→'), d.model);
    }
    if (d.version) route.append(' ' + d.version);
    if (d.lora) route.append(h('span', 'dim', ' +lora ' + d.lora));
    const line1 = h('div', 'd-line', h('span', 'd-tenant', d.tenant || 'default'), route,
      d.pool ? h('span', 'd-pool', d.pool) : null);
    const line2 = h('div', 'd-line');
    if (rejected) {
      line2.append(h('span', 'd-reason', `${d.status} ${d.code}`), h('span', 'd-msg', d.message || ''));
    } else {
      line2.append(h('span', 'd-replica', d.replica || '—'), h('span', 'd-reason', d.reason || ''));
      const alt = (d.alternatives || [])[0];
      line2.append(alt
        ? h('span', 'd-lost', 'runner-up ', h('span', 'id', alt.replica), ` lost: ${alt.why} `,
          h('span', 'mono', `(${alt.score.toFixed(3)} vs ${(d.score || 0).toFixed(3)})`))
        : h('span', 'd-lost', 'no runner-up'));
    }
    if (d.split) {
      line2.append(d.prefill_replica
        ? h('span', 'd-split', 'prefill on ', h('span', 'id', d.prefill_replica), `, decode on ${d.replica || '?'} (${d.uncached_tokens || 0} uncached tokens)`)
        : h('span', 'd-split dim', `served whole: ${d.split.replace(/^whole: /, '')} (${d.uncached_tokens || 0} uncached tokens)`));
    }
    if (d.predicted_ttft_ms || d.ttft_objective_ms) {
      const ms = (v) => v >= 1000 ? `${(v / 1000).toFixed(2)} s` : `${Math.round(v)} ms`;
      const losers = (d.alternatives || []).map((a) => `${a.replica} ${ms(a.predicted_ttft_ms || 0)}`).join(', ');
      line2.append(h('span', 'd-ttft mono', (rejected ? '' : `predicted TTFT ${ms(d.predicted_ttft_ms || 0)}`) +
        (losers && !rejected ? ` (others: ${losers})` : '') + (d.ttft_objective_ms ? `; objective ${ms(d.ttft_objective_ms)}` : '')));
    }
    if ((d.shares || []).length) {
      const pc = (v) => `${Math.round(100 * v)}%`;
      line2.append(h('span', 'd-shares mono', 'pool sheds; tokens in flight: ' +
        d.shares.map((s) => `${s.tenant} ${pc(s.share)} (weight ${s.weight}, fair ${pc(s.fair_share)})`).join(', ')));
    }
    if (d.resume_from) {
      line2.append(h('span', 'd-resume', `resumed from ${d.resume_from} → ${d.replica || '?'}, ${d.resume_tokens || 0} tokens carried`));
    }
    if ((d.ejected || []).length) {
      line2.append(h('span', 'd-lost', (d.eject_panic ? 'kept in despite ejection (panic threshold): ' : 'ejected, left out: ') + d.ejected.join(', ')));
    }
    const card = h('div', 'decision' + (rejected ? ' rejected' : '') + (fresh.has(d.seq) ? ' fresh' : ''),
      h('div', 'd-time', fmtTime(d.decided_unix_ms)), h('div', 'd-what', line1, line2));
    card.dataset.seq = d.seq;
    card.title = `request ${d.request_id || '?'} · table rev ${d.table_revision} · decided in ${(d.duration_ns / 1000).toFixed(0)} µs`;
    return card;
  }

  function renderDecisions() {
    $('decisions-count').textContent = `${decisions.length} shown of ${last.decisions_seen} seen`;
    if (!decisions.length) {
      $('decisions').replaceChildren(h('p', 'empty', 'No decision yet: send a request.'));
      return;
    }
    $('decisions').replaceChildren(...decisions.map(decisionCard));
    fresh.clear();
  }

  // ---- routing table ----

  function renderTable() {
    if (!table) return;
    $('table-rev').textContent = `revision ${table.revision} · ${table.keys.length + (table.api_keys || 0)} keys`;
    const kinds = new Map();
    for (const k of table.keys) {
      const i = k.key.indexOf('.');
      const kind = i < 0 ? k.key : k.key.slice(0, i);
      if (!kinds.has(kind)) kinds.set(kind, []);
      kinds.get(kind).push(k);
    }
    const rows = [];
    for (const [kind, keys] of kinds) {
      const chips = keys.map(k => {
        const i = k.key.indexOf('.');
        const name = i < 0 ? k.key : k.key.slice(i + 1);
        const chip = h('button', 'key' + (k.key === openKey ? ' open' : ''), name);
        chip.title = k.key;
        chip.addEventListener('click', () => { openKey = openKey === k.key ? '' : k.key; renderTable(); });
        return chip;
      });
      rows.push(h('div', 'kind', h('span', 'kind-name', `${kind} (${keys.length})`), h('div', 'keys', ...chips)));
    }
    if (table.api_keys) {
      rows.push(h('div', 'kind', h('span', 'kind-name', `keys (${table.api_keys})`),
        h('div', 'keys', h('span', 'empty', 'API keys are not shown here: switchyard key list'))));
    }
    $('table').replaceChildren(...rows);
    const open = table.keys.find(k => k.key === openKey);
    const pre = $('table-value');
    pre.hidden = !open;
    pre.textContent = open ? `${open.key}\n${JSON.stringify(open.value, null, 2)}` : '';
  }

  // ---- cold loads ----

  function secs(ms) { return (ms / 1000).toFixed(1) + ' s'; }

  function loadRow(l) {
    let what;
    switch (l.phase) {
      case 'requested': case 'started':
        what = `loading: ${secs(l.elapsed_ms + l.age_ms)}` + (l.expected_ms ? ` of about ${secs(l.expected_ms)}` : '');
        break;
      case 'ready': what = `ready in ${secs(l.elapsed_ms)}`; break;
      case 'failed': what = `failed after ${secs(l.elapsed_ms)}: ${l.error || ''}`; break;
      case 'unloading': what = 'draining, then unloading'; break;
      case 'unloaded': what = `unloaded ${secs(l.age_ms)} ago`; break;
      default: what = l.phase;
    }
    return h('div', 'load ' + l.phase, h('span', 'id', l.model + (l.version ? ' ' + l.version : '')),
      h('span', 'phase', l.phase), h('span', '', what), h('small', 'mono', l.loader));
  }

  function renderLoads() {
    const loads = last.loads || [];
    if (!loads.length) {
      $('loads').replaceChildren(h('p', 'empty', 'No cold model has been asked for.'));
      return;
    }
    $('loads').replaceChildren(...loads.map(loadRow));
  }

  // ---- batches ----

  function batchRow(b) {
    const c = b.request_counts;
    const done = c.completed + c.failed;
    const pct = c.total ? Math.round(100 * done / c.total) : 0;
    const bar = h('span', 'bar', h('span', 'fill'));
    bar.firstChild.style.width = pct + '%';
    return h('div', 'load ' + b.status, h('span', 'id', b.id), h('span', 'phase', b.status),
      h('span', '', `${done} of ${c.total} (${pct}%)` + (c.failed ? `, ${c.failed} failed` : '')), bar,
      h('small', 'mono', b.tenant + ' ' + b.endpoint));
  }

  async function pollBatches() {
    try {
      const r = await fetch('batches', { cache: 'no-store' });
      if (!r.ok) return;
      const list = await r.json();
      $('batches').replaceChildren(...(list.length ? list.map(batchRow) : [h('p', 'empty', 'No batch yet.')]));
    } catch (e) { /* the next poll tries again */ }
  }

  // ---- budgets ----

  function budgetRow(b) {
    const pct = b.limit ? Math.min(100, Math.round(100 * b.spent / b.limit)) : 100;
    const bar = h('span', 'bar', h('span', 'fill'));
    bar.firstChild.style.width = pct + '%';
    const state = pct >= 100 ? 'failed' : pct >= 80 ? 'started' : 'ready';
    return h('div', 'load ' + state, h('span', 'id', b.tenant), h('span', 'phase', b.period + (b.alert_only ? ', alert only' : '')),
      h('span', '', `${b.spent} of ${b.limit} ${b.currency} (${pct}%)` + (b.leased ? `, ${b.leased} reserved` : '')), bar);
  }

  async function pollBudgets() {
    try {
      const r = await fetch('budgets', { cache: 'no-store' });
      if (!r.ok) return;
      const list = await r.json();
      $('budgets').replaceChildren(...(list.length ? list.map(budgetRow) : [h('p', 'empty', 'No tenant has a budget.')]));
    } catch (e) { /* the next poll tries again */ }
  }

  // ---- page ----

  function renderSummary() {
    let n = 0, ready = 0;
    for (const m of last.models) for (const p of m.pools) for (const r of p.replicas) {
      n++;
      if (r.state === 'ready' && !liveness(r)) ready++;
    }
    const s = $('summary');
    s.replaceChildren(h('b', '', n), ' replicas · ', h('b', '', ready), ' ready · table rev ',
      h('b', '', table ? table.revision : '—'), ' · ', h('b', '', last.decisions_seen), ' decisions');
  }

  function render(decisionsChanged, tableChanged) {
    renderSummary();
    renderReplicas();
    renderLoads();
    if (decisionsChanged) renderDecisions();
    if (tableChanged) renderTable();
  }

  function setConn(up) {
    const c = $('conn');
    c.className = 'conn ' + (up ? 'up' : 'down');
    c.textContent = up ? 'live' : 'reconnecting…';
  }

  const es = new EventSource('events');
  es.addEventListener('state', ev => {
    const s = JSON.parse(ev.data);
    const decisionsChanged = apply(s);
    setConn(true);
    render(decisionsChanged, s.full || !!s.table);
  });
  es.addEventListener('open', () => setConn(true));
  es.addEventListener('error', () => setConn(false));
  setInterval(tickAges, 500);
  pollBatches();
  setInterval(pollBatches, 2000);
  pollBudgets();
  setInterval(pollBudgets, 2000);
})();
