// Renders every ```mermaid block of Markdown files (PR comments, job summaries) with the real
// Mermaid library from node_modules, in headless chromium, offline, as GitHub and GitLab
// would: each block must parse, render to an SVG with its plot, and log no error.
//
// Usage: node tests/browser/render-mermaid.mjs FILE.md...  (prints one JSON line per file)
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { exit, launch, watch } from "./chromium.mjs";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const files = process.argv.slice(2);
if (!files.length) {
  console.error("usage: render-mermaid.mjs FILE.md...");
  process.exit(2);
}
const { context, network, close } = await launch();
let failed = false;
try {
  const page = await context.newPage();
  const errors = watch(page);
  await page.setContent("<!doctype html><html><body><div id=out></div></body></html>");
  await page.addScriptTag({ path: path.join(root, "node_modules/mermaid/dist/mermaid.min.js") });
  await page.evaluate(() => window.mermaid.initialize({ startOnLoad: false, securityLevel: "strict" }));
  for (const file of files) {
    const md = fs.readFileSync(file, "utf8");
    const blocks = [...md.matchAll(/```mermaid\n([\s\S]*?)```/g)].map((m) => m[1]);
    const results = await page.evaluate(async (blocks) => {
      const out = [];
      for (let i = 0; i < blocks.length; i++) {
        try {
          const { svg } = await window.mermaid.render("chart" + i, blocks[i]);
          const holder = document.createElement("div");
          holder.innerHTML = svg;
          document.getElementById("out").append(holder);
          const el = holder.querySelector("svg");
          out.push({ ok: !!el, lines: holder.querySelectorAll("[class*=line-plot] path").length, bytes: svg.length });
        } catch (e) {
          out.push({ ok: false, error: String(e && e.message ? e.message : e) });
        }
      }
      return out;
    }, blocks);
    const bad = results.filter((r) => !r.ok || r.lines < 1);
    console.log(JSON.stringify({ file, blocks: blocks.length, rendered: results.length - bad.length, bad }));
    if (bad.length) failed = true;
  }
  if (errors.length) {
    console.error(errors.join("\n"));
    failed = true;
  }
} finally {
  await close();
}
exit(failed, network);
