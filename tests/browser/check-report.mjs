// Opens each report.html in headless chromium as a reader would and checks it: no console
// errors or exceptions, no network request, every chart the embedded data calls for drawn
// (comparison bars, each cell's loss and step-time charts once opened, trend charts, the
// scaling charts), the framework and dropped-cell sections, and that filtering and sorting
// work; that each step-time chart's y-range is set by its measured steps (warm-up steps far
// above them are off scale and marked), that no two ticks of a loss or step-time axis read
// the same, and that the page and its cell table fit a 1400 px window.
// Writes a screenshot beside each page (report.png), or to --screenshot FILE.
//
// Usage: node tests/browser/check-report.mjs [--screenshot OUT.png] REPORT.html...
import path from "node:path";
import { exit, launch, watch } from "./chromium.mjs";

const argv = process.argv.slice(2);
let shot = null;
if (argv[0] === "--screenshot") { shot = argv[1]; argv.splice(0, 2); }
if (!argv.length || (shot && argv.length !== 1)) {
  console.error("usage: check-report.mjs [--screenshot OUT.png] REPORT.html...");
  process.exit(2);
}

function expect(cond, what, problems) { if (!cond) problems.push(what); }

async function check(context, file) {
  const problems = [];
  const page = await context.newPage();
  const errors = watch(page);
  await page.goto("file://" + path.resolve(file));
  await page.waitForLoadState("load");
  const data = await page.evaluate(() => JSON.parse(document.getElementById("bench-data").textContent));
  const count = (sel) => page.locator(sel).count();

  // Every row's tokens/s/GPU, tokens/J (when some cell read its GPUs' power) and MFU bars
  // (a dot where the cell has the figure).
  const withFigure = (m) => data.cells.filter((c) => c.metrics[m] && c.metrics[m].current !== null).length;
  const dots = await count("#cells tr.cell-row svg.bullet circle");
  const energyBars = withFigure("tokens_per_joule");
  expect(dots === withFigure("tokens_per_s_per_gpu") + energyBars + withFigure("mfu"), `bars: ${dots} drawn`, problems);
  expect((await count('th[data-key="tokens_per_joule"]')) === (energyBars ? 1 : 0), "a tokens/J column exactly when a cell has tokens/J", problems);
  // The note on what tokens/J counts, when a run has it.
  const energyNote = (await count("#energy-note")) > 0;
  expect(energyNote === data.runs.some((r) => r.energy_note), "the energy note exactly when a run has one", problems);
  expect(await count("#cells tr.cell-row") === data.cells.length, "a row per cell", problems);

  // Open every cell: each with steps gets a loss and a step-time chart, each with a history
  // its trend charts.
  await page.click("#expand-all");
  const traced = data.cells.filter((c) => c.traces.length).length;
  const trends = data.trends.filter((s) => data.cells.some((c) => c.id === s.cell)).length;
  for (const [kind, want] of [["loss", traced], ["step-time", traced], ["trend", trends]]) {
    const got = await count(`.chart[data-kind=${kind}] canvas`);
    expect(got === want, `${kind} charts: ${got} drawn, ${want} expected`, problems);
  }
  if (data.scaling.length) {
    expect(await count(".chart[data-kind=scaling-efficiency] canvas") === 1, "scaling efficiency chart", problems);
    expect(await count(".chart[data-kind=scaling-memory] canvas") === 1, "memory per rank chart", problems);
  }
  if (data.frameworks) {
    expect(await count("#frameworks tr") === data.frameworks.rows.length + 1, "a framework row per configuration", problems);
  }
  expect(await count("#dropped details") === data.dropped.length, "a dropped group per rule", problems);

  // The charts' axes, as each chart's box records them (data-y-min, data-y-max, data-y-ticks).
  const charts = await page.$$eval(".chart[data-kind=loss], .chart[data-kind=step-time]", (els) => els.map((e) => ({
    kind: e.dataset.kind, cell: e.closest("tr.detail").dataset.cell, min: Number(e.dataset.yMin),
    max: Number(e.dataset.yMax), ticks: JSON.parse(e.dataset.yTicks || "[]"), clipped: Number(e.dataset.clipped),
  })));
  let scaledByMeasured = 0;
  for (const ch of charts) {
    const ticks = ch.ticks.filter((t) => t !== "");
    expect(ticks.length >= 2 && new Set(ticks).size === ticks.length, `${ch.kind} ticks of ${ch.cell} differ: ${ticks.join(", ")}`, problems);
    if (ch.kind !== "step-time") continue;
    const cell = data.cells.find((c) => c.id === ch.cell);
    let lo = Infinity, hi = -Infinity, warm = -Infinity;
    for (const t of cell.traces) {
      t.step.forEach((s, i) => {
        const v = t.step_time_s[i];
        if (t.warmup_until !== null && s <= t.warmup_until) warm = Math.max(warm, v);
        else { lo = Math.min(lo, v); hi = Math.max(hi, v); }
      });
    }
    if (!isFinite(lo)) continue;
    // The range holds the measured steps with some room, and no more than that room.
    const room = Math.max((hi - lo) * 0.2, Math.abs(hi) * 0.06);
    expect(ch.min <= lo && ch.max >= hi && ch.max - hi <= room && lo - ch.min <= room,
      `step-time range of ${ch.cell}: ${ch.min}..${ch.max}, measured steps ${lo}..${hi}`, problems);
    if (warm > ch.max) {
      expect(ch.clipped > 0, `step-time chart of ${ch.cell}: warm-up step of ${warm} s off scale but not marked`, problems);
      scaledByMeasured++;
    }
  }
  // A table wider than the window would scroll inside its own box; these pages' tables fit.
  const [overflow, tableOverflow] = await page.evaluate(() => {
    const t = document.getElementById("cells");
    return [document.documentElement.scrollWidth - window.innerWidth, t.scrollWidth - t.parentElement.clientWidth];
  });
  expect(overflow <= 0, `the page is ${overflow} px wider than the window with every cell open`, problems);
  expect(tableOverflow <= 0, `the cell table is ${tableOverflow} px wider than its box with every cell open`, problems);
  await page.click("#collapse-all");

  // Filter by the first axis's first value, then sort by tokens/s/GPU.
  if (data.axes.length) {
    const axis = data.axes[0];
    const values = [...new Set(data.cells.map((c) => c.values[axis]).filter((v) => v))].sort();
    if (values.length) {
      await page.selectOption(`select[data-filter="${axis}"]`, values[0]);
      const rows = await count("#cells tr.cell-row");
      const want = data.cells.filter((c) => c.values[axis] === values[0]).length;
      expect(rows === want, `filter ${axis}=${values[0]}: ${rows} rows, ${want} expected`, problems);
      await page.selectOption(`select[data-filter="${axis}"]`, "");
    }
  }
  await page.click('th[data-key="tokens_per_s_per_gpu"]');
  const firstId = await page.locator("#cells tr.cell-row").first().getAttribute("data-cell");
  const best = data.cells.filter((c) => c.metrics.tokens_per_s_per_gpu && c.metrics.tokens_per_s_per_gpu.current !== null)
    .sort((a, b) => b.metrics.tokens_per_s_per_gpu.current - a.metrics.tokens_per_s_per_gpu.current)[0];
  if (best) expect(firstId === best.id, `sorted by tokens/s/GPU: ${firstId} first, ${best.id} expected`, problems);

  // Every finding the data holds is drawn in the header, as text (never markup).
  const findings = (data.findings || []).length;
  const drawn = await count("#head .finding");
  expect(drawn === findings, `${drawn} findings drawn, ${findings} in the data`, problems);
  // A finding's first bad commit (or how its bisection ended) and its kernel diff's rows.
  const bisected = (data.findings || []).filter((f) => f.bisected).length;
  const bisectDrawn = await count("#head .finding-bisect");
  expect(bisectDrawn === bisected, `${bisectDrawn} bisection lines drawn, ${bisected} in the data`, problems);
  const kernelRows = (data.findings || []).reduce((n, f) => n + (f.kernels ? f.kernels.rows.length : 0), 0);
  const rowsDrawn = await count("#head table.kernels tr.kind-row") + await count("#head table.kernels tr.kernel-row");
  expect(rowsDrawn === kernelRows, `${rowsDrawn} kernel rows drawn, ${kernelRows} in the data`, problems);

  // The screenshot is of the page as it opens (regressions expanded).
  await page.reload();
  await page.waitForLoadState("load");
  const out = shot || path.join(path.dirname(file), "report.png");
  await page.screenshot({ path: out, fullPage: data.cells.length <= 40 });
  for (const e of errors) problems.push(e);
  await page.close();
  const energyTrends = data.trends.filter((t) => t.metric === "tokens_per_joule").length;
  return { file, cells: data.cells.length, findings, bisected, kernel_rows: kernelRows, scaled_by_measured: scaledByMeasured,
    energy_bars: energyBars, energy_note: energyNote, energy_trends: energyTrends, screenshot: out, problems };
}

const { context, network, close } = await launch();
let failed = false;
try {
  for (const file of argv) {
    const r = await check(context, file);
    console.log(JSON.stringify(r));
    if (r.problems.length) failed = true;
  }
} finally {
  await close();
}
exit(failed, network);
