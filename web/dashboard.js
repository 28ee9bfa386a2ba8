// kvroute live dashboard: polls /dashboard/data.json (cumulative totals), keeps the history in the page, and draws
// each quantity over a trailing window on plain <canvas> (no libraries, no CDN).
// URL knobs: ?interval=<ms> between polls (default 2000), ?window=<s> trailing window for rates (default 30).
// biome-ignore lint/suspicious/noRedundantUseStrict: loaded as a classic <script> (web/dashboard.html), not a module
'use strict';

(() => {
  const params = new URLSearchParams(location.search);
  const INTERVAL_MS = Math.max(100, Number(params.get('interval')) || 2000);
  const WINDOW_S = Math.max(1, Number(params.get('window')) || 30);
  const SPAN_MS = 10 * 60 * 1000; // chart x span
  const MAX_POINTS = 600;
  const PALETTE = ['#4fc3f7', '#ffb74d', '#81c784', '#e57373', '#ba68c8', '#fff176', '#4db6ac', '#f06292', '#a1887f', '#90a4ae'];

  /** Raw polls: {t (client ms), d (server state)}, kept for the trailing window. */
  const polls = [];
  /** Chart series: chartId -> Map(seriesName -> {color, points: [{t, v}]}) */
  const charts = new Map();
  const debug = { polls: 0, errors: 0, lastError: null, pointsDrawn: {} };
  window.__kvrouteDashboard = debug;

  document.getElementById('window-s').textContent = String(WINDOW_S);

  const ratio = (a, b) => (b > 0 ? a / b : null);
  const fmt = (v, digits = 3) => (v === null || v === undefined || !Number.isFinite(v) ? '–' : v.toFixed(digits));
  const fmtInt = (v) => (v === null || v === undefined || !Number.isFinite(v) ? '–' : Math.round(v).toLocaleString('en-US'));

  function series(chartId, name, colorIndex) {
    let c = charts.get(chartId);
    if (!c) {
      c = new Map();
      charts.set(chartId, c);
    }
    let s = c.get(name);
    if (!s) {
      s = { color: PALETTE[(colorIndex ?? c.size) % PALETTE.length], points: [] };
      c.set(name, s);
    }
    return s;
  }

  function push(chartId, name, t, v, colorIndex) {
    const s = series(chartId, name, colorIndex);
    s.points.push({ t, v: v === undefined || (v !== null && !Number.isFinite(v)) ? null : v });
    if (s.points.length > MAX_POINTS) s.points.shift();
  }

  /** The poll closest to (at or before) `now - WINDOW_S`, else the oldest: the base of every trailing-window delta. */
  function basePoll(now) {
    const cutoff = now - WINDOW_S * 1000;
    let base = polls[0];
    for (const p of polls) {
      if (p.t <= cutoff) base = p;
      else break;
    }
    return base;
  }

  function ingest(d) {
    const now = Date.now();
    polls.push({ t: now, d });
    while (polls.length > 2 && polls[1].t <= now - WINDOW_S * 1000 - INTERVAL_MS * 2) polls.shift();
    const base = basePoll(now);
    const a = base.d;
    const dt = (now - base.t) / 1000;
    const first = base.t === now; // single poll: show cumulative-since-start instead of a window of nothing

    // Hit rates over the trailing window; on the very first poll, since the router started.
    const ra = first ? null : a.reuse;
    const r = d.reuse;
    const dv = (k) => r[k] - (ra ? ra[k] : 0);
    // A reset (router restarted under the page) makes deltas negative: fall back to cumulative values.
    const reset = ra && (r.requests < ra.requests || r.islBlocks < ra.islBlocks);
    const D = reset ? (k) => r[k] : dv;
    // Drawn in this order, so the line to read (predicted block-weighted) comes last, on top of the ones it often equals.
    push('hitrate', 'available block-weighted', now, ratio(D('bestOverlapBlocks'), D('islBlocks')), 2);
    push('hitrate', 'predicted request-weighted (histogram)', now, ratio(D('chosenRatioSum'), D('requests')), 1);
    push('hitrate', 'delivered (usage cached_tokens)', now, ratio(D('deliveredCachedTokens'), D('deliveredPromptTokens')), 3);
    if (d.engine) {
      const ea = first || !a.engine ? { queries: 0, hits: 0 } : a.engine;
      const dq = d.engine.queries - ea.queries;
      const dh = d.engine.hits - ea.hits;
      push('hitrate', 'engine hits/queries', now, dq < 0 ? null : ratio(dh, dq), 4);
    }
    push('hitrate', 'predicted block-weighted', now, ratio(D('overlapBlocks'), D('islBlocks')), 0);

    // Per-worker load and cache: current levels.
    const names = Object.keys(d.workers).sort();
    names.forEach((name, i) => {
      const w = d.workers[name];
      push('prefill', name, now, w.activePrefillTokens, i);
      push('active', name, now, w.activeBlocks, i);
      push('cache', name, now, w.indexedBlocks + (w.approxBlocks || 0), i);
    });
    push('cache', 'distinct blocks (index)', now, d.index.blocks, names.length);

    // Rates per second over the window (none on the first poll).
    const per = (x, y) => (first || dt <= 0 ? null : Math.max(0, x - y) / dt);
    push('events', 'events', now, per(d.events.events, a.events.events), 0);
    push('events', 'blocks applied', now, per(d.events.appliedBlocks, a.events.appliedBlocks), 1);
    push('events', 'blocks rejected', now, per(d.events.rejectedBlocks, a.events.rejectedBlocks), 3);
    push('events', 'gaps', now, per(d.events.gaps, a.events.gaps), 4);
    push('events', 'resets', now, per(d.events.resets, a.events.resets), 5);
    push('events', 'decode errors', now, per(d.events.decodeErrors, a.events.decodeErrors), 6);
    push('events', 'blind sources (count)', now, d.events.blindSources, 7);

    const phases = ['tokenize', 'hash', 'find_matches', 'select', 'total'];
    phases.forEach((ph, i) => {
      const o = d.overhead[ph];
      const ob = first ? { sum: 0, count: 0 } : a.overhead[ph];
      const n = o.count - ob.count;
      push('overhead', ph, now, n > 0 ? ((o.sum - ob.sum) / n) * 1e6 : null, i);
    });

    push('rps', 'routed', now, per(d.reuse.requests, a.reuse.requests), 0);
    const outcomes = new Set([...Object.keys(d.outcomes), ...Object.keys(d.refusals)]);
    let i = 1;
    for (const k of [...outcomes].sort()) {
      const cur = (d.outcomes[k] || 0) + (d.refusals[k] || 0);
      const prev = (a.outcomes[k] || 0) + (a.refusals[k] || 0);
      push('rps', k, now, per(cur, prev), i++);
    }

    // Event-loop delay: the server's last complete window (a stalled loop delays every stream the router relays).
    if (d.eventLoop) {
      push('eventloop', 'p99', now, d.eventLoop.p99Ms, 3);
      push('eventloop', 'mean', now, d.eventLoop.meanMs, 0);
      push('eventloop', 'max', now, d.eventLoop.maxMs, 1);
    }

    renderTiles(d);
    renderWorkers(d);
    for (const id of charts.keys()) draw(id);
    debug.polls++;
  }

  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' })[c]);

  function tile(label, value, note) {
    return `<div class="tile"><div class="label">${label}</div><div class="value">${value}</div>${note ? `<div class="note">${note}</div>` : ''}</div>`;
  }

  function renderTiles(d) {
    const r = d.reuse;
    const eng = d.engine ? ratio(d.engine.hits, d.engine.queries) : null;
    document.getElementById('tiles').innerHTML = [
      tile('predicted block-weighted', fmt(ratio(r.overlapBlocks, r.islBlocks)), 'ratio of sums: compare with engine'),
      tile('engine hits/queries', d.engine ? fmt(eng) : 'n/a', d.engine ? 'mirrored engine counters' : 'no engine mirror'),
      tile(
        'delivered',
        fmt(ratio(r.deliveredCachedTokens, r.deliveredPromptTokens)),
        `${fmtInt(r.deliveredRequests)} requests with cached_tokens`,
      ),
      tile('request-weighted', fmt(ratio(r.chosenRatioSum, r.requests)), "histogram's mean of ratios"),
      tile('available', fmt(ratio(r.bestOverlapBlocks, r.islBlocks)), 'best overlap in the fleet'),
      tile('requests routed', fmtInt(r.requests), `${fmtInt(d.inFlight)} in flight`),
      tile('index', fmtInt(d.index.blocks), `blocks · ${(d.index.bytes / 1048576).toFixed(1)} MiB`),
      tile('blind sources', fmtInt(d.events.blindSources), `${fmtInt(d.events.gaps)} gaps · ${fmtInt(d.events.resets)} resets`),
      tile(
        'event-loop lag p99',
        d.eventLoop ? `${fmt(d.eventLoop.p99Ms, 1)} ms` : 'n/a',
        d.eventLoop ? `mean ${fmt(d.eventLoop.meanMs, 1)} · max ${fmt(d.eventLoop.maxMs, 1)} ms (last ${d.eventLoop.windowS} s)` : '',
      ),
    ].join('');
  }

  function renderWorkers(d) {
    const rows = Object.keys(d.workers)
      .sort()
      .map((name) => {
        const w = d.workers[name];
        const r = w.reuse;
        const eng = w.engine ? ratio(w.engine.hits, w.engine.queries) : null;
        const gauge = w.engine && w.engine.hitRateGauge !== null ? ` (gauge ${fmt(w.engine.hitRateGauge)})` : '';
        return (
          `<tr><td>${esc(name)}</td><td>${w.mode}</td><td class="${w.healthy ? 'good' : 'bad'}">${w.healthy ? 'yes' : 'no'}</td>` +
          `<td class="${w.blind ? 'bad' : ''}">${w.blind ? 'blind' : fmtInt(w.events.events)}</td><td>${fmtInt(r.requests)}</td>` +
          `<td>${fmt(ratio(r.chosenRatioSum, r.requests))}</td><td>${fmt(ratio(r.overlapBlocks, r.islBlocks))}</td>` +
          `<td>${fmt(ratio(r.bestOverlapBlocks, r.islBlocks))}</td><td>${fmt(ratio(r.deliveredCachedTokens, r.deliveredPromptTokens))}</td>` +
          `<td>${w.engine ? fmt(eng) + gauge : '–'}</td><td>${fmtInt(w.activeRequests)}</td><td>${fmtInt(w.activeBlocks)}</td>` +
          `<td>${fmtInt(w.activePrefillTokens)}</td><td>${fmtInt(w.indexedBlocks)}</td></tr>`
        );
      });
    document.querySelector('#workers tbody').innerHTML = rows.join('');
  }

  function niceMax(v) {
    if (!(v > 0)) return 1;
    const p = 10 ** Math.floor(Math.log10(v));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }

  function shortNum(v) {
    if (Math.abs(v) >= 1e6) return `${(v / 1e6).toFixed(1)}M`;
    if (Math.abs(v) >= 1e3) return `${(v / 1e3).toFixed(1)}k`;
    return Number.isInteger(v) ? String(v) : v.toFixed(2);
  }

  /** Draws one chart; returns the number of finite points drawn (exposed for tests as data-points). */
  function draw(id) {
    const canvas = document.getElementById(`chart-${id}`);
    const legend = document.getElementById(`legend-${id}`);
    if (!canvas) return 0;
    const dpr = window.devicePixelRatio || 1;
    const cssW = canvas.clientWidth || 400;
    const cssH = canvas.clientHeight || 200;
    if (canvas.width !== Math.round(cssW * dpr) || canvas.height !== Math.round(cssH * dpr)) {
      canvas.width = Math.round(cssW * dpr);
      canvas.height = Math.round(cssH * dpr);
    }
    const ctx = canvas.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, cssW, cssH);

    const all = [...charts.get(id)];
    const isRatio = canvas.dataset.unit === 'ratio';
    const now = Date.now();
    let tMin = now;
    let vMax = 0;
    for (const [, s] of all) {
      for (const p of s.points) {
        if (p.t < now - SPAN_MS) continue;
        if (p.t < tMin) tMin = p.t;
        if (p.v !== null && p.v > vMax) vMax = p.v;
      }
    }
    tMin = Math.min(tMin, now - 60_000); // at least a minute of axis, so the first points do not fill the width
    const yMax = isRatio ? 1 : niceMax(vMax * 1.1);
    const L = 48,
      R = 10,
      T = 8,
      B = 20;
    const W = cssW - L - R,
      H = cssH - T - B;
    const x = (t) => L + ((t - tMin) / (now - tMin)) * W;
    const y = (v) => T + H - (v / yMax) * H;

    const style = getComputedStyle(document.documentElement);
    ctx.strokeStyle = style.getPropertyValue('--grid') || '#333';
    ctx.fillStyle = style.getPropertyValue('--muted') || '#999';
    ctx.font = '11px system-ui, sans-serif';
    ctx.lineWidth = 1;
    for (let k = 0; k <= 4; k++) {
      const v = (yMax * k) / 4;
      ctx.beginPath();
      ctx.moveTo(L, y(v) + 0.5);
      ctx.lineTo(L + W, y(v) + 0.5);
      ctx.stroke();
      ctx.textAlign = 'right';
      ctx.fillText(isRatio ? v.toFixed(2) : shortNum(v), L - 6, y(v) + 4);
    }
    ctx.textAlign = 'center';
    const spanS = (now - tMin) / 1000;
    const step = spanS > 300 ? 120 : spanS > 120 ? 60 : 15;
    for (let s = 0; s <= spanS; s += step) ctx.fillText(s === 0 ? 'now' : `-${s}s`, x(now - s * 1000), cssH - 5);

    let drawn = 0;
    const legendItems = [];
    for (const [name, s] of all) {
      ctx.strokeStyle = s.color;
      ctx.fillStyle = s.color;
      const emphasis = id === 'hitrate' && name === 'predicted block-weighted';
      ctx.lineWidth = emphasis ? 3 : 1.5;
      ctx.setLineDash(id === 'hitrate' && name.startsWith('available') ? [6, 4] : []);
      ctx.beginPath();
      let pen = false;
      let last = null;
      let prev = null;
      for (const p of s.points) {
        if (p.t < tMin) continue;
        if (p.v === null) {
          pen = false;
          prev = null;
          continue;
        }
        const px = x(p.t),
          py = y(Math.min(p.v, yMax));
        if (pen) ctx.lineTo(px, py);
        else ctx.moveTo(px, py);
        pen = true;
        drawn++;
        last = p.v;
        prev = [px, py];
      }
      ctx.stroke();
      ctx.setLineDash([]);
      // A lone point (no neighbour to join) still shows as a dot.
      if (prev) {
        ctx.beginPath();
        ctx.arc(prev[0], prev[1], 2.5, 0, Math.PI * 2);
        ctx.fill();
      }
      // Built with the DOM (not markup) so the strict CSP, which forbids inline style attributes, allows the colour.
      const item = document.createElement('span');
      const sw = document.createElement('span');
      sw.className = 'sw';
      sw.style.background = s.color;
      const b = document.createElement('b');
      b.textContent = last === null ? '–' : isRatio ? last.toFixed(3) : shortNum(last);
      item.append(sw, document.createTextNode(`${name} `), b);
      legendItems.push(item);
    }
    if (legend) legend.replaceChildren(...legendItems);
    canvas.dataset.points = String(drawn);
    debug.pointsDrawn[id] = drawn;
    return drawn;
  }

  const status = document.getElementById('status');
  async function poll() {
    try {
      const res = await fetch('/dashboard/data.json', { cache: 'no-store' });
      if (!res.ok) throw new Error(`HTTP ${res.status}`);
      ingest(await res.json());
      status.textContent = `live · polled ${new Date().toLocaleTimeString()} · every ${INTERVAL_MS / 1000} s · policy ${polls[polls.length - 1].d.policy}`;
      status.classList.remove('error');
    } catch (err) {
      debug.errors++;
      debug.lastError = String(err?.message ? err.message : err);
      status.textContent = `cannot reach the router: ${debug.lastError} (retrying)`;
      status.classList.add('error');
    } finally {
      setTimeout(poll, INTERVAL_MS);
    }
  }
  window.addEventListener('resize', () => {
    for (const id of charts.keys()) draw(id);
  });
  poll();
})();
