// Opens the site `bench site` wrote in headless chromium as a reader would and checks it, as
// check-report.mjs checks report.html: no console error or exception, no request beyond
// file://, every chart drawn, the filters working, and markup in a cell id shown as text.
//
// The index: a row and a sparkline per series, a finding per open regression group, the
// filters by axis value, hardware key, branch and verdict each showing exactly the rows the
// data says; each finding's triage (bisection status, first bad commit, the command that
// finishes it, the kernels that moved, the probed commits) as its data holds it; no script
// but the page's own three. Cell pages: one trend chart per series,
// with as many change points, accepted shifts and verdict marks drawn as the data holds.
// Run pages: a row per cell, the cost of the verdict as the data words it, and a row per
// cell whose verdict took more than measuring it. The runs
// table: a cost column that shows a figure exactly where the store kept one. Every page is checked with --all; else the cell pages of the
// findings, of a hostile id and the first few, and the first and last run pages.
// Writes index.png beside index.html (or --screenshot FILE).
//
// Usage: node tests/browser/check-site.mjs [--all] [--screenshot OUT.png] SITE_DIR
import fs from "node:fs";
import path from "node:path";
import { exit, launch, watch } from "./chromium.mjs";

const argv = process.argv.slice(2);
let all = false, shot = null;
while (argv[0] && argv[0].startsWith("--")) {
  if (argv[0] === "--all") { all = true; argv.shift(); }
  else if (argv[0] === "--screenshot") { shot = argv[1]; argv.splice(0, 2); }
  else break;
}
if (argv.length !== 1) {
  console.error("usage: check-site.mjs [--all] [--screenshot OUT.png] SITE_DIR");
  process.exit(2);
}
const site = path.resolve(argv[0]);

function expect(cond, what, problems) { if (!cond) problems.push(what); }

async function open(context, file) {
  const page = await context.newPage();
  const errors = watch(page);
  await page.goto("file://" + file);
  await page.waitForLoadState("load");
  const data = await page.evaluate(() => JSON.parse(document.getElementById("bench-data").textContent));
  return { page, errors, data };
}

// Markup from the data never became an element: the page's own scripts (the data, uPlot,
// site.js, and on a cell or run page the shared table of runs or cells) and nothing the
// hostile id's `<script>` or `<img onerror>` would have made.
async function noInjection(page, file, problems, want = 4) {
  const [scripts, imgs, pwned] = await page.evaluate(() => [document.scripts.length, document.images.length, window.pwned]);
  expect(scripts === want, `${file}: ${scripts} script elements, ${want} expected`, problems);
  expect(imgs === 0, `${file}: ${imgs} img elements`, problems);
  expect(pwned === undefined, `${file}: a script from the data ran`, problems);
}

