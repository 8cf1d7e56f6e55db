// The dashboard: snapshots from GET /api/dashboard/events (server-sent events, docs/serve.md; read
// with fetch, which can send the API key, where EventSource cannot), drawn as a per-layer heat
// map with residency strips, tier counters, the time split, SpecGate, MoCE, budgets and the
// model's shape. Rates ("per token") are differences between the newest
// snapshot and one about RATE_WINDOW_S older, per window row; with no rows in that span they are
// since start.
'use strict';
(function (S) {
  const el = S.el;
  const RATE_WINDOW_S = 5;
  const history = [];  // recent snapshots: {t, snap}
  const speed = [];    // decode tok/s per snapshot, for the sparkline
  const D = S.dash = { snapshot: null, renders: 0, events: 0 };

  const COLORS = { s: '#3a444f', r: '#3ccf7a', p: '#4aa3ff', g: '#c77dff', m: '#8a96a3', '-': '#0f1419' };
  const RAMP = [[15, 20, 25], [59, 31, 107], [181, 58, 110], [242, 165, 65], [255, 246, 160]];
  function heatColor(x) {  // x in [0, 1]
    const t = Math.max(0, Math.min(1, Math.sqrt(x))) * (RAMP.length - 1);
    const i = Math.min(RAMP.length - 2, Math.floor(t)), f = t - i;
    const c = RAMP[i].map((v, k) => Math.round(v + (RAMP[i + 1][k] - v) * f));
    return 'rgb(' + c.join(',') + ')';
  }

  // Sizes a canvas to its on-screen width in device pixels (so the map stays sharp at any width)
  // and returns a context drawing in CSS pixels, and that width.
  function fitCanvas(canvas, cssHeight) {
    const dpr = window.devicePixelRatio || 1;
    const cssWidth = Math.max(200, canvas.clientWidth || canvas.parentNode.clientWidth || 600);
    const w = Math.round(cssWidth * dpr), h = Math.round(cssHeight * dpr);
    if (canvas.width !== w || canvas.height !== h) { canvas.width = w; canvas.height = h; }
    const ctx = canvas.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    return { ctx, width: cssWidth };
  }

  function drawHeat(s) {
    const canvas = document.getElementById('heat');
    const blocks = s.blocks.filter(b => b.present);
    const nExpert = s.model.n_expert || 1;
    const labelW = 32, cellH = 12, stripH = 3, gap = 2, rowH = cellH + stripH + gap;
    const height = Math.max(rowH, blocks.length * rowH) + 14;
    const { ctx, width } = fitCanvas(canvas, height);
    ctx.fillStyle = '#0f1419';
    ctx.fillRect(0, 0, width, height);
    const cellW = (width - labelW) / nExpert;
    ctx.font = '10px sans-serif';
    ctx.textBaseline = 'middle';
    blocks.forEach((b, row) => {
      const y = row * rowH;
      ctx.fillStyle = '#7f8b97';
      ctx.fillText(b.mtp ? 'MTP' : 'L' + b.index, 2, y + cellH / 2);
      const heat = s.heat.rows[b.index] || [];
      const res = s.residency.rows[b.index] || '';
      for (let e = 0; e < nExpert; e++) {
        const x = labelW + e * cellW;
        ctx.fillStyle = heatColor((heat[e] || 0) / s.heat.scale);
        ctx.fillRect(x, y, Math.max(1, cellW - (cellW > 3 ? 1 : 0)), cellH);
        ctx.fillStyle = COLORS[res[e]] || COLORS['-'];
        ctx.fillRect(x, y + cellH, Math.max(1, cellW - (cellW > 3 ? 1 : 0)), stripH);
      }
    });
    ctx.fillStyle = '#7f8b97';
    ctx.fillText('expert 0', labelW, height - 7);
    ctx.textAlign = 'right';
    ctx.fillText(String(nExpert - 1), width - 2, height - 7);
    ctx.textAlign = 'left';
    document.getElementById('heat-caption').textContent =
      blocks.length + ' layers × ' + nExpert + ' experts, top-' + s.model.n_expert_used +
      '; heat = routed rows, decayed ×' + s.heat.decay_per_row + ' per row';
  }

  function legend(s) {
    const sw = (color, text) => el('span', {}, el('span', { class: 'swatch' }), text);
    const items = [el('span', {}, el('span', { class: 'swatch ramp' }), 'heat: cold → hot')];
    const tiers = s.placement.source === 'store'
      ? [['g', 'GPU (empty: no CUDA backend yet)'], ['p', 'RAM, pinned'], ['r', 'RAM'], ['s', 'SSD only']]
      : [['m', 'read through the GGUF mapping (page cache)']];
    for (const [code, text] of tiers) {
      const node = sw(COLORS[code], text);
      node.firstChild.style.background = COLORS[code];
      items.push(node);
    }
    document.getElementById('heat-legend').replaceChildren(...items);
  }

  // The snapshot about RATE_WINDOW_S before the newest with fewer routed rows, or null.
  function baseline(s) {
    let base = null;
    for (const h of history) if (h.snap.uptime_s <= s.uptime_s - RATE_WINDOW_S) base = h.snap;
    if (!base && history.length) base = history[0].snap;
    if (!base || base.engine.rows_routed >= s.engine.rows_routed) return null;
    return base;
  }
  function delta(s, base, f) { return base ? f(s) - f(base) : f(s); }

  function kpis(s) {
    const g = s.generation;
    const tps = g.decode_tokens_per_second;
    const items = [
      ['decode tok/s', tps ? S.num(tps, 1) : '–'],
      ['time to first token', g.ttft_ms != null ? S.num(g.ttft_ms, 0) + ' ms' : '–'],
      ['prompt tok/s', g.prompt_tokens_per_second ? S.num(g.prompt_tokens_per_second, 0) : '–'],
      ['generation', g.id ? '#' + g.id + (g.running ? ' running' : ' ' + (g.finish_reason || '')) : 'none yet'],
      ['tokens (prompt + reply)', g.id ? g.prompt_tokens + ' + ' + g.completion_tokens : '–'],
      ['queue', s.server ? s.server.queue_depth + ' / ' + s.server.queue_capacity : '–']];
    document.getElementById('kpis').replaceChildren(...items.map(([k, v]) =>
      el('div', { class: 'kpi' }, el('div', { class: 'v', text: v }), el('div', { class: 'k', text: k }))));
  }

  function tiers(s, base) {
    const rows = delta(s, base, x => x.engine.rows_routed) || 0;
    const per = n => rows > 0 ? n / rows : null;
    const e = s.experts, be = base && base.experts;
    const d = (f) => e ? f(e) - (be ? f(be) : 0) : 0;
    const store = s.placement.source === 'store';
    const needed = store ? d(x => x.needed) : delta(s, base, x => x.tiers.ram.hits);
    const ramHits = delta(s, base, x => x.tiers.ram.hits);
    const ramBytes = delta(s, base, x => x.tiers.ram.bytes_served);
    const ssdBytes = delta(s, base, x => x.tiers.ssd.bytes_read);
    const misses = d(x => x.misses);
    const head = el('tr', {}, ...['tier', 'holds', 'resident experts', 'hit rate', 'misses / token', 'bytes / token'].map(t => el('th', { text: t })));
    const tr = (...cells) => el('tr', {}, ...cells.map(c => el('td', { text: c })));
    const table = document.getElementById('tiers');
    const total = s.blocks.filter(b => b.present).length * s.model.n_expert;
    table.replaceChildren(head,
      tr('GPU', '0 B: empty until the CUDA backend lands', '0', '–', '–', '–'),
      tr(store ? 'RAM arena' : 'RAM (mapped)', store ? S.bytes(s.placement.ram.arena_bytes) : 'page cache',
         store ? s.placement.ram.resident_experts + ' / ' + total : 'all ' + total,
         needed ? S.pct(ramHits / needed) : '–', '–', S.bytes(per(ramBytes))),
      tr('SSD', store ? S.bytes(s.placement.ssd.sidecar_bytes) : '–', store ? String(total) : '–', '–',
         store ? S.num(per(misses), 2) : '–', store ? S.bytes(per(ssdBytes)) : '–'));
    const io = document.getElementById('io');
    if (e) {
      const issued = d(x => x.read_ahead_issued), used = d(x => x.read_ahead_used);
      const cold = misses + used;
      io.textContent = 'read-ahead precision ' + S.pct(issued ? used / issued : null) + ', recall ' +
        S.pct(cold ? used / cold : null) + ' (' + issued + ' issued) · I/O wait ' +
        S.num(per(d(x => x.io_wait_ms)), 2) + ' ms/token · ' + (base ? 'last ' + RATE_WINDOW_S + ' s' : 'since start') +
        ' · totals: ' + e.hits + ' hits, ' + e.misses + ' misses, ' + S.bytes(e.bytes_read) + ' read';
    } else {
      io.textContent = 'no expert store: experts are read through the GGUF mapping (pack the model and give ' +
        '--ram-budget to stream them from SSD)';
    }
  }

  const PHASE_COLORS = { mixer: '#4aa3ff', router: '#c77dff', shared_expert: '#3ccf7a', expert_fetch: '#ff6b6b',
                         routed_experts: '#f2a541', head: '#8a96a3', other: '#3a444f' };
  function phases(s, base) {
    const box = document.getElementById('phases');
    if (!s.engine.profile) { box.textContent = 'off (strata serve --no-profile)'; return; }
    const rows = delta(s, base, x => x.engine.rows_routed);
    const parts = Object.keys(s.engine.phases_ms).map(k => [k, delta(s, base, x => x.engine.phases_ms[k])]);
    const sum = parts.reduce((a, [, v]) => a + v, 0);
    if (sum <= 0) { box.textContent = 'no windows yet'; return; }
    const bar = el('div', { class: 'bar' });
    for (const [k, v] of parts) {
      const span = el('span', { title: k + ' ' + v.toFixed(1) + ' ms' });
      span.style.width = (100 * v / sum) + '%';
      span.style.background = PHASE_COLORS[k] || '#555';
      bar.append(span);
    }
    const list = el('div', { class: 'rows' }, ...parts.map(([k, v]) => {
      const sw = el('span', { class: 'swatch' });
      sw.style.background = PHASE_COLORS[k] || '#555';
      return el('div', {}, el('span', {}, sw, k.replace('_', ' ')),
                el('span', { text: (rows ? (v / rows).toFixed(3) + ' ms/token · ' : '') + (100 * v / sum).toFixed(0) + ' %' }));
    }));
    box.replaceChildren(bar, list, el('div', { class: 'small muted', text: base ? 'last ' + RATE_WINDOW_S + ' s' : 'since start' }));
  }

  function spec(s) {
    const box = document.getElementById('spec');
    if (!s.spec) { box.textContent = 'off (strata serve --spec mtp|suffix|both)'; return; }
    const p = s.spec;
    const max = Math.max(1, ...p.depth_counts);
    const hist = el('div', { class: 'hist' }, ...p.depth_counts.map((n, k) => {
      const bar = el('div', { title: n + ' windows with ' + k + ' drafts' }, el('span', { text: 'k=' + k }));
      bar.style.height = (100 * n / max) + '%';
      return bar;
    }));
    box.replaceChildren(el('div', { class: 'rows' },
      el('div', {}, el('span', { text: 'mode' }), el('span', { text: p.mode })),
      el('div', {}, el('span', { text: 'SpecGate depth (last window)' }), el('span', { text: String(p.last_depth) })),
      el('div', {}, el('span', { text: 'acceptance' }), el('span', { text: S.pct(p.drafted ? p.acceptance : null) + ' (' + p.accepted + ' / ' + p.drafted + ')' })),
      el('div', {}, el('span', { text: 'windows / verifies' }), el('span', { text: p.windows + ' / ' + p.verifies })),
      el('div', {}, el('span', { text: 'declined / forced plain' }), el('span', { text: p.declined + ' / ' + p.forced_plain }))),
      el('div', { class: 'small muted', text: 'windows by drafts carried' }), hist);
  }

  function moce(s) {
    const box = document.getElementById('moce');
    if (!s.moce) { box.textContent = 'off (exact routing; strata serve --moce λ)'; return; }
    const m = s.moce;
    const kv = (k, v) => el('div', {}, el('span', { text: k }), el('span', { text: v }));
    box.replaceChildren(el('div', { class: 'rows' }, kv('λ', String(m.lambda)),
      kv('swaps / token', S.num(s.engine.rows_routed ? m.swaps / s.engine.rows_routed : 0, 3)),
      kv('agreement with exact top-k', S.pct(m.agreement)), kv('KL(p ‖ p′)', m.kl.toExponential(2) + ' nats/row'),
      kv('relMSE (' + m.mse_samples + ' samples)', m.relmse.toExponential(2))));
  }

  function bytes(s) {
    const b = s.bytes, pl = s.placement, store = pl.source === 'store';
    const parts = [['GPU arena', pl.gpu.arena_bytes, '#c77dff'], ['dense (RAM, mapped)', b.dense, '#8a96a3'],
                   [store ? 'expert arena (RAM)' : 'experts (mapped)', store ? pl.ram.arena_bytes : b.experts, '#3ccf7a'],
                   ['experts only on SSD', store ? Math.max(0, b.experts - pl.ram.arena_bytes) : 0, '#3a444f']];
    const total = parts.reduce((a, [, v]) => a + v, 0) || 1;
    const bar = el('div', { class: 'bar' });
    for (const [k, v, c] of parts) {
      const span = el('span', { title: k + ' ' + S.bytes(v) });
      span.style.width = (100 * v / total) + '%';
      span.style.background = c;
      bar.append(span);
    }
    const kv = (k, v) => el('div', {}, el('span', { text: k }), el('span', { text: v }));
    document.getElementById('bytes').replaceChildren(bar, el('div', { class: 'rows' },
      kv('GPU budget', S.bytes(pl.gpu.arena_bytes) + ' — ' + pl.gpu.note),
      kv('RAM expert budget', store ? S.bytes(pl.ram.arena_bytes) + ' (' + pl.ram.slots_per_layer + ' slots/layer)' : 'none: mapped'),
      kv('dense weights (RAM)', S.bytes(b.dense)),
      kv('routed experts', S.bytes(b.experts) + (store ? ' in ' + pl.ssd.sidecar_path : ' in the GGUF')),
      kv('I/O', store ? (pl.ssd.direct_io ? 'O_DIRECT' : 'buffered') + (pl.ssd.io_uring ? ', io_uring' : ', pread') +
                        (pl.ssd.read_ahead ? ', read-ahead' : ', no read-ahead') : '–'),
      kv('model file', S.bytes(b.file))));
  }

  function shape(s) {
    const m = s.model;
    const rows = [['model', m.id], ['architecture', m.arch], ['layers', m.n_layer + (m.n_nextn ? ' + ' + m.n_nextn + ' MTP' : '')],
                  ['hidden', m.n_embd], ['experts', m.n_expert + ', top-' + m.n_expert_used + ', FFN ' + m.n_ff_exp],
                  ['shared expert FFN', m.n_ff_shexp || 'none'], ['vocabulary', m.n_vocab], ['context', m.n_ctx || 'unlimited'],
                  ['file', m.path]];
    document.getElementById('shape').replaceChildren(...rows.map(([k, v]) =>
      el('tr', {}, el('td', { text: k }), el('td', { text: String(v) }))));
  }

  function drawSpeed(s) {
    const g = s.generation;
    speed.push(g.running ? g.decode_tokens_per_second || 0 : 0);
    if (speed.length > 240) speed.shift();
    const h = 60;
    const { ctx, width: w } = fitCanvas(document.getElementById('speed'), h);
    const max = Math.max(1, ...speed);
    ctx.fillStyle = '#0f1419';
    ctx.fillRect(0, 0, w, h);
    ctx.strokeStyle = '#4aa3ff';
    ctx.beginPath();
    speed.forEach((v, i) => { const x = w - (speed.length - 1 - i) * (w / 240), y = h - 4 - (h - 14) * v / max; i ? ctx.lineTo(x, y) : ctx.moveTo(x, y); });
    ctx.stroke();
    ctx.fillStyle = '#7f8b97';
    ctx.font = '10px sans-serif';
    ctx.fillText('max ' + max.toFixed(1) + ' tok/s', 4, 10);
  }

  function render(s) {
    D.snapshot = s;
    history.push({ t: s.uptime_s, snap: s });
    while (history.length > 2 && history[1].snap.uptime_s <= s.uptime_s - 2 * RATE_WINDOW_S) history.shift();
    const base = baseline(s);
    drawHeat(s);
    legend(s);
    kpis(s);
    tiers(s, base);
    phases(s, base);
    spec(s);
    moce(s);
    bytes(s);
    shape(s);
    drawSpeed(s);
    D.renders++;
  }

  // An SVG plot as a data: URL, fetched with the API key (an <img src> request cannot carry it;
  // the page's policy allows data: images, and an SVG shown as an image runs no script).
  async function plotSource(url) {
    const response = await S.api(url);
    if (!response.ok) throw new Error('HTTP ' + response.status);
    return 'data:image/svg+xml;charset=utf-8,' + encodeURIComponent(await response.text());
  }

  function plots() {
    S.api('/api/plots').then(r => r.ok ? r.json() : null).then(p => {
      if (!p) return;
      const box = document.getElementById('plots');
      if (!p.plots.length) {
        box.replaceChildren(el('span', { class: 'muted small',
          text: p.dir ? 'no SVG files in ' + p.dir + ' yet' : 'start strata serve with --plots DIR to show the SVGs strata bench --svg wrote there' }));
        return;
      }
      box.replaceChildren(...p.plots.map(f => {
        const img = el('img', { alt: f.name });
        plotSource(f.url).then(src => { img.src = src; }).catch(() => {});
        return el('figure', {}, img,
          el('figcaption', { class: 'small muted' }, el('a', { href: f.url, text: f.name }), ' · ' + S.bytes(f.bytes)));
      }));
    }).catch(() => {});
  }

  // The event stream, as EventSource would read it: reconnects `retry` ms after it ends or fails,
  // sending Last-Event-ID (the server then sends only newer snapshots). After a 401 it waits for
  // a key (S.onKey connects again). `stream` is the open connection's AbortController.
  let stream = null, lastEventId = null, retryMs = 2000;
  function setLive(text, state) {
    const live = document.getElementById('live');
    live.textContent = text;
    live.className = 'pill ' + state;
  }
  async function connect() {
    if (stream) stream.abort();
    const controller = stream = new AbortController();
    try {
      const headers = lastEventId !== null ? { 'Last-Event-ID': lastEventId } : {};
      const response = await S.api('/api/dashboard/events?interval_ms=250', { headers, signal: controller.signal });
      if (response.status === 401) { setLive('API key needed', 'bad'); return; }
      if (!response.ok) throw new Error('HTTP ' + response.status);
      await S.readEvents(response, e => {
        if (e.id !== null) lastEventId = e.id;
        if (e.retry !== null) retryMs = e.retry;
        if (e.event === 'snapshot') {
          D.events++;
          const s = JSON.parse(e.data);
          setLive(s.generation.running ? 'generating' : 'idle', s.generation.running ? 'busy' : 'ok');
          render(s);
        } else if (e.event === 'end') {
          setLive('server stopping', 'bad');
        }
      });
    } catch (e) {
      if (controller.signal.aborted) return;  // replaced by a newer connection
    }
    if (controller !== stream) return;
    if (document.getElementById('live').textContent !== 'server stopping') setLive('reconnecting', 'bad');
    setTimeout(() => { if (controller === stream) connect(); }, retryMs);
  }

  document.addEventListener('DOMContentLoaded', () => {
    connect();
    plots();
    S.onKey(() => { connect(); plots(); });
  });
})(window.strata);
