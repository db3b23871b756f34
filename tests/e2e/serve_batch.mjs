// serve_batch: continuous batching through the official `openai` npm client (tests/e2e/t_serve_batch.sh runs it):
// concurrent greedy streams equal each stream alone, and `n` choices with a seed.
// Usage: node serve_batch.mjs NODE_MODULES_DIR BASE_URL MODEL_ID
// Prints "ok NAME" or "FAIL NAME: why" per check; exits 1 when anything failed.
import { createRequire } from 'node:module';
import path from 'node:path';

const [nodeModules, baseURL, modelId] = process.argv.slice(2);
const require = createRequire(path.join(nodeModules, 'x.js'));
const OpenAI = require('openai');

let failed = 0;
function check(name, cond, why) {
  if (cond) console.log(`ok ${name}`);
  else { failed++; console.log(`FAIL ${name}: ${why}`); }
}
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 120000 });

// one streamed request: its text, finish reason, usage and the times of its first and last chunks
async function stream(req) {
  const s = await client.completions.create({ model: modelId, stream: true, stream_options: { include_usage: true }, ...req });
  let text = '', finish = null, usage = null, first = 0, last = 0;
  for await (const ch of s) {
    if (ch.usage) usage = ch.usage;
    for (const c of ch.choices) {
      if (c.text) { if (!first) first = performance.now(); last = performance.now(); text += c.text; }
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { text, finish, usage, first, last };
}

const prompts = ['Once upon a time', 'The little dog', 'Lily and Tom went to the park', 'One day, a cat'];
try {
  const alone = [];
  for (const p of prompts) alone.push(await stream({ prompt: p, max_tokens: 80, temperature: 0 }));
  const together = await Promise.all(prompts.map((p) => stream({ prompt: p, max_tokens: 80, temperature: 0 })));
  let same = true, why = '';
  for (let i = 0; i < prompts.length; i++)
    if (together[i].text !== alone[i].text || together[i].finish !== alone[i].finish ||
        together[i].usage.completion_tokens !== alone[i].usage.completion_tokens) {
      same = false;
      why += `[${i}] ${JSON.stringify(together[i].text)} vs alone ${JSON.stringify(alone[i].text)} `;
    }
  check('openai: 4 concurrent greedy streams each equal the stream alone', same && alone.every((a) => a.text.length > 40), why);
  const firstMax = Math.max(...together.map((t) => t.first)), lastMin = Math.min(...together.map((t) => t.last));
  check('openai: the 4 streams ran at the same time (every first chunk before any last one)', firstMax < lastMin,
        `first chunks up to ${firstMax.toFixed(0)} ms, a last chunk at ${lastMin.toFixed(0)} ms`);

  // n = 3 with a seed: choice i is what seed S + i gives alone; the same request gives the same choices
  const req = { prompt: 'The little dog', max_tokens: 30, temperature: 1.0, seed: 42 };
  const a = await client.completions.create({ model: modelId, n: 3, ...req });
  const b = await client.completions.create({ model: modelId, n: 3, ...req });
  const ta = a.choices.sort((x, y) => x.index - y.index).map((c) => c.text);
  const tb = b.choices.sort((x, y) => x.index - y.index).map((c) => c.text);
  check('openai: n = 3 with a seed gives 3 choices, the same each time', ta.length === 3 && JSON.stringify(ta) === JSON.stringify(tb),
        JSON.stringify(ta) + ' vs ' + JSON.stringify(tb));
  check('openai: the 3 choices differ (seeds S, S+1, S+2)', new Set(ta).size === 3, JSON.stringify(ta));
  const singles = [];
  for (let i = 0; i < 3; i++)
    singles.push((await client.completions.create({ model: modelId, ...req, seed: 42 + i })).choices[0].text);
  check('openai: choice i of n = 3 equals the request alone with seed S + i', JSON.stringify(singles) === JSON.stringify(ta),
        JSON.stringify(singles) + ' vs ' + JSON.stringify(ta));
  const allLength = a.choices.every((c) => c.finish_reason === 'length');
  check('openai: n = 3 usage: the prompt once, every choice\'s tokens', a.usage.prompt_tokens === 5 &&
        (allLength ? a.usage.completion_tokens === 90 : a.usage.completion_tokens > 3 && a.usage.completion_tokens < 90),
        JSON.stringify(a.usage));
  // streamed n = 3: each choice's chunks carry its index and add up to the non-streamed choice
  const s = await client.completions.create({ model: modelId, n: 3, stream: true, ...req });
  const ts = ['', '', ''];
  for await (const ch of s) for (const c of ch.choices) if (c.text) ts[c.index] += c.text;
  check('openai: streamed n = 3 equals the non-streamed choices', JSON.stringify(ts) === JSON.stringify(ta),
        JSON.stringify(ts) + ' vs ' + JSON.stringify(ta));
} catch (e) {
  check('openai: batching requests', false, String(e && e.stack || e));
}
process.exit(failed ? 1 : 0);
