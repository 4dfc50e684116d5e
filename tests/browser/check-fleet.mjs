// Opens a fleet's report.html (`bench report merge` of several runs) in headless chromium as
// a reader would: no console error or exception, no request beyond file://, no script at
// all (the page has none, and nothing from the data became one), a row per run of
// fleet.json with its verdict, a section per run, and every link to a run's report leading
// to a file that is there.
//
// Usage: node tests/browser/check-fleet.mjs FLEET_DIR
import fs from "node:fs";
import path from "node:path";
import { exit, launch, watch } from "./chromium.mjs";

const argv = process.argv.slice(2);
if (argv.length !== 1) {
  console.error("usage: check-fleet.mjs FLEET_DIR");
  process.exit(2);
}
const dir = path.resolve(argv[0]);
const index = JSON.parse(fs.readFileSync(path.join(dir, "fleet.json"), "utf8"));
const problems = [];
const expect = (cond, what) => { if (!cond) problems.push(what); };

const { context, network, close } = await launch();
const page = await context.newPage();
const errors = watch(page);
await page.goto("file://" + path.join(dir, "report.html"));
await page.waitForLoadState("load");
const rows = await page.locator("#runs tr.run").count();
expect(rows === index.runs.length, `${rows} rows, ${index.runs.length} runs`);
for (const [i, run] of index.runs.entries()) {
  const row = page.locator("#runs tr.run").nth(i);
  const cells = await row.locator("td").allTextContents();
  expect(cells[0] === run.hardware_key, `row ${i}: hardware ${cells[0]}, ${run.hardware_key} expected`);
  expect(cells[2] === run.run_id, `row ${i}: run ${cells[2]}, ${run.run_id} expected`);
  const verdict = run.exit_code === 0 ? "pass" : "fail";
  expect(cells[7] === verdict, `row ${i}: verdict ${cells[7]}, ${verdict} expected`);
}
expect(await page.locator("section.part").count() === index.runs.length, "a section per run");
const links = await page.locator("a").evaluateAll((as) => as.map((a) => a.href));
for (const href of links) {
  const file = decodeURIComponent(new URL(href).pathname);
  expect(href.startsWith("file:") && fs.existsSync(file), `link ${href} leads nowhere`);
}
const [scripts, imgs] = await page.evaluate(() => [document.scripts.length, document.images.length]);
expect(scripts === 0 && imgs === 0, `${scripts} scripts and ${imgs} images on a page that has none`);
await page.screenshot({ path: path.join(dir, "report.png"), fullPage: true });
problems.push(...errors);
await close();
for (const p of problems) console.error(p);
if (!problems.length) console.log(`fleet: ${rows} runs, ${links.length} links, no problems`);
exit(problems.length > 0, network);
