// The history site's script: one file for the three kinds of page `bench site` writes
// (data.page: "index", "cell" or "run"), drawing the data bench embedded in #bench-data
// (see src/site/pages.rs for its shape) with uPlot, loaded beside it from assets/. Text from
// the data is only ever set as textContent or an attribute value, never parsed as HTML.
"use strict";
(function () {
  // Objects of the data have no prototype: a cell id or axis value such as `__proto__`
  // or `constructor` must find only what the data holds.
  const bare = (v) => (v && typeof v === "object" && !Array.isArray(v) ? Object.assign(Object.create(null), v) : v);
  const data = JSON.parse(document.getElementById("bench-data").textContent, (k, v) => bare(v));
  // The tables the pages of a kind share (assets/runs.js, assets/cells.js): JSON text in a
  // global, parsed as the page's own data is.
  const shared = (name) => JSON.parse(typeof window[name] === "string" ? window[name] : "[]", (k, v) => bare(v));
  const head = document.getElementById("head");
  const main = document.getElementById("main");

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
  // Links are the pages' own relative paths, which bench made from hashed ids (or a run's
  // report, made from a folder): anything else is shown as text.
  const safeHref = (h) => typeof h === "string" && !/^[a-z][a-z0-9+.-]*:/i.test(h) && !h.startsWith("//");
  const link = (href, text) => (safeHref(href) ? el("a", { href, text }) : document.createTextNode(text));
  function three(v) {
    const a = Math.abs(v);
    if (a >= 100 || a === 0) return v.toFixed(0);
    if (a >= 10) return v.toFixed(1);
    if (a >= 1) return v.toFixed(2);
    return v.toFixed(3);
  }
  function si(v) {
    if (v === null || v === undefined || !isFinite(v)) return "–";
    const a = Math.abs(v);
    for (const [d, s] of [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "K"]]) if (a >= d) return three(v / d) + s;
    return three(v);
  }
  const pctChange = (v) => (v === null || v === undefined || !isFinite(v) ? "–" : (v >= 0 ? "+" : "") + (v * 100).toFixed(1) + "%");
  const verdictCell = (v) => el("td", { class: "v-" + (v || "none"), text: v ? v.replace(/_/g, " ") : "–" });
  const short = (c) => (c ? c.slice(0, 7) : "?");
  const COLORS = { regressed: "#cf222e", improved: "#1a7f37", environment: "#9a6700", suspect: "#bf8700", unknown: "#8250df" };

  function select(label, name, values, onchange) {
    const s = el("select", { "data-filter": name, onchange });
    s.append(el("option", { value: "", text: "all" }));
    for (const v of values) s.append(el("option", { value: v, text: v }));
    return el("label", {}, label + " ", s);
  }

  // A sparkline: the last runs' values as a polyline, change points as red ticks, the last
  // value's verdict as the colour of its dot.
  function spark(row) {
    const NS = "http://www.w3.org/2000/svg", W = 120, H = 24;
    const s = document.createElementNS(NS, "svg");
    s.setAttribute("width", W); s.setAttribute("height", H); s.setAttribute("class", "spark");
    const ys = row.spark.filter((v) => isFinite(v));
    if (ys.length < 2) return s;
    const lo = Math.min(...ys), hi = Math.max(...ys), span = hi - lo || Math.abs(hi) || 1;
    const x = (i) => 2 + (i * (W - 6)) / (row.spark.length - 1);
    const y = (v) => H - 3 - ((v - lo) / span) * (H - 6);
    const line = document.createElementNS(NS, "polyline");
    line.setAttribute("points", row.spark.map((v, i) => (isFinite(v) ? `${x(i).toFixed(1)},${y(v).toFixed(1)}` : "")).filter(Boolean).join(" "));
    line.setAttribute("fill", "none"); line.setAttribute("stroke", "#0969da"); line.setAttribute("stroke-width", "1.2");
    s.append(line);
    for (const i of row.spark_changes) {
      const t = document.createElementNS(NS, "line");
      t.setAttribute("x1", x(i)); t.setAttribute("x2", x(i)); t.setAttribute("y1", 0); t.setAttribute("y2", H);
      t.setAttribute("stroke", "#cf222e"); t.setAttribute("stroke-dasharray", "2,2"); t.setAttribute("class", "cp");
      s.append(t);
    }
    const last = row.spark.length - 1;
    const dot = document.createElementNS(NS, "circle");
    dot.setAttribute("cx", x(last)); dot.setAttribute("cy", y(row.spark[last])); dot.setAttribute("r", 2.5);
    dot.setAttribute("fill", COLORS[row.verdict] || "#0969da");
    s.append(dot);
    return s;
  }

  // A number the data may hold as null (serde writes a NaN as null).
  const fixed = (v, d) => (typeof v === "number" && isFinite(v) ? v.toFixed(d) : "–");
  const commitLine = (label, c, cls) => el("div", { class: cls }, label + " ", el("code", { class: "sha", text: c.sha.slice(0, 12) }), " ",
    el("span", { class: "subject", text: c.subject }), " ", el("span", { class: "author", text: "(" + c.author + ")" }));

  // A finding's triage (src/site/triage.rs): the bisection's answer or why there is none
  // with the command that finishes it, the commits it measured, the kernels that moved.
  function triageBox(t) {
    const box = el("div", { class: "triage" });
    const b = t.bisected;
    if (b) {
      box.append(el("div", { class: "bisect-status s-" + b.status }, el("strong", { text: "bisection " + t.status }), ` on ${b.cell}, ${short(b.good)}..${short(b.bad)}`));
      if (b.first_bad) box.append(commitLine("first bad commit", b.first_bad, "first-bad"));
      if (b.last_good) box.append(commitLine("last good commit", b.last_good, "last-good"));
      if (b.evidence) box.append(el("div", { class: "evidence", text: (b.status === "found" ? "evidence: " : "why: ") + b.evidence }));
      box.append(el("div", { class: "note measured", text: `${b.measured} commit${b.measured === 1 ? "" : "s"} measured of the ${b.commits} in the range (${b.rounds_run} rounds run, ${b.rounds_reused} taken from the history); ${fixed(b.gpu_s, 0)} of ${fixed(b.budget_gpu_s, 0)} GPU-s` }));
      if (b.command) box.append(el("div", { class: "finish" }, "finish it with ", el("code", { class: "command", text: b.command })));
    }
    if (t.probes.length) {
      const p = el("table", { class: "probes" });
      p.append(el("tr", {}, ...["commit", "cell", "rounds", "median " + data.metric, ""].map((x) => el("th", { text: x }))));
      for (const r of t.probes) p.append(el("tr", { class: "probe-row" }, el("td", { class: "sha", text: short(r.commit) }), el("td", { class: "id", text: r.cell }),
        el("td", { class: "num", text: String(r.rounds) }), el("td", { class: "num", text: si(r.median) }), el("td", { text: r.role || "" })));
      box.append(el("div", { class: "note", text: "Commits the history's bisection rounds measured (branch bisect):" }), el("div", { class: "table-box" }, p));
    }
    const k = t.kernels;
    if (k) {
      box.append(el("div", { class: "kernels-line" }, el("strong", { text: `kernels of ${k.cell} (${k.before} -> ${k.after})` }), ": " + t.kernels_summary));
      const table = el("table", { class: "kernels" });
      table.append(el("tr", {}, ...["kind / kernel", "kind", "calls", "before ms", "after ms", "change ms"].map((x) => el("th", { text: x }))));
      const rows = [...k.kinds.map((d) => [d, true]), ...k.kernels.map((d) => [d, false])];
      for (const [d, isKind] of rows) {
        const change = typeof d.before_ms === "number" && typeof d.after_ms === "number" ? d.after_ms - d.before_ms : NaN;
        table.append(el("tr", { class: isKind ? "kind-row" : "kernel-row" }, el("td", { class: "id", text: d.name }), el("td", { text: isKind ? "" : d.kind }),
          el("td", { class: "num", text: isKind ? "" : `${d.before_calls} -> ${d.after_calls}` }), el("td", { class: "num", text: fixed(d.before_ms, 3) }),
          el("td", { class: "num", text: fixed(d.after_ms, 3) }), el("td", { class: "num", text: (change >= 0 ? "+" : "") + fixed(change, 3) })));
      }
      box.append(el("div", { class: "table-box" }, table));
      if (t.kernels_source) box.append(el("div", { class: "note", text: "from " + t.kernels_source }));
    } else if (t.kernels_missing) box.append(el("div", { class: "note kernels-missing", text: "no kernel diff: " + t.kernels_missing }));
    if (t.run) box.append(el("div", { class: "note" }, "triage of run ", link(t.run_page, t.run), t.source === "history" ? ", kept in the history" : ", from " + t.source));
    return box;
  }

  // ---- index: the fleet -----------------------------------------------------------------
  function index() {
    head.append(el("h1", { text: data.title }),
      el("p", { class: "note", text: `Store ${data.store}, metric ${data.metric}${data.branch ? ", branch " + data.branch : ""}; ${data.rows.length} series (cell, hardware key, branch) over ${data.runs} runs; built ${data.generated_at}.` }));

    const fsec = el("section", { id: "findings" }, el("h2", { text: `Open regressions (${data.findings.length})` }));
    if (!data.findings.length) fsec.append(el("p", { class: "note", text: "No cell is regressed at its last run." }));
    for (const f of data.findings) {
      const box = el("div", { class: "finding" });
      box.append(el("div", { class: "finding-line", text: `${f.cells.length} cell${f.cells.length === 1 ? "" : "s"} regressed ${pctChange(f.change)} on ${f.key} (branch ${f.branch || "unknown"})` }));
      const since = el("div", {}, "since run ", link(f.first_bad_page, f.first_bad_run), ` (commit ${short(f.first_bad_commit)})`);
      if (f.last_good_run) since.append("; last good run ", link(f.last_good_page, f.last_good_run), ` (commit ${short(f.last_good_commit)})`);
      box.append(since);
      if (f.attribution) box.append(el("div", { class: "attribution", text: f.attribution }));
      if (f.suspects.length) {
        const ul = el("ul", { class: "suspects" });
        for (const s of f.suspects) ul.append(el("li", { text: s }));
        box.append(el("div", { text: "changed since the last good run:" }), ul);
      }
      if (f.triage) box.append(triageBox(f.triage));
      const cells = el("div", { class: "finding-cells" });
      f.cells.slice(0, 50).forEach(([c, page], i) => { if (i) cells.append(", "); cells.append(link(page, c)); });
      if (f.cells.length > 50) cells.append(` and ${f.cells.length - 50} more`);
      box.append(cells);
      fsec.append(box);
    }
    main.append(fsec);

    // Filters: one per position of the cell ids' axis values, the hardware key, the
    // branch and the last verdict.
    const positions = Math.max(0, ...data.rows.map((r) => r.parts.length));
    const filters = Object.create(null);
    const controls = el("div", { class: "controls" });
    const distinct = (f) => [...new Set(data.rows.map(f).filter((v) => v !== undefined && v !== null && v !== ""))].sort();
    for (let p = 0; p < positions; p++) {
      const values = distinct((r) => r.parts[p]);
      if (values.length < 2 || values.length > 200) continue;
      controls.append(select(`axis ${p + 1}`, "axis" + p, values, (e) => { filters["axis" + p] = e.target.value; apply(); }));
    }
    controls.append(select("hardware", "key", distinct((r) => r.key), (e) => { filters.key = e.target.value; apply(); }));
    controls.append(select("branch", "branch", distinct((r) => r.branch), (e) => { filters.branch = e.target.value; apply(); }));
    controls.append(select("verdict", "verdict", distinct((r) => r.verdict), (e) => { filters.verdict = e.target.value; apply(); }));
    const shown = el("span", { class: "note", id: "shown" });
    controls.append(shown);

    const table = el("table", { id: "fleet" });
    table.append(el("thead", {}, el("tr", {}, ...["cell", "hardware", "branch", "last " + data.metric, "last verdict", "last run", "runs", "change points", "trend"].map((t) => el("th", { text: t })))));
    const body = el("tbody");
    // Open regressions first, then the other verdicts that want a look, then by cell id.
    const rank = (r) => (r.open ? 0 : r.verdict && r.verdict !== "unchanged" ? 1 : 2);
    const rows = data.rows.map((r, i) => [r, i]).sort((a, b) => rank(a[0]) - rank(b[0]) || a[1] - b[1]).map(([r]) => r);
    const trs = rows.map((r) => {
      const tr = el("tr", { class: "row" + (r.open ? " open" : ""), "data-cell": r.cell });
      tr.append(el("td", { class: "id" }, link(r.page, r.cell)), el("td", { text: r.key }), el("td", { text: r.branch || "–" }),
        el("td", { class: "num", text: si(r.last) }), verdictCell(r.verdict), el("td", {}, link(r.last_run_page, r.last_run)),
        el("td", { class: "num", text: String(r.runs) }), el("td", { class: "num", text: String(r.change_points) }), el("td", {}, spark(r)));
      body.append(tr);
      return [r, tr];
    });
    table.append(body);
    function apply() {
      let n = 0;
      for (const [r, tr] of trs) {
        let ok = true;
        for (const [k, v] of Object.entries(filters)) {
          if (!v) continue;
          const have = k.startsWith("axis") ? r.parts[Number(k.slice(4))] : r[k];
          if (have !== v) ok = false;
        }
        tr.hidden = !ok;
        if (ok) n++;
      }
      shown.textContent = `${n} of ${trs.length} shown`;
    }
    apply();
    main.append(el("section", { id: "cells-section" }, el("h2", { text: "Cells" }),
      el("p", { class: "note", text: "Every cell on every hardware key and branch: its last value and verdict, and its last runs (red dashes: change points). Open regressions first." }),
      controls, el("div", { class: "table-box" }, table)));

    const runs = el("table", { id: "runs" });
    runs.append(el("thead", {}, el("tr", {}, ...["run", "started", "hardware", "branch", "commit", "cells", "regressed", "GPU-s", "report"].map((t) => el("th", { text: t })))));
    const rb = el("tbody");
    for (const r of [...data.run_list].reverse()) {
      rb.append(el("tr", { class: "run-row" }, el("td", {}, link(r.page, r.run_id)), el("td", { text: r.time }), el("td", { text: r.key }),
        el("td", { text: r.branch || "–" }), el("td", { text: short(r.commit) }), el("td", { class: "num", text: String(r.cells) }),
        el("td", { class: "num" + (r.regressed ? " v-regressed" : ""), text: String(r.regressed) }),
        el("td", { class: "num cost", text: costCell(r) }),
        el("td", {}, r.report ? link(r.report, "report.html") : "–")));
    }
    runs.append(rb);
    main.append(el("section", { id: "runs-section" }, el("h2", { text: `Runs (${data.run_list.length})` }), el("div", { class: "table-box" }, runs)));
  }

  // What a run's verdict cost in the runs table: every GPU-second and that against the
  // measuring alone ("1.2K (1.56x)"), "–" for a run the store kept no cost of (recorded
  // before schema 6, or a row the store skipped as implausible).
  // GPU-seconds as the cost tables show them: one decimal below 10, whole seconds above.
  function gpuS(x) {
    return x < 10 ? x.toFixed(1) : si(x);
  }

  function costCell(r) {
    if (typeof r.gpu_s !== "number") return "–";
    return si(r.gpu_s) + (typeof r.times === "number" ? ` (${r.times.toFixed(2)}x)` : "");
  }

  // ---- cell: its trend per hardware key and branch ------------------------------------
  function trendChart(box, s) {
    const pts = s.points;
    const xs = pts.map((_, i) => i), ys = pts.map((p) => p.value);
    const names = pts.map((p) => (p.commit ? short(p.commit) : p.time.slice(0, 10)));
    const cps = s.change_points.map((c) => c.index);
    const shifts = s.segments.filter((g) => g.index !== null).map((g) => g.index);
    const marks = pts.map((p, i) => [i, COLORS[p.verdict]]).filter(([, c]) => c);
    const W = Math.max(480, Math.min(1200, main.clientWidth - 40));
    new uPlot({
      width: W, height: 260,
      series: [{ label: "run", value: (u, v) => (v === null || !pts[v] ? "–" : `${pts[v].run} ${names[v]} ${pts[v].time} on ${pts[v].host}`) },
        { label: data.metric, stroke: "#0969da", width: 1.2, points: { show: pts.length <= 120, size: 4 }, value: (u, v) => si(v) }],
      scales: { x: { time: false } },
      axes: [{ values: (u, vs) => vs.map((v) => (Number.isInteger(v) && names[v] !== undefined ? names[v] : "")) },
        { values: (u, vs) => vs.map((v) => si(v)), size: 70 }],
      hooks: { draw: [(u) => {
        const c = u.ctx;
        c.save();
        const vline = (i, color, dash) => {
          const x = u.valToPos(i, "x", true);
          c.strokeStyle = color; c.setLineDash(dash); c.lineWidth = 1.5;
          c.beginPath(); c.moveTo(x, u.bbox.top); c.lineTo(x, u.bbox.top + u.bbox.height); c.stroke();
        };
        for (const i of cps) vline(i, "#cf222e", [4, 3]);
        for (const i of shifts) vline(i, "#8250df", []);
        c.setLineDash([]);
        for (const [i, color] of marks) {
          if (!isFinite(ys[i])) continue;
          c.fillStyle = color;
          c.beginPath(); c.arc(u.valToPos(i, "x", true), u.valToPos(ys[i], "y", true), 4 * devicePixelRatio, 0, 2 * Math.PI); c.fill();
        }
        c.restore();
      }] },
    }, [xs, ys], box);
    box.dataset.points = pts.length;
    box.dataset.changePoints = cps.length;
    box.dataset.shifts = shifts.length;
    box.dataset.marks = marks.length;
  }

  function cell() {
    // A point is [run, value, verdict], the run an index into the shared table of runs.
    const runs = shared("benchRuns");
    for (const s of data.series) s.points = s.points.map(([r, value, verdict]) => Object.assign(Object.create(null), runs[r], { value, verdict }));
    head.append(el("p", {}, link("../index.html", "← the fleet")), el("h1", { text: data.cell }),
      el("p", { class: "note", text: `${data.metric} on every hardware key and branch the store holds. Red dashes: change points; purple lines: accepted shifts (bench baseline accept); dots: verdicts other than unchanged (red regressed, green improved, amber environment or suspect).` }));
    for (const s of data.series) {
      const sec = el("section", { class: "series" });
      sec.append(el("h2", { text: `${s.key}, branch ${s.branch || "unknown"} (${s.points.length} runs)` }));
      const box = el("div", { class: "chart", "data-kind": "trend" });
      sec.append(box);
      main.append(sec);
      trendChart(box, s);
      if (s.hosts.length) {
        // The hosts of the key apart: a runner uniformly slower than the pool is the
        // environment, which the trend alone would mix into its noise.
        const t = el("table", { class: "hosts" });
        t.append(el("tr", {}, ...["host", "clean runs", "median", "against all hosts"].map((x) => el("th", { text: x }))));
        for (const h of s.hosts) t.append(el("tr", {}, el("td", { class: "id", text: h.host }), el("td", { class: "num", text: String(h.runs) }),
          el("td", { class: "num", text: si(h.median) }), el("td", { class: "num", text: pctChange(h.rel) })));
        sec.append(el("h3", { text: "Hosts since the last change point" }), el("div", { class: "table-box" }, t));
      }
      if (s.change_points.length) {
        const t = el("table", { class: "changes" });
        t.append(el("tr", {}, ...["first run after", "commit", "before", "after", "change", "p"].map((x) => el("th", { text: x }))));
        for (const c of s.change_points) {
          const p = s.points[c.index];
          t.append(el("tr", {}, el("td", {}, link(p.page, p.run)), el("td", { text: short(p.commit) }), el("td", { class: "num", text: si(c.before) }),
            el("td", { class: "num", text: si(c.after) }), el("td", { class: "num", text: pctChange(c.rel_change) }), el("td", { class: "num", text: c.p_value.toFixed(3) })));
        }
        sec.append(el("h3", { text: "Change points" }), el("div", { class: "table-box" }, t));
      }
      if (s.segments.length) {
        const t = el("table", { class: "shifts" });
        t.append(el("tr", {}, ...["first run", "from", "reason", "accepted"].map((x) => el("th", { text: x }))));
        for (const g of s.segments) t.append(el("tr", {}, el("td", { text: g.first_run }), el("td", { text: g.starts_at }), el("td", { class: "id", text: g.reason }), el("td", { text: g.accepted_at })));
        sec.append(el("h3", { text: "Accepted shifts" }), el("div", { class: "table-box" }, t));
      }
      const judged = s.points.filter((p) => p.verdict && p.verdict !== "unchanged" && p.verdict !== "insufficient_history");
      if (judged.length) {
        const t = el("table", { class: "verdicts" });
        t.append(el("tr", {}, ...["run", "started", "commit", "host", data.metric, "verdict"].map((x) => el("th", { text: x }))));
        for (const p of judged.slice(-100).reverse()) t.append(el("tr", {}, el("td", {}, link(p.page, p.run)), el("td", { text: p.time }), el("td", { text: short(p.commit) }), el("td", { class: "id", text: p.host }), el("td", { class: "num", text: si(p.value) }), verdictCell(p.verdict)));
        sec.append(el("h3", { text: "Verdicts other than unchanged" }), el("div", { class: "table-box" }, t));
      }
    }
  }

  // ---- run: its cells' verdicts ----------------------------------------------------------
  function run() {
    // A cell is [cell, value, previous, verdict], the cell an index into the shared table.
    const cells = shared("benchCells");
    data.cells = data.cells.map(([c, value, previous, verdict]) => Object.assign(Object.create(null), cells[c], { value, previous, verdict }));
    head.append(el("p", {}, link("../index.html", "← the fleet")), el("h1", { text: "Run " + data.run_id }),
      el("p", { class: "note", text: `Started ${data.time} on ${data.key}, branch ${data.branch || "unknown"}, commit ${data.commit || "unknown"}, host ${data.host}, matrix ${data.matrix}.` }));
    // A run the store kept no cost of (recorded before schema 6) shows none.
    if (data.cost) head.append(el("p", { id: "cost", text: data.cost }));
    // The cells whose verdict took more than measuring them (pairs, re-runs, a bisection),
    // as summary.md lists them: where a night's GPU-seconds went.
    if (data.cell_costs && data.cell_costs.length) {
      const ct = el("table", { id: "cell-costs" });
      ct.append(el("thead", {}, el("tr", {}, ...["cell", "measuring", "side by side", "re-runs", "triage", "total"].map((x) => el("th", { text: x })))));
      const cb = el("tbody");
      for (const [cell, parts] of data.cell_costs) {
        const total = parts.reduce((a, b) => a + b, 0);
        cb.append(el("tr", {}, el("td", { class: "id", text: cell }), ...[...parts, total].map((x) => el("td", { class: "num", text: gpuS(x) }))));
      }
      ct.append(cb);
      head.append(el("details", { id: "cell-costs-box", open: "" }, el("summary", { text: "The cells whose verdict took more than measuring them, GPU-s" }), el("div", { class: "table-box" }, ct)));
    }
    head.append(el("p", { id: "report" }, data.report ? link(data.report, "This run's report.html") : el("span", { class: "note", text: "No report folder was given for this run (bench site --runs DIR)." })));
    const counts = Object.create(null);
    for (const c of data.cells) counts[c.verdict || "not judged"] = (counts[c.verdict || "not judged"] || 0) + 1;
    head.append(el("p", {}, ...Object.entries(counts).map(([k, n]) => el("span", { class: "chip", text: `${k.replace(/_/g, " ")}: ${n}` }))));
    const t = el("table", { id: "run-cells" });
    t.append(el("thead", {}, el("tr", {}, ...["cell", data.metric, "previous run", "change", "verdict"].map((x) => el("th", { text: x })))));
    const body = el("tbody");
    const rank = (c) => (c.verdict === "regressed" ? 0 : c.verdict && c.verdict !== "unchanged" ? 1 : 2);
    for (const c of [...data.cells].sort((a, b) => rank(a) - rank(b))) {
      const change = c.previous ? (c.value - c.previous) / Math.abs(c.previous) : null;
      body.append(el("tr", { class: "row" }, el("td", { class: "id" }, link(c.page, c.cell)), el("td", { class: "num", text: si(c.value) }),
        el("td", { class: "num", text: si(c.previous) }), el("td", { class: "num", text: pctChange(change) }), verdictCell(c.verdict)));
    }
    t.append(body);
    main.append(el("section", {}, el("h2", { text: `Cells (${data.cells.length})` }), el("div", { class: "table-box" }, t)));
  }

  ({ index, cell, run })[data.page]();
})();
