// oncebus dashboard: polls /api/dashboard every second and draws SVG by hand (no library, no build step).
"use strict";

(() => {
  const ROOT = document.body.dataset.root || "";
  const POLL_MS = 1000;
  const BIN_US = 10e6; // one bar per 10 s
  const BINS = 60; // the last 10 minutes
  const SVG_NS = "http://www.w3.org/2000/svg";
  const COLORS = { accepted: "#3b6fd8", duplicate: "#e8833a", late: "#d4403a", window: "#1d2330", advice: "#2f9e63" };

  const history = new Map(); // entity path -> [[t_us, accepted, duplicates, late], ...]
  const cards = new Map(); // entity path -> card element
  let since = null;

  // ------------------------------------------------------------------ formatting
  const fmtInt = (n) => (n === null || n === undefined ? "–" : Math.round(n).toLocaleString("en-US"));

  function fmtSeconds(s) {
    if (s === null || s === undefined) return "–";
    if (s < 1) return `${Math.round(s * 1000)} ms`;
    if (s < 60) return `${+s.toFixed(1)} s`;
    if (s < 3600) return `${+(s / 60).toFixed(1)} min`;
    if (s < 86400) return `${+(s / 3600).toFixed(1)} h`;
    return `${+(s / 86400).toFixed(1)} d`;
  }

  function fmtShort(s) {
    if (s < 60) return `${s}s`;
    if (s < 3600) return `${s / 60}m`;
    if (s < 86400) return `${s / 3600}h`;
    return `${s / 86400}d`;
  }

  function fmtBytes(n) {
    if (n < 1024) return `${n} B`;
    if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
    return `${(n / 1024 / 1024).toFixed(1)} MiB`;
  }

  // ------------------------------------------------------------------ DOM helpers
  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (k === "class") node.className = v;
      else node.setAttribute(k, v);
    }
    for (const child of children) node.append(child);
    return node;
  }

  function svg(tag, attrs = {}, text = null) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    if (text !== null) node.textContent = text;
    return node;
  }

  function setField(card, field, text) {
    const node = card.querySelector(`[data-field="${field}"]`);
    if (node && node.textContent !== text) node.textContent = text;
  }

  // ------------------------------------------------------------------ cards
  const NUMBERS = [
    ["accepted", "accepted", ""],
    ["duplicates_dropped", "duplicates dropped", "duplicates"],
    ["late_resends", "late resends", "late"],
    ["keys_held", "keys held", ""],
    ["oldest_key_age", "oldest key age", ""],
    ["index_bytes", "index memory", ""],
  ];

  function makeCard(entity) {
    const numbers = el("div", { class: "numbers" });
    for (const [field, label, extra] of NUMBERS) {
      numbers.append(
        el("div", { class: `number ${extra}` }, el("div", { class: "label" }, label),
          el("div", { class: "value", "data-field": field }, "–")),
      );
    }
    const sends = el("div", { class: "chart sends" },
      el("h3", {}, "Sends per 10 s, last 10 minutes"),
      el("div", { class: "legend" },
        legend(COLORS.accepted, "accepted"), legend(COLORS.late, "late resends (accepted again)"),
        legend(COLORS.duplicate, "duplicates dropped")),
      el("div", { "data-chart": "sends" }));
    const delays = el("div", { class: "chart delays" },
      el("h3", {}, "Resend delays (time since the key's first acceptance)"),
      el("div", { class: "legend" },
        legend(COLORS.duplicate, "inside the window: dropped"), legend(COLORS.late, "after it: accepted again"),
        legend(COLORS.window, "window"), legend(COLORS.advice, "suggested window")),
      el("div", { "data-chart": "delays" }),
      el("div", { class: "advice", "data-field": "advice" }, ""));
    const card = el("article", { class: "entity", "data-path": entity.path },
      el("h2", {}, el("span", { "data-field": "name" }, entity.name),
        el("span", { class: "badge", "data-field": "kind" }, entity.kind),
        el("span", { class: "badge", "data-field": "dedup" }, ""),
        el("span", { class: "badge", "data-field": "partitioned" }, "")),
      numbers,
      el("div", { class: "charts" }, sends, delays),
      el("div", { "data-table": "receivables" }));
    return card;
  }

  function legend(color, text) {
    const swatch = el("span", { class: "swatch" });
    swatch.style.background = color;
    return el("span", {}, swatch, text);
  }

  function updateCard(card, entity, nowUs) {
    setField(card, "name", entity.name);
    setField(card, "kind", entity.kind);
    const dedup = card.querySelector('[data-field="dedup"]');
    if (entity.requires_duplicate_detection) {
      dedup.textContent = `duplicate detection ${entity.duplicate_detection_history_time_window} (${fmtSeconds(entity.window_seconds)})`;
      dedup.classList.add("on");
    } else {
      dedup.textContent = "no duplicate detection";
      dedup.classList.remove("on");
    }
    setField(card, "partitioned", entity.enable_partitioning ? "partitioned" : "not partitioned");
    setField(card, "accepted", fmtInt(entity.accepted));
    setField(card, "duplicates_dropped", fmtInt(entity.duplicates_dropped));
    setField(card, "late_resends", fmtInt(entity.late_resends));
    setField(card, "keys_held", fmtInt(entity.keys_held));
    setField(card, "oldest_key_age", fmtSeconds(entity.oldest_key_age_seconds));
    setField(card, "index_bytes", fmtBytes(entity.index_bytes));

    const points = history.get(entity.path) || [];
    const now = [nowUs, entity.accepted, entity.duplicates_dropped, entity.late_resends];
    replaceChart(card, "sends", sendsChart([...points, now], nowUs));
    replaceChart(card, "delays", delaysChart(entity));
    for (const part of card.querySelectorAll(".chart.delays .legend, .chart.delays [data-chart]")) {
      part.hidden = !entity.requires_duplicate_detection;
    }
    setField(card, "advice", adviceText(entity));
    const table = card.querySelector('[data-table="receivables"]');
    table.replaceChildren(receivablesTable(entity));
  }

  function replaceChart(card, name, node) {
    card.querySelector(`[data-chart="${name}"]`).replaceChildren(node);
  }

  // ------------------------------------------------------------------ sends over time
  function levelAt(points, t) {
    // totals of the last sample at or before t (a step function); before the first sample, its level
    let level = points[0];
    for (const p of points) {
      if (p[0] > t) break;
      level = p;
    }
    return level;
  }

  function sendsChart(points, nowUs) {
    const W = 560, H = 170, left = 36, bottom = 20, top = 8;
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "sends over time" });
    const bins = [];
    for (let i = 0; i < BINS; i++) {
      const start = nowUs - (BINS - i) * BIN_US, end = nowUs - (BINS - i - 1) * BIN_US;
      const a = levelAt(points, start), b = levelAt(points, end);
      const late = b[3] - a[3];
      bins.push({ accepted: b[1] - a[1] - late, late, duplicates: b[2] - a[2] });
    }
    const max = Math.max(1, ...bins.map((x) => x.accepted + x.late + x.duplicates));
    const plotW = W - left - 4, plotH = H - top - bottom, barW = plotW / BINS;
    const y = (v) => top + plotH - (v / max) * plotH;
    root.append(svg("line", { x1: left, y1: top + plotH, x2: W - 4, y2: top + plotH, stroke: "#c9ced6" }));
    root.append(svg("text", { x: left - 4, y: top + 8, "text-anchor": "end" }, fmtInt(max)));
    root.append(svg("text", { x: left - 4, y: top + plotH, "text-anchor": "end" }, "0"));
    bins.forEach((bin, i) => {
      let base = 0;
      for (const [key, color] of [["accepted", COLORS.accepted], ["late", COLORS.late], ["duplicates", COLORS.duplicate]]) {
        const v = bin[key];
        if (v > 0) {
          root.append(svg("rect", {
            x: left + i * barW + 0.5, y: y(base + v), width: Math.max(barW - 1, 1), height: y(base) - y(base + v),
            fill: color,
          }));
          base += v;
        }
      }
    });
    for (const [i, label] of [[0, "-10 min"], [BINS / 2, "-5 min"], [BINS, "now"]]) {
      root.append(svg("text", { x: left + i * barW, y: H - 4, "text-anchor": i === 0 ? "start" : i === BINS ? "end" : "middle" }, label));
    }
    return root;
  }

  // ------------------------------------------------------------------ resend delays
  function xOfSeconds(seconds, bounds) {
    // bucket i spans [i, i+1) on the axis; inside a bucket, log interpolation between its edges
    for (let i = 0; i < bounds.length; i++) {
      if (seconds <= bounds[i]) {
        const lo = i === 0 ? bounds[0] / 10 : bounds[i - 1];
        const f = Math.log(Math.max(seconds, lo) / lo) / Math.log(bounds[i] / lo);
        return i + Math.min(Math.max(f, 0), 1);
      }
    }
    return bounds.length + 0.5;
  }

  function delaysChart(entity) {
    const W = 560, H = 170, left = 36, bottom = 20, top = 14;
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "resend delays" });
    const buckets = entity.resend_delay.buckets; // [[le or null, count], ...]
    const bounds = buckets.filter((b) => b[0] !== null).map((b) => b[0]);
    const n = buckets.length;
    const plotW = W - left - 4, plotH = H - top - bottom, barW = plotW / n;
    const max = Math.max(1, ...buckets.map((b) => b[1]));
    const x = (units) => left + units * barW;
    const y = (v) => top + plotH - (v / max) * plotH;
    root.append(svg("line", { x1: left, y1: top + plotH, x2: W - 4, y2: top + plotH, stroke: "#c9ced6" }));
    root.append(svg("text", { x: left - 4, y: top + 8, "text-anchor": "end" }, fmtInt(max)));
    root.append(svg("text", { x: left - 4, y: top + plotH, "text-anchor": "end" }, "0"));
    buckets.forEach(([le, count], i) => {
      if (count > 0) {
        const caught = le !== null && entity.requires_duplicate_detection && le <= entity.window_seconds;
        root.append(svg("rect", {
          x: x(i) + 0.5, y: y(count), width: Math.max(barW - 1, 1), height: top + plotH - y(count),
          fill: caught ? COLORS.duplicate : COLORS.late,
        }, null));
      }
    });
    for (const tick of [1, 20, 60, 600, 3600, 86400, 604800]) {
      const i = bounds.indexOf(tick);
      if (i >= 0) root.append(svg("text", { x: x(i + 1), y: H - 4, "text-anchor": "middle" }, fmtShort(tick)));
    }
    if (entity.requires_duplicate_detection) {
      const wx = x(xOfSeconds(entity.window_seconds, bounds));
      root.append(svg("line", { x1: wx, y1: top - 6, x2: wx, y2: top + plotH, stroke: COLORS.window, "stroke-width": 2 }));
      root.append(svg("text", { x: wx + 3, y: top - 4, fill: COLORS.window }, "window"));
    }
    const advised = entity.suggestion.window_seconds;
    if (advised !== null && advised !== entity.window_seconds) {
      const ax = x(xOfSeconds(advised, bounds));
      root.append(svg("line", {
        x1: ax, y1: top, x2: ax, y2: top + plotH, stroke: COLORS.advice, "stroke-width": 2, "stroke-dasharray": "4 3",
      }));
    }
    return root;
  }

  function adviceText(entity) {
    const s = entity.suggestion;
    if (!entity.requires_duplicate_detection) return "Duplicate detection is off for this entity: resends are not judged.";
    if (!s.resends) return "No resends seen yet. Window advisor: nothing to suggest.";
    const share = Math.round(s.share * 100);
    const caught = entity.resend_delay.buckets
      .filter((b) => b[0] !== null && b[0] <= entity.window_seconds)
      .reduce((sum, b) => sum + b[1], 0);
    let text = `Window advisor: ${fmtSeconds(s.window_seconds)} would catch ${fmtInt(s.covered)} of the ${fmtInt(s.resends)} resends seen`
      + ` (the smallest bucket edge covering ${share}%, clamped to 20 s..7 d); the current window catches ${fmtInt(caught)}.`;
    if (s.beyond_range) text += ` Some resends come later than 7 days: no window can catch ${share}% of them.`;
    text += " Resends more than two windows after a key's first acceptance are not seen, so this can only underestimate.";
    return text;
  }

  // ------------------------------------------------------------------ queues and subscriptions
  const COLUMNS = [
    ["active", "active"], ["scheduled", "scheduled"], ["deferred", "deferred"], ["dead_lettered", "dead-lettered"],
    ["received_total", "received"], ["completed_total", "completed"], ["abandoned_total", "abandoned"],
    ["dead_lettered_total", "moved to DLQ"], ["expired_total", "expired"],
  ];

  function receivablesTable(entity) {
    if (!entity.receivables.length) return el("p", { class: "empty" }, "No subscriptions.");
    const head = el("tr", {}, el("th", {}, entity.kind === "queue" ? "queue" : "subscription"),
      ...COLUMNS.map(([, label]) => el("th", {}, label)));
    const rows = entity.receivables.map((r) => el("tr", { "data-subscription": r.subscription },
      el("td", {}, r.subscription || entity.name), ...COLUMNS.map(([key]) => el("td", {}, fmtInt(r[key])))));
    return el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows));
  }

  // ------------------------------------------------------------------ namespace and polling
  function renderNamespace(data) {
    const parts = [`<b>${data.entities.length}</b> entities`];
    if (data.transport) {
      parts.push(`<b>${fmtInt(data.transport.connections_open)}</b> connections`, `<b>${fmtInt(data.transport.links_open)}</b> links`);
    }
    const store = data.store;
    parts.push(`<b>${fmtInt(store.commits)}</b> commits`);
    if (store.commit_seconds_p50 !== null) parts.push(`commit p50 ≤ <b>${fmtSeconds(store.commit_seconds_p50)}</b>`);
    if (store.commit_seconds_p99 !== null) parts.push(`p99 ≤ <b>${fmtSeconds(store.commit_seconds_p99)}</b>`);
    if (store.commit_batch_size_mean !== null) parts.push(`<b>${store.commit_batch_size_mean.toFixed(1)}</b> units per commit`);
    const section = document.getElementById("namespace");
    section.replaceChildren(...parts.map((html) => { const span = el("span"); span.innerHTML = html; return span; }));
  }

  function merge(data) {
    const keep = data.now_us - data.history_kept_us - BIN_US;
    const live = new Set();
    for (const entity of data.entities) {
      live.add(entity.path);
      const points = history.get(entity.path) || [];
      for (const p of entity.history) {
        if (!points.length || p[0] > points[points.length - 1][0]) points.push(p);
        if (since === null || p[0] > since) since = p[0];
      }
      while (points.length > 1 && points[1][0] <= keep) points.shift();
      history.set(entity.path, points);
    }
    for (const path of [...history.keys()]) if (!live.has(path)) history.delete(path);
  }

  function render(data) {
    merge(data);
    const main = document.getElementById("entities");
    document.getElementById("empty").hidden = data.entities.length > 0;
    const live = new Set();
    for (const entity of data.entities) {
      live.add(entity.path);
      let card = cards.get(entity.path);
      if (!card) {
        card = makeCard(entity);
        cards.set(entity.path, card);
      }
      main.append(card); // keeps the server's order
      updateCard(card, entity, data.now_us);
    }
    for (const [path, card] of [...cards]) {
      if (!live.has(path)) {
        card.remove();
        cards.delete(path);
      }
    }
    renderNamespace(data);
  }

  function setStatus(ok, text) {
    const status = document.getElementById("status");
    status.className = `status ${ok ? "live" : "down"}`;
    status.textContent = text;
  }

  async function poll() {
    try {
      const url = `${ROOT}/api/dashboard${since === null ? "" : `?since=${since}`}`;
      const response = await fetch(url, { cache: "no-store" });
      if (!response.ok) throw new Error(`the broker answered ${response.status}`);
      render(await response.json());
      setStatus(true, `live · updated ${new Date().toLocaleTimeString()}`);
    } catch (error) {
      setStatus(false, `disconnected: ${error.message}; retrying`);
    } finally {
      setTimeout(poll, POLL_MS);
    }
  }

  poll();
})();
