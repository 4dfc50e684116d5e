// Starts Debian's chromium (or $BENCH_CHROMIUM) through playwright-core, offline: a new empty
// profile, no background networking, and every request that is not a local file aborted
// and recorded, so a page that reaches for a CDN fails its test.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { chromium } from "playwright-core";

export const FLAGS = [
  "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync",
];

export async function launch() {
  const executablePath = process.env.BENCH_CHROMIUM || "/usr/bin/chromium";
  if (!fs.existsSync(executablePath)) {
    throw new Error(`${executablePath} not found: install Debian's chromium (apt-get install chromium) or set BENCH_CHROMIUM`);
  }
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), "bench-chromium-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath, headless: true, args: FLAGS, viewport: { width: 1400, height: 900 },
  });
  const network = [];
  await context.route("**/*", (route) => {
    const url = route.request().url();
    if (url.startsWith("file:") || url.startsWith("data:") || url === "about:blank") return route.continue();
    network.push(url);
    return route.abort();
  });
  const close = async () => {
    await context.close();
    fs.rmSync(profile, { recursive: true, force: true });
  };
  return { context, network, close };
}

// Records console errors and uncaught exceptions of a page.
export function watch(page) {
  const errors = [];
  page.on("console", (m) => { if (m.type() === "error") errors.push("console: " + m.text()); });
  page.on("pageerror", (e) => errors.push("exception: " + e.message));
  return errors;
}

// Exits 1 when a check failed or a page reached for the network, else 0.
export function exit(failed, network) {
  if (network.length) console.error("network requests: " + network.join(", "));
  process.exit(failed || network.length ? 1 : 0);
}