async function checkIndex(context, problems) {
  const file = path.join(site, "index.html");
  const { page, errors, data } = await open(context, file);
  const count = (sel) => page.locator(sel).count();
  expect(await count("#fleet tr.row") === data.rows.length, "a row per series", problems);
  const withSpark = data.rows.filter((r) => r.spark.filter((v) => Number.isFinite(v)).length >= 2).length;
  expect(await count("#fleet svg.spark polyline") === withSpark, `sparklines: ${await count("#fleet svg.spark polyline")} drawn, ${withSpark} expected`, problems);
  const cps = data.rows.reduce((n, r) => n + (r.spark.length >= 2 ? r.spark_changes.length : 0), 0);
  expect(await count("#fleet svg.spark line.cp") === cps, "a sparkline tick per change point shown", problems);
  expect(await count("#findings .finding") === data.findings.length, "a finding per open group", problems);
  expect(await count("#runs tr.run-row") === data.run_list.length, "a row per run", problems);
  // The runs table's cost column: a figure where the store kept the run's cost, "–" where
  // it kept none (the rows are newest first).
  const costs = await page.$$eval("#runs tr.run-row td.cost", (tds) => tds.map((td) => td.textContent));
  const kept = [...data.run_list].reverse().map((r) => typeof r.gpu_s === "number");
  expect(costs.length === kept.length && costs.every((t, i) => (t === "–") === !kept[i]),
    `the cost column: ${JSON.stringify(costs.slice(0, 5))}..., the data keeps ${kept.filter(Boolean).length} of ${kept.length}`, problems);
  // Each finding's triage as its data holds it: the first bad commit's subject as text, the
  // command that finishes an unfinished bisection, a row per kind and kernel that moved and
  // per probed commit.
  const drawn = await page.$$eval("#findings .finding", (boxes) => boxes.map((b) => {
    const q = (sel) => b.querySelector(sel);
    return {
      triage: !!q(".triage"), status: q(".triage .bisect-status strong")?.textContent ?? null,
      subject: q(".triage .first-bad .subject")?.textContent ?? null, author: q(".triage .first-bad .author")?.textContent ?? null,
      command: q(".triage code.command")?.textContent ?? null,
      kernelRows: b.querySelectorAll(".triage table.kernels tr.kind-row, .triage table.kernels tr.kernel-row").length,
      probes: b.querySelectorAll(".triage tr.probe-row").length, missing: !!q(".triage .kernels-missing"),
    };
  }));
  data.findings.forEach((f, i) => {
    const t = f.triage, d = drawn[i] || {};
    const what = `finding ${i + 1}'s triage`;
    expect(d.triage === !!t, `${what}: drawn ${d.triage}, in the data ${!!t}`, problems);
    if (!t) return;
    const b = t.bisected;
    expect(d.status === (b ? "bisection " + t.status : null), `${what}: status ${d.status}`, problems);
    expect(d.subject === (b && b.first_bad ? b.first_bad.subject : null), `${what}: first bad commit's subject ${JSON.stringify(d.subject)}`, problems);
    if (b && b.first_bad) expect(d.author === `(${b.first_bad.author})`, `${what}: author ${d.author}`, problems);
    expect(d.command === (b && b.command ? b.command : null), `${what}: the finish-it command ${JSON.stringify(d.command)}`, problems);
    const rows = t.kernels ? t.kernels.kinds.length + t.kernels.kernels.length : 0;
    expect(d.kernelRows === rows, `${what}: ${d.kernelRows} kernel rows, ${rows} in the data`, problems);
    expect(d.probes === t.probes.length, `${what}: ${d.probes} probed commits, ${t.probes.length} in the data`, problems);
    expect(d.missing === (!t.kernels && !!t.kernels_missing), `${what}: why no kernels`, problems);
  });
  // Open regressions come first: every open row before every other row, and as many open
  // rows as the data has open series.
  const classes = await page.locator("#fleet tr.row").evaluateAll((trs) => trs.map((tr) => tr.className));
  const isOpen = classes.map((c) => c.split(" ").includes("open"));
  const lastOpen = isOpen.lastIndexOf(true), firstOther = isOpen.indexOf(false);
  expect(isOpen.filter(Boolean).length === data.rows.filter((r) => r.open).length, "a row marked open per open series", problems);
  expect(lastOpen === -1 || firstOther === -1 || lastOpen < firstOther, `open regressions first (last open row ${lastOpen}, first other ${firstOther})`, problems);

  // Every filter shows exactly the rows whose value matches, then all again.
  const visible = () => page.locator("#fleet tr.row:not([hidden])").count();
  const filters = await page.$$eval("select[data-filter]", (ss) => ss.map((s) => [s.dataset.filter, [...s.options].map((o) => o.value).filter((v) => v)]));
  let tried = 0;
  for (const [name, values] of filters) {
    const pick = values[values.length - 1];
    await page.selectOption(`select[data-filter="${name}"]`, pick);
    const have = (r) => (name.startsWith("axis") ? r.parts[Number(name.slice(4))] : r[name]);
    const want = data.rows.filter((r) => have(r) === pick).length;
    const got = await visible();
    expect(got === want, `filter ${name}=${pick}: ${got} rows, ${want} expected`, problems);
    await page.selectOption(`select[data-filter="${name}"]`, "");
    tried++;
  }
  expect(tried >= 3, `only ${tried} filters`, problems);
  expect(await visible() === data.rows.length, "every row back after the filters", problems);
  // Two filters together narrow to their intersection.
  if (filters.length >= 2) {
    const [a, av] = filters[0], [b, bv] = filters.find(([n]) => n === "key") || filters[1];
    await page.selectOption(`select[data-filter="${a}"]`, av[0]);
    await page.selectOption(`select[data-filter="${b}"]`, bv[0]);
    const have = (r, n) => (n.startsWith("axis") ? r.parts[Number(n.slice(4))] : r[n]);
    const want = data.rows.filter((r) => have(r, a) === av[0] && have(r, b) === bv[0]).length;
    expect(await visible() === want, `filters ${a} and ${b} together`, problems);
    await page.selectOption(`select[data-filter="${a}"]`, "");
    await page.selectOption(`select[data-filter="${b}"]`, "");
  }
  // A cell id that is markup is shown as its text.
  const hostile = data.rows.find((r) => r.cell.includes("<"));
  if (hostile) {
    const text = await page.locator(`#fleet tr.row td.id a`).evaluateAll((as, id) => as.some((a) => a.textContent === id), hostile.cell);
    expect(text, "the markup cell id shown as text", problems);
  }
  await noInjection(page, "index.html", problems, 3);
  await page.screenshot({ path: shot || path.join(site, "index.png") });
  for (const e of errors) problems.push("index.html: " + e);
  await page.close();
  return data;
}

