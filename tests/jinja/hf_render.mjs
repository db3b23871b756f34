// Render chat templates with the reference Jinja implementation, @huggingface/jinja (npm), for
// tests/e2e/t_jinja.sh, which compares kvchat's own interpreter with it byte for byte.
// usage: TZ=UTC node hf_render.mjs NOW_SECONDS LIST
//   LIST: lines "TEMPLATE<TAB>CONTEXT.json<TAB>OUT"; writes the rendering to OUT, or on a
//   template error the message to OUT.err.
// or:    node hf_render.mjs contexts LIST
//   LIST: lines "BASE.json<TAB>EXTRA-JSON<TAB>OUT.json": OUT = BASE with EXTRA's keys set.
// HF_JINJA_DIR: the folder whose node_modules holds @huggingface/jinja.
import { readFileSync, writeFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
if (process.argv[2] === "contexts") {
  for (const line of readFileSync(process.argv[3], "utf8").split("\n")) {
    if (!line) continue;
    const [base, extra, out] = line.split("\t");
    writeFileSync(out, JSON.stringify({ ...JSON.parse(readFileSync(base, "utf8")), ...JSON.parse(extra) }));
  }
  process.exit(0);
}
const dir = process.env.HF_JINJA_DIR;
const { Template } = await import(pathToFileURL(`${dir}/node_modules/@huggingface/jinja/dist/index.js`).href);
const [now, list] = process.argv.slice(2);
// the reference defines strftime_now() on the machine's clock: fix the clock (TZ=UTC)
const fixed = Number(now) * 1000, RealDate = Date;
globalThis.Date = class extends RealDate {
  constructor(...a) { super(...(a.length ? a : [fixed])); }
  static now() { return fixed; }
};
for (const line of readFileSync(list, "utf8").split("\n")) {
  if (!line) continue;
  const [tmpl, ctx, out] = line.split("\t");
  try {
    writeFileSync(out, new Template(readFileSync(tmpl, "utf8")).render(JSON.parse(readFileSync(ctx, "utf8"))));
  } catch (e) {
    writeFileSync(`${out}.err`, `${e.message}\n`);
  }
}
