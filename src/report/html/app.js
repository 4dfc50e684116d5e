// report.html's script: draws the data that bench embedded in #bench-data (see
// src/report/html.rs for its shape) with uPlot, inlined beside this script. Text from the
// data is only ever set as textContent, never parsed as HTML.
"use strict";
(function () {
  // Every object of the data has no prototype: its keys are axis, metric and framework
  // names from the run (`constructor`, `__proto__`, `toString` are names too), and a
  // lookup must find only what the data holds, never an Object method.
  const bare = (v) => (v && typeof v === "object" && !Array.isArray(v) ? Object.assign(Object.create(null), v) : v);
  const data = JSON.parse(document.getElementById("bench-data").textContent, (k, v) => bare(v));

  // ---- helpers -------------------------------------------------------------------------
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? "" : v);
    }
    for (const k of kids) if (k !== null && k !== undefined) e.append(k);
    return e;
  }
  const SVG = "http://www.w3.org/2000/svg";
  function svg(tag, attrs) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    return e;
  }
  function three(v) {
    const a = Math.abs(v);
    if (a >= 100 || a === 0) return v.toFixed(0);
    if (a >= 10) return v.toFixed(1);
    if (a >= 1) return v.toFixed(2);
    return v.toFixed(3);
  }
  function si(v) {
    const a = Math.abs(v);
    for (const [d, s] of [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "K"]]) if (a >= d) return three(v / d) + s;
    return three(v);
  }
  // A cell id that may wrap after each dot of its axis values, as text nodes with <wbr>
  // between them: a narrow window wraps the id column, not the whole table off the page,
  // and a copied id has no invisible characters in it.
  function idNodes(id) {
    const out = [];
    id.split(".").forEach((part, i, parts) => {
      out.push(document.createTextNode(i < parts.length - 1 ? part + "." : part));
      if (i < parts.length - 1) out.push(el("wbr"));
    });
    return out;
  }
  const pct = (v) => (v * 100).toFixed(1) + "%";
  const pctChange = (v) => (v >= 0 ? "+" : "") + (v * 100).toFixed(1) + "%";
  function bytes(v) {
    const u = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (Math.abs(v) >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return i === 0 ? v.toFixed(0) + " B" : v.toFixed(2) + " " + u[i];
  }
  function dur(s) {
    if (s === null || s === undefined || !isFinite(s)) return "–";
    if (s < 1) return (s * 1000).toFixed(0) + " ms";
    if (s < 60) return s.toFixed(1) + " s";
    const r = Math.round(s);
    if (s < 3600) return Math.floor(r / 60) + "m " + String(r % 60).padStart(2, "0") + "s";
    const m = Math.round(s / 60);
    return Math.floor(m / 60) + "h " + String(m % 60).padStart(2, "0") + "m";
  }
  const METRICS = bare({
    tokens_per_s: ["tokens/s", (v) => si(v) + " tok/s"],
    tokens_per_s_per_gpu: ["tokens/s/GPU", (v) => si(v) + " tok/s"],
    mfu: ["MFU", pct],
    tflops_per_gpu: ["TFLOP/s/GPU", three],
    step_time_s: ["step time", dur],
    peak_mem_bytes: ["peak memory", bytes],
    time_to_1t_tokens_days: ["time to 1T tokens", (v) => three(v) + " days"],
    tokens_per_joule: ["tokens/J", (v) => si(v) + " tok/J"],
    kwh_per_1t_tokens: ["kWh per 1T tokens", (v) => si(v) + " kWh"],
    time_to_first_step_s: ["time to first step", dur],
  });
  const label = (m) => (METRICS[m] ? METRICS[m][0] : m);
  const value = (m, v) => (v === null || v === undefined ? "–" : METRICS[m] ? METRICS[m][1](v) : three(v));
  // Axis ticks: the same units, shorter.
  const axisValue = (m, v) => (m.startsWith("tokens_per_") ? si(v) : value(m, v));
  const statusClass = (s) => s.replace(/ /g, "_");
  const multiRun = data.runs.length > 1;

  // ---- header --------------------------------------------------------------------------
  const head = document.getElementById("head");
  head.append(el("h1", { text: data.title }));
  for (const r of data.runs) {
    const c = r.counts;
    const chips = el("div", { class: "run" });
    const parts = [["regression", c.regression], ["improvement", c.improvement], ["unchanged", c.unchanged],
      ["new", c.new], ["failed", c.failed], ["timed_out", c.timed_out], ["skipped", c.skipped],
      ["dropped", c.dropped], ["missing", c.missing], ["flaky", c.flaky]];
    for (const [k, n] of parts) if (n > 0) chips.append(el("span", { class: "chip " + k, text: n + " " + k.replace("_", " ") }));
    const commit = r.commit ? r.commit + (r.git_dirty ? " (uncommitted changes)" : "") : "unknown commit";
    const filters = r.filters.length ? " · filter " + r.filters.join(" and ") + " (" + r.filtered_out + " combinations not selected)" : "";
    head.append(el("div", { class: "run", text: "run " + r.run_id + " · " + r.matrix + " on " + r.hardware +
      " (" + r.hardware_key + ") · " + commit + " · bench " + r.bench_version + " · started " + r.started_at +
      (r.interrupted ? " · interrupted" : "") + filters }), chips);
    if (r.history_scope) head.append(el("div", { class: "note", text: "Judged against the run history (" + r.history_scope + ")" +
      (r.baseline_exists ? "; the baseline file decides only cells the history could not judge." : "; no baseline file for " + r.hardware_key + ", so the baseline columns read new.") }));
    else if (!r.baseline_exists) head.append(el("div", { class: "note", text: "No baselines for " + r.hardware_key + " yet: every cell is new." }));
    if (r.mfu_policies.length) head.append(el("div", { class: "note", text: "MFU is against " + r.mfu_policies.join("; ") + "." }));
    if (r.energy_note) head.append(el("div", { class: "note", id: "energy-note", text: r.energy_note.charAt(0).toUpperCase() + r.energy_note.slice(1) + "." }));
  }

  // One finding per cause leads the page, as it leads summary.md.
  if (data.findings && data.findings.length) {
    const box = el("div", { class: "findings" });
    box.append(el("h2", { text: "Findings" }));
    for (const f of data.findings) {
      const item = el("div", { class: "finding " + f.direction });
      item.append(el("div", { class: "finding-line", text: f.headline }));
      item.append(el("div", { class: "note", text: "cells: " + f.cells.join(", ") }));
      for (const a of f.against) item.append(el("div", { class: "note", text: "against: " + a }));
      if (f.bisected) item.append(el("div", { class: "finding-bisect", text: f.bisected }));
      if (f.kernels) {
        // The kernels that moved between the last good and the first bad commit.
        const k = f.kernels;
        item.append(el("div", { class: "note", text: k.title + ": " + k.summary }));
        const table = el("table", { class: "kernels" });
        const hr = el("tr");
        for (const h of ["kind / kernel", "", "before ms", "after ms", "change ms"]) hr.append(el("th", { text: h }));
        table.append(hr);
        for (const [name, kind, before, after] of k.rows) {
          const tr = el("tr", { class: kind === "kind" ? "kind-row" : "kernel-row" });
          tr.append(el("td", { text: name }));
          tr.append(el("td", { text: kind === "kind" ? "" : kind }));
          tr.append(el("td", { text: before.toFixed(3) }));
          tr.append(el("td", { text: after.toFixed(3) }));
          tr.append(el("td", { text: (after - before >= 0 ? "+" : "") + (after - before).toFixed(3) }));
          table.append(tr);
        }
        item.append(table);
        if (k.traces.length) item.append(el("div", { class: "note", text: "traces: " + k.traces.join(", ") }));
      }
      box.append(item);
    }
    head.append(box);
  }

  // ---- charts --------------------------------------------------------------------------
  const COLORS = ["#0969da", "#bf3989", "#1a7f37", "#bc4c00", "#8250df", "#116329", "#cf222e", "#57606a"];
  function chartBox(kind, title) {
    const box = el("div", { class: "chart", "data-kind": kind });
    box.append(el("div", { class: "chart-title", text: title }));
    return box;
  }
  function width(box) {
    return Math.max(260, Math.min(520, (box.parentElement && box.parentElement.clientWidth / 2 - 24) || 480));
  }

  // A bar of one metric against its baseline: tolerance band (light), noise band (dark),
  // baseline tick, this run's value (dot) and its repeats' spread (whisker).
  function bullet(m) {
    const W = 120, H = 16, s = svg("svg", { width: W, height: H, class: "bullet chart", "data-kind": "bullet" });
    if (!m || m.current === null || m.current === undefined) return s;
    const cur = m.current, spread = m.spread || 0, base = m.baseline;
    const tol = m.tolerance || 0, noise = m.noise || 0;
    let lo = cur * (1 - spread), hi = cur * (1 + spread);
    if (base !== null && base !== undefined) {
      const band = Math.max(tol, noise);
      lo = Math.min(lo, base * (1 - band)); hi = Math.max(hi, base * (1 + band));
    }
    if (hi - lo < Math.abs(cur) * 0.02) { lo = cur * 0.98; hi = cur * 1.02; }
    const pad = (hi - lo) * 0.08; lo -= pad; hi += pad;
    const x = (v) => ((v - lo) / (hi - lo)) * W;
    s.append(svg("rect", { x: 0, y: H / 2 - 0.5, width: W, height: 1, fill: "#d0d7de" }));
    if (base !== null && base !== undefined) {
      s.append(svg("rect", { x: x(base * (1 - tol)), y: 2, width: Math.max(1, x(base * (1 + tol)) - x(base * (1 - tol))), height: H - 4, fill: "#eaeef2" }));
      s.append(svg("rect", { x: x(base * (1 - noise)), y: 4, width: Math.max(1, x(base * (1 + noise)) - x(base * (1 - noise))), height: H - 8, fill: "#afb8c1" }));
      s.append(svg("rect", { x: x(base) - 1, y: 1, width: 2, height: H - 2, fill: "#1f2328" }));
    }
    const color = m.verdict === "regression" ? "#cf222e" : m.verdict === "improvement" ? "#1a7f37" : "#0969da";
    s.append(svg("rect", { x: x(cur * (1 - spread)), y: H / 2 - 1, width: Math.max(1, x(cur * (1 + spread)) - x(cur * (1 - spread))), height: 2, fill: color }));
    s.append(svg("circle", { cx: x(cur), cy: H / 2, r: 4, fill: color }));
    const t = svg("title", {});
    t.textContent = value(m.metric || "", cur);
    s.append(t);
    return s;
  }

  // Shades x from the axis start to `until` (the last warm-up step).
  function shadeWarmup(until) {
    return (u) => {
      if (until === null || until === undefined) return;
      const x0 = u.bbox.left, x1 = u.valToPos(until + 0.5, "x", true);
      if (x1 <= x0) return;
      u.ctx.save();
      u.ctx.fillStyle = "rgba(212, 167, 44, 0.18)";
      u.ctx.fillRect(x0, u.bbox.top, Math.min(x1, u.bbox.left + u.bbox.width) - x0, u.bbox.height);
      u.ctx.restore();
    };
  }

  // Ticks at a round spacing (1, 2, 2.5 or 5 times a power of ten) with at least two of
  // them inside [min, max]: uPlot's own choice, on a 200 px chart whose values differ in
  // the third digit, can leave a single tick.
  function roundSplits(u, axisIdx, min, max) {
    const span = max - min;
    if (!(span > 0) || !isFinite(span)) return [min];
    const mag = 10 ** Math.floor(Math.log10(span / 4));
    // The first spacing giving at most five intervals gives more than two: the candidates
    // grow by at most 2.5x.
    const incr = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => span / s <= 5);
    const out = [];
    for (let i = Math.ceil(min / incr - 1e-9); i * incr <= max + incr * 1e-9; i++) out.push(i * incr);
    return out;
  }

  // Tick labels with as many decimals as the spacing of the ticks needs, so that no two
  // ticks read the same (a loss axis from 12.55 to 12.65 is not "12.6" four times); `unit`
  // is [scale, suffix], e.g. [1000, " ms"].
  function tickLabels(vs, unit) {
    const [scale, suffix] = unit;
    const step = vs.length > 1 ? Math.abs((vs[1] - vs[0]) * scale) : 0;
    let d = 0;
    while (d < 6 && isFinite(step) && step > 0 && Math.abs(Math.round(step * 10 ** d) - step * 10 ** d) > 1e-6) d++;
    return vs.map((v) => (v === null ? "" : (v * scale).toFixed(d) + suffix));
  }
  // The y-axis's width: its longest tick label (uPlot's 12 px axis font) and the tick.
  const measure = document.createElement("canvas").getContext("2d");
  function axisSize(u, values) {
    measure.font = "12px system-ui, -apple-system, sans-serif";
    const longest = Math.max(0, ...(values || []).map((v) => measure.measureText(v).width));
    return Math.max(40, Math.ceil(longest) + 18);
  }
  // Step times in milliseconds below a second, else in seconds.
  const timeUnit = (max) => (max < 1 ? [1000, " ms"] : [1, " s"]);

  // The y-range of the measured (non-warm-up) values with some room, or null when there
  // are none: a first step 20x slower than the rest would otherwise flatten every
  // measured step onto the axis.
  function measuredRange(cell, field) {
    let lo = Infinity, hi = -Infinity;
    for (const t of cell.traces) {
      t.step.forEach((s, i) => {
        const v = t[field][i];
        if ((t.warmup_until === null || s > t.warmup_until) && v !== null && isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
      });
    }
    if (!isFinite(lo)) return null;
    const pad = hi > lo ? (hi - lo) * 0.15 : Math.abs(hi) * 0.05 || 1;
    return [lo >= 0 ? Math.max(0, lo - pad) : lo - pad, hi + pad];
  }

  // Marks the points outside the y-range (warm-up outliers): a triangle at the edge they
  // leave by, in their repeat's colour, and the most extreme one's value beside it.
  function markClipped(cell, field, fmt, clipped) {
    return (u) => {
      const { min, max } = u.scales.y;
      const ctx = u.ctx, top = u.bbox.top, bottom = u.bbox.top + u.bbox.height;
      let extreme = null;
      ctx.save();
      cell.traces.forEach((t, r) => {
        t.step.forEach((s, i) => {
          const v = t[field][i];
          if (v === null || (v <= max && v >= min)) return;
          const up = v > max, x = u.valToPos(s, "x", true), y = up ? top : bottom, k = up ? 1 : -1, h = 7 * devicePixelRatio;
          // A step outside the x-range too (zoomed in) gets no mark.
          if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) return;
          ctx.fillStyle = COLORS[r % COLORS.length];
          ctx.beginPath(); ctx.moveTo(x, y); ctx.lineTo(x - h / 2, y + k * h); ctx.lineTo(x + h / 2, y + k * h); ctx.closePath(); ctx.fill();
          if (!extreme || Math.abs(v) > Math.abs(extreme.v)) extreme = { v, x, y: y + k * (h + 10 * devicePixelRatio) };
        });
      });
      if (extreme) {
        ctx.font = 11 * devicePixelRatio + "px system-ui, sans-serif";
        ctx.textBaseline = "middle";
        ctx.textAlign = "left";
        const text = fmt(extreme.v) + " (off scale)", tx = extreme.x + 6 * devicePixelRatio, th = 14 * devicePixelRatio;
        // On a light backing, so that the measured steps' lines do not cross the text.
        ctx.fillStyle = "rgba(255, 255, 255, 0.85)";
        ctx.fillRect(tx - 2 * devicePixelRatio, extreme.y - th / 2, ctx.measureText(text).width + 4 * devicePixelRatio, th);
        ctx.fillStyle = "#1f2328";
        ctx.fillText(text, tx, extreme.y);
      }
      ctx.restore();
      clipped.count = extreme ? 1 : 0;
    };
  }

  // A per-step chart of one field of every repeat. `measured` scales the y-axis to the
  // measured steps (warm-up outliers clipped and marked); the chart's box records its
  // y-range and tick labels (data-y-min, data-y-max, data-y-ticks) for the browser test.
  function traceChart(box, cell, field, fmt, unitOf, measured) {
    const tables = cell.traces.map((t) => [t.step, t[field]]);
    const joined = tables.length === 1 ? [tables[0][0], tables[0][1]] : uPlot.join(tables);
    const until = cell.traces.reduce((a, t) => (t.warmup_until === null ? a : Math.max(a, t.warmup_until)), -1);
    const series = [{ label: "step" }];
    cell.traces.forEach((_, i) => series.push({ label: "repeat " + (i + 1), stroke: COLORS[i % COLORS.length], width: 1.5, value: (u, v) => (v === null ? "–" : fmt(v)), spanGaps: true }));
    const range = measured ? measuredRange(cell, field) : null;
    const clipped = { count: 0 };
    const y = range ? { range: () => range } : {};
    new uPlot({
      width: width(box), height: 200, series, legend: { live: true },
      scales: { x: { time: false }, y },
      axes: [{ label: "step" }, { size: axisSize, splits: roundSplits, values: (u, vs) => {
        const labels = tickLabels(vs, unitOf(u.scales.y.max));
        box.dataset.yTicks = JSON.stringify(labels);
        return labels;
      } }],
      hooks: {
        drawClear: [shadeWarmup(until >= 0 ? until : null)],
        draw: [markClipped(cell, field, fmt, clipped), (u) => {
          box.dataset.yMin = u.scales.y.min;
          box.dataset.yMax = u.scales.y.max;
          box.dataset.clipped = clipped.count;
        }],
      },
    }, joined, box);
  }

  function trendChart(box, series) {
    const pts = series.points;
    const xs = pts.map((_, i) => i), ys = pts.map((p) => p.value);
    const names = pts.map((p) => (p.commit ? p.commit.slice(0, 7) : p.time.slice(0, 10)));
    const changes = pts.map((p, i) => (p.change_point ? i : null)).filter((i) => i !== null);
    new uPlot({
      width: width(box), height: 200,
      series: [{ label: "run", value: (u, v) => (v === null || names[v] === undefined ? "–" : names[v] + " " + pts[v].time) },
        { label: label(series.metric), stroke: "#0969da", width: 1.5, points: { show: true, size: 5 }, value: (u, v) => value(series.metric, v) }],
      scales: { x: { time: false } },
      axes: [{ values: (u, vs) => vs.map((v) => (Number.isInteger(v) && names[v] !== undefined ? names[v] : "")), rotate: 0 },
        { values: (u, vs) => vs.map((v) => axisValue(series.metric, v)), size: 80 }],
      hooks: { draw: [(u) => {
        u.ctx.save();
        u.ctx.strokeStyle = "#cf222e"; u.ctx.setLineDash([4, 3]); u.ctx.lineWidth = 1.5;
        for (const i of changes) {
          const x = u.valToPos(i, "x", true);
          u.ctx.beginPath(); u.ctx.moveTo(x, u.bbox.top); u.ctx.lineTo(x, u.bbox.top + u.bbox.height); u.ctx.stroke();
        }
        u.ctx.restore();
      }] },
    }, [xs, ys], box);
  }

  function xyChart(box, groups, field, fmt, ylabel) {
    const tables = groups.map((g) => [g.points.map((p) => p.gpus), g.points.map((p) => p[field] === null ? null : p[field])]);
    const joined = uPlot.join(tables);
    const series = [{ label: "GPUs" }];
    groups.forEach((g, i) => series.push({ label: g.label, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true, points: { show: true, size: 6 }, value: (u, v) => (v === null ? "–" : fmt(v)) }));
    new uPlot({
      width: Math.max(360, Math.min(640, box.parentElement.clientWidth / 2 - 24)), height: 240, series,
      scales: { x: { time: false } },
      axes: [{ label: "GPUs", values: (u, vs) => vs.map((v) => (Number.isInteger(v) ? String(v) : "")) },
        { label: ylabel, values: (u, vs) => vs.map(fmt), size: 70 }],
    }, joined, box);
  }

  // ---- cell table ----------------------------------------------------------------------
  const columns = [];
  if (multiRun) columns.push({ key: "run", title: "run", get: (c) => c.run_id });
  for (const a of data.axes) columns.push({ key: "axis:" + a, title: a, get: (c) => (c.values[a] === undefined ? "" : c.values[a]), cls: "axis" });
  // Verdicts sort by severity, so that sorting by them (the order the page opens in) puts
  // what went wrong first.
  const SEVERITY = ["regression", "failed", "timed out", "improvement", "new", "unchanged", "skipped", "missing"];
  columns.push({ key: "status", title: "verdict", get: (c) => c.status, cls: "status",
    rank: (c) => { const i = SEVERITY.indexOf(c.status); return i < 0 ? SEVERITY.length : i; } });
  // Tokens per joule sits beside the throughput when some cell measured its GPUs' power.
  const energy = data.cells.some((c) => c.metrics.tokens_per_joule && c.metrics.tokens_per_joule.current !== null);
  for (const m of ["tokens_per_s_per_gpu", ...(energy ? ["tokens_per_joule"] : []), "mfu"]) {
    columns.push({ key: m, title: label(m), get: (c) => (c.metrics[m] ? c.metrics[m].current : null), num: true, metric: m });
  }
  columns.push({ key: "change", title: "change", get: (c) => {
    const m = c.metrics.tokens_per_s_per_gpu || c.metrics.tokens_per_s || c.metrics.step_time_s;
    return m && m.change !== null && m.change !== undefined ? m.change : null;
  }, num: true, fmt: pctChange });
  columns.push({ key: "duration", title: "time", get: (c) => c.duration_s, num: true, fmt: dur });
  columns.push({ key: "id", title: "cell", get: (c) => c.id, cls: "id" });

  const state = { sort: "status", dir: 1, filters: {}, search: "", open: new Set() };
  const keyOf = (c) => c.run_id + "/" + c.id;
  const table = document.getElementById("cells");
  const thead = table.tHead, tbody = table.tBodies[0];
  // A third figure column would push the table past a 1400 px window: with it, each
  // figure's bar sits under its value instead of beside it.
  if (energy) table.classList.add("stacked");

  const controls = document.getElementById("controls");
  function select(name, options, onchange) {
    const s = el("select", { "data-filter": name, onchange: (e) => onchange(e.target.value) }, el("option", { value: "", text: "all" }));
    for (const o of options) s.append(el("option", { value: o, text: o }));
    controls.append(el("label", { text: name + " " }, s));
  }
  const distinct = (f) => [...new Set(data.cells.map(f))].filter((v) => v !== "").sort((a, b) => a.localeCompare(b, undefined, { numeric: true }));
  if (multiRun) select("run", distinct((c) => c.run_id), (v) => { state.filters.run = v; render(); });
  for (const a of data.axes) select(a, distinct((c) => c.values[a] || ""), (v) => { state.filters["axis:" + a] = v; render(); });
  select("verdict", distinct((c) => c.status), (v) => { state.filters.status = v; render(); });
  controls.append(el("input", { type: "search", placeholder: "cell id contains…", oninput: (e) => { state.search = e.target.value; render(); } }));
  controls.append(el("button", { id: "expand-all", text: "Open all", onclick: () => { for (const c of visible()) state.open.add(keyOf(c)); render(); } }));
  controls.append(el("button", { id: "collapse-all", text: "Close all", onclick: () => { state.open.clear(); render(); } }));
  const shownCount = el("span", { class: "note", id: "shown-count" });
  controls.append(shownCount);

  const hr = el("tr");
  for (const col of columns) {
    hr.append(el("th", { "data-key": col.key, text: col.title, onclick: () => {
      state.dir = state.sort === col.key ? -state.dir : (col.num ? -1 : 1);
      state.sort = col.key;
      render();
    } }));
  }
  thead.append(hr);

  function visible() {
    let cells = data.cells.filter((c) => {
      for (const [k, v] of Object.entries(state.filters)) {
        if (!v) continue;
        const col = columns.find((x) => x.key === k);
        if (col && String(col.get(c)) !== v) return false;
      }
      return !state.search || c.id.includes(state.search);
    });
    if (state.sort) {
      const col = columns.find((x) => x.key === state.sort);
      cells = cells.slice().sort((a, b) => {
        const x = col.rank ? col.rank(a) : col.get(a), y = col.rank ? col.rank(b) : col.get(b);
        if (x === null || x === undefined) return 1;
        if (y === null || y === undefined) return -1;
        const r = col.num || col.rank ? x - y : String(x).localeCompare(String(y), undefined, { numeric: true });
        return r * state.dir;
      });
    }
    return cells;
  }

  function detail(c) {
    const td = el("td", { colspan: columns.length });
    if (c.reason) td.append(el("div", { class: "reason", text: c.reason }));
    const names = Object.keys(c.metrics);
    if (names.length) {
      const t = el("table", { class: "metrics" }, el("tr", {}, ...["metric", "now", "baseline", "change", "noise", "tolerance", "verdict", "repeats", ""].map((h) => el("th", { text: h }))));
      for (const n of names) {
        const m = Object.assign({ metric: n }, c.metrics[n]);
        t.append(el("tr", {},
          el("td", { text: label(n) }), el("td", { class: "num", text: value(n, m.current) }),
          el("td", { class: "num", text: value(n, m.baseline) }),
          el("td", { class: "num", text: m.change === null ? "" : pctChange(m.change) }),
          el("td", { class: "num", text: m.noise === null ? "" : pct(m.noise) }),
          el("td", { class: "num", text: m.tolerance === null ? "" : pct(m.tolerance) }),
          el("td", { text: m.verdict }),
          el("td", { class: "num", text: m.samples.map((v) => value(n, v)).join(", ") }),
          el("td", {}, bullet(m))));
      }
      td.append(t);
    }
    const charts = el("div", { class: "charts" });
    td.append(charts);
    const tr = el("tr", { class: "detail", "data-cell": c.id }, td);
    // Charts are drawn once the row is in the page, so that they know their width.
    tr.draw = () => {
      if (c.traces.length) {
        const loss = chartBox("loss", "loss per step" + (c.traces.length > 1 ? " (each repeat)" : ""));
        const time = chartBox("step-time", "step time per step (warm-up shaded, its off-scale steps marked)");
        charts.append(loss, time);
        traceChart(loss, c, "loss", three, () => [1, ""], false);
        // Step times differ in the second digit of milliseconds: the ticks say as much.
        traceChart(time, c, "step_time_s", (v) => (v < 1 ? three(v * 1000) + " ms" : dur(v)), timeUnit, true);
      }
      for (const s of data.trends.filter((s) => s.cell === c.id)) {
        const box = chartBox("trend", label(s.metric) + " over the run history");
        charts.append(box);
        trendChart(box, s);
      }
    };
    return tr;
  }

  function render() {
    for (const th of thead.rows[0].cells) {
      th.classList.toggle("sorted-asc", th.dataset.key === state.sort && state.dir > 0);
      th.classList.toggle("sorted-desc", th.dataset.key === state.sort && state.dir < 0);
    }
    const cells = visible();
    shownCount.textContent = cells.length + " of " + data.cells.length + " cells";
    tbody.replaceChildren();
    const drawn = [];
    for (const c of cells) {
      const tr = el("tr", { class: "cell-row status-" + statusClass(c.status), "data-cell": c.id, onclick: () => {
        const k = keyOf(c);
        if (state.open.has(k)) state.open.delete(k); else state.open.add(k);
        render();
      } });
      for (const col of columns) {
        const v = col.get(c);
        if (col.metric) {
          const m = c.metrics[col.metric] ? Object.assign({ metric: col.metric }, c.metrics[col.metric]) : null;
          tr.append(el("td", { class: "num" }, value(col.metric, v), bullet(m)));
        } else if (col.num) {
          tr.append(el("td", { class: "num", text: v === null || v === undefined ? "–" : col.fmt(v) }));
        } else if (col.key === "id") {
          tr.append(el("td", { class: "id" }, ...idNodes(v)));
        } else {
          tr.append(el("td", { class: col.cls || "", text: v + (col.key === "status" && c.flaky ? " (flaky)" : "") }));
        }
      }
      tbody.append(tr);
      if (state.open.has(keyOf(c))) {
        const d = detail(c);
        tbody.append(d);
        drawn.push(d);
      }
    }
    for (const d of drawn) d.draw();
  }

  // Regressions open on load (at most three), so the page starts with what went wrong.
  for (const c of data.cells.filter((c) => c.status === "regression").slice(0, 3)) state.open.add(keyOf(c));
  if (state.open.size === 0) {
    const first = data.cells.find((c) => c.traces.length);
    if (first) state.open.add(keyOf(first));
  }
  render();

  // ---- scaling -------------------------------------------------------------------------
  if (data.scaling.length) {
    document.getElementById("scaling-section").hidden = false;
    const box = document.getElementById("scaling");
    const eff = chartBox("scaling-efficiency", "weak-scaling efficiency");
    const mem = chartBox("scaling-memory", "peak memory per rank");
    box.append(eff, mem);
    xyChart(eff, data.scaling, "efficiency", pct, "efficiency");
    xyChart(mem, data.scaling, "peak_mem_bytes", bytes, "per rank");
  }

  // ---- frameworks ----------------------------------------------------------------------
  if (data.frameworks) {
    document.getElementById("frameworks-section").hidden = false;
    const fw = data.frameworks, t = document.getElementById("frameworks");
    const first = fw.frameworks[0];
    const hr = el("tr", {}, el("th", { text: "configuration" }));
    for (const f of fw.frameworks) {
      hr.append(el("th", { text: f + " tokens/s/GPU" }), el("th", { text: f + " MFU" }));
      if (f !== first) hr.append(el("th", { text: f + " vs " + first }));
    }
    t.append(hr);
    for (const row of fw.rows) {
      const tr = el("tr", {}, el("td", { text: row.label }));
      const ref = row.entries[first] && row.entries[first].tokens_per_s_per_gpu;
      for (const f of fw.frameworks) {
        const e = row.entries[f];
        const tps = e ? e.tokens_per_s_per_gpu : null;
        tr.append(el("td", { class: "num", text: e ? (tps === null ? e.status : value("tokens_per_s_per_gpu", tps)) : "–" }),
          el("td", { class: "num", text: e && e.mfu !== null ? pct(e.mfu) : "–" }));
        if (f !== first) tr.append(el("td", { class: "num", text: tps && ref ? (tps / ref).toFixed(2) + "x" : "–" }));
      }
      t.append(tr);
    }
  }

  // ---- change points -------------------------------------------------------------------
  const changes = [];
  for (const s of data.trends) s.points.forEach((p, i) => { if (p.change_point) changes.push([s, p, i]); });
  if (data.trends.length) {
    document.getElementById("trends-section").hidden = false;
    const t = document.getElementById("changes");
    t.append(el("tr", {}, ...["cell", "metric", "run", "commit", "before", "after"].map((h) => el("th", { text: h }))));
    for (const [s, p, i] of changes) {
      const before = i > 0 ? s.points[i - 1].value : null;
      t.append(el("tr", {}, el("td", { class: "id", text: s.cell }), el("td", { text: label(s.metric) }),
        el("td", { text: p.time }), el("td", { class: "id", text: p.commit || "" }),
        el("td", { class: "num", text: value(s.metric, before) }), el("td", { class: "num", text: value(s.metric, p.value) })));
    }
    if (!changes.length) t.append(el("tr", {}, el("td", { colspan: 6, text: "No change points in the history." })));
  }

  // ---- dropped -------------------------------------------------------------------------
  if (data.dropped.length) {
    document.getElementById("dropped-section").hidden = false;
    const box = document.getElementById("dropped");
    for (const g of data.dropped) {
      const d = el("details", {}, el("summary", { text: (multiRun ? g.run_id + ": " : "") + g.by + ": " + g.reason + " (" + g.ids.length + (g.ids.length === 1 ? " cell)" : " cells)") }));
      d.append(el("ul", {}, ...g.ids.map((id) => el("li", { class: "id", text: id }))));
      box.append(d);
    }
  }
})();