async function checkCell(context, rel, problems) {
  const { page, errors, data } = await open(context, path.join(site, rel));
  const boxes = await page.$$eval(".chart[data-kind=trend]", (bs) => bs.map((b) => ({
    canvas: !!b.querySelector("canvas"), points: Number(b.dataset.points), cps: Number(b.dataset.changePoints),
    shifts: Number(b.dataset.shifts), marks: Number(b.dataset.marks) })));
  expect(boxes.length === data.series.length, `${rel}: ${boxes.length} charts, ${data.series.length} series`, problems);
  // A point is [run, value, verdict] (the run an index into assets/runs.js).
  const runs = await page.evaluate(() => JSON.parse(window.benchRuns).length);
  data.series.forEach((s, i) => {
    const b = boxes[i];
    if (!b) return;
    expect(s.points.every(([r]) => Number.isInteger(r) && r >= 0 && r < runs), `${rel}: series ${i} names a run the table lacks`, problems);
    const marks = s.points.filter((p) => ["regressed", "improved", "environment", "suspect", "unknown"].includes(p[2])).length;
    const shifts = s.segments.filter((g) => g.index !== null).length;
    expect(b.canvas && b.points === s.points.length && b.cps === s.change_points.length && b.shifts === shifts && b.marks === marks,
      `${rel}: series ${i} drawn ${JSON.stringify(b)}, data has ${s.points.length} points, ${s.change_points.length} change points, ${shifts} shifts, ${marks} marks`, problems);
  });
  expect(await page.locator("h1").textContent() === data.cell, `${rel}: the cell id as the heading's text`, problems);
  await noInjection(page, rel, problems);
  for (const e of errors) problems.push(`${rel}: ${e}`);
  await page.close();
}

async function checkRun(context, rel, problems) {
  const { page, errors, data } = await open(context, path.join(site, rel));
  const rows = await page.locator("#run-cells tr.row").count();
  expect(rows === data.cells.length, `${rel}: ${rows} rows, ${data.cells.length} cells`, problems);
  // A cell is [cell, value, previous, verdict] (the cell an index into assets/cells.js):
  // each row names its cell and links its page.
  const named = await page.$$eval("#run-cells tr.row td.id a", (as) => as.length);
  expect(named === data.cells.length, `${rel}: ${named} cell links, ${data.cells.length} cells`, problems);
  // The cost line as the data words it, or none for a run the store kept no cost of.
  const cost = (await page.locator("#cost").count()) ? await page.locator("#cost").textContent() : null;
  expect(cost === (data.cost ?? null), `${rel}: the cost line ${JSON.stringify(cost)}, the data's ${JSON.stringify(data.cost)}`, problems);
  // The cells whose verdict took more than measuring them: a row each, naming the cell, its
  // total the sum of its four parts as the data gives them.
  const byCell = await page.$$eval("#cell-costs tbody tr", (trs) => trs.map((tr) => [...tr.children].map((td) => td.textContent)));
  const want = data.cell_costs || [];
  expect(byCell.length === want.length, `${rel}: ${byCell.length} rows of cell costs, the data has ${want.length}`, problems);
  for (let i = 0; i < Math.min(byCell.length, want.length); i++) {
    expect(byCell[i][0] === want[i][0], `${rel}: cell cost row ${i} names ${JSON.stringify(byCell[i][0])}, the data ${JSON.stringify(want[i][0])}`, problems);
    expect(byCell[i].length === 6, `${rel}: cell cost row ${i} has ${byCell[i].length} columns`, problems);
  }
  if (data.report) {
    const href = await page.locator("#report a").getAttribute("href");
    expect(href === data.report, `${rel}: the report link`, problems);
    const target = path.resolve(path.dirname(path.join(site, rel)), decodeURIComponent(href));
    expect(fs.existsSync(target), `${rel}: the report link points at ${target}, which is not there`, problems);
  }
  await noInjection(page, rel, problems);
  for (const e of errors) problems.push(`${rel}: ${e}`);
  await page.close();
}

const { context, network, close } = await launch();
const problems = [];
let cells = [], runs = [];
try {
  const index = await checkIndex(context, problems);
  const allCells = [...new Set(index.rows.map((r) => r.page))];
  const allRuns = index.run_list.map((r) => r.page);
  if (all) { cells = allCells; runs = allRuns; }
  else {
    const pick = new Set(allCells.slice(0, 5));
    for (const f of index.findings) for (const [, p] of f.cells.slice(0, 3)) pick.add(p);
    for (const r of index.rows) if (r.cell.includes("<")) pick.add(r.page);
    for (const r of index.rows.filter((r) => r.change_points).slice(0, 3)) pick.add(r.page);
    cells = [...pick];
    runs = [...new Set([allRuns[0], allRuns[allRuns.length - 1], ...index.run_list.filter((r) => r.report).map((r) => r.page)])].filter(Boolean);
  }
  for (const c of cells) await checkCell(context, c, problems);
  for (const r of runs) await checkRun(context, r, problems);
} finally {
  await close();
}
console.log(JSON.stringify({ site, cell_pages: cells.length, run_pages: runs.length, problems }));
exit(problems.length > 0, network);
