// Renders Markdown files (job summaries, PR comments, frameworks.md) as GitHub would render
// them (GitHub Flavored Markdown, by marked from node_modules; raw HTML kept, as GitHub keeps
// its allowed tags) and opens the HTML in headless chromium, offline, to check that text from
// a run stayed text: no element bench's Markdown does not write itself (an <img>, a <script>,
// an <iframe>, <b> ... from a value), and no live @mention (an `@` right before a name in
// text outside code).
//
// Usage: node tests/browser/check-markdown.mjs FILE.md...  (prints one JSON line per file)
import fs from "node:fs";
import { marked } from "marked";
import { exit, launch, watch } from "./chromium.mjs";

// The elements bench's own Markdown renders to.
const ALLOWED = new Set(["HTML", "HEAD", "BODY", "H1", "H2", "H3", "H4", "H5", "H6", "P", "UL", "OL", "LI",
  "TABLE", "THEAD", "TBODY", "TR", "TH", "TD", "CODE", "PRE", "STRONG", "EM", "A", "BLOCKQUOTE", "DETAILS",
  "SUMMARY", "BR", "HR", "DEL"]);

const files = process.argv.slice(2);
if (!files.length) {
  console.error("usage: check-markdown.mjs FILE.md...");
  process.exit(2);
}
const { context, network, close } = await launch();
let failed = false;
try {
  const page = await context.newPage();
  const errors = watch(page);
  for (const file of files) {
    const html = marked.parse(fs.readFileSync(file, "utf8"), { gfm: true });
    await page.setContent("<!doctype html><html><body>" + html + "</body></html>");
    const found = await page.evaluate((allowed) => {
      const foreign = [...document.querySelectorAll("*")].map((e) => e.tagName).filter((t) => !allowed.includes(t));
      const mentions = [];
      const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
      for (let n = walker.nextNode(); n; n = walker.nextNode()) {
        if (n.parentElement.closest("code, pre")) continue;
        const m = n.textContent.match(/(^|[^\w])@[\w-]/);
        if (m) mentions.push(n.textContent.trim().slice(0, 80));
      }
      return { foreign, mentions, code: document.querySelectorAll("code").length };
    }, [...ALLOWED]);
    const problems = [...found.foreign.map((t) => "element <" + t.toLowerCase() + ">"),
      ...found.mentions.map((t) => "live mention in: " + t), ...errors.splice(0)];
    console.log(JSON.stringify({ file, code: found.code, problems }));
    if (problems.length) failed = true;
  }
} finally {
  await close();
}
exit(failed, network);
