// Render a chat template with the reference Jinja implementation, @huggingface/jinja (npm), the
// way tests/e2e/t_jinja.sh compares kvchat's own interpreter with it.
// usage: TZ=UTC node hf_render.mjs TEMPLATE CONTEXT.json [NOW_SECONDS]
// HF_JINJA_DIR: the folder whose node_modules holds @huggingface/jinja. Prints the rendering
// as is; on a template error prints "ERROR: message" to stderr and exits 1.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
const dir = process.env.HF_JINJA_DIR;
const { Template } = await import(pathToFileURL(`${dir}/node_modules/@huggingface/jinja/dist/index.js`).href);
const [tmplPath, ctxPath, now] = process.argv.slice(2);
const ctx = JSON.parse(readFileSync(ctxPath, "utf8"));
if (now !== undefined) {
  // the reference defines strftime_now() on the machine's clock: fix the clock (run with TZ=UTC)
  const fixed = Number(now) * 1000, RealDate = Date;
  globalThis.Date = class extends RealDate {
    constructor(...a) { super(...(a.length ? a : [fixed])); }
    static now() { return fixed; }
  };
}
try {
  process.stdout.write(new Template(readFileSync(tmplPath, "utf8")).render(ctx));
} catch (e) {
  process.stderr.write(`ERROR: ${e.message}\n`);
  process.exit(1);
}
