// serve_openai: the official `openai` npm client against `kvchat serve` (tests/e2e/t_serve.sh runs it).
// Usage: node serve_openai.mjs NODE_MODULES_DIR BASE_URL API_KEY MODEL_ID EXPECTED_COMPLETION
// EXPECTED_COMPLETION: what `kvchat -p "Once upon a time" -n 20 --temp 0` prints after the prompt;
// "auth" instead: only the key checks (a server started with API_KEY).
// Prints "ok NAME" or "FAIL NAME: why" per check; exits 1 when anything failed.
import { createRequire } from 'node:module';
import path from 'node:path';

const [nodeModules, baseURL, apiKey, modelId, expected] = process.argv.slice(2);
const require = createRequire(path.join(nodeModules, 'x.js'));
const OpenAI = require('openai');

let failed = 0;
function check(name, cond, why) {
  if (cond) console.log(`ok ${name}`);
  else { failed++; console.log(`FAIL ${name}: ${why}`); }
}

const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });

if (expected === 'auth') {
  try {
    const m = await client.models.list();
    check('openai: the right key lists the models', m.data[0].id === modelId, JSON.stringify(m.data));
  } catch (e) {
    check('openai: the right key lists the models', false, String(e));
  }
  try {
    const bad = new OpenAI({ baseURL, apiKey: 'wrong-key', maxRetries: 0 });
    await bad.chat.completions.create({ model: modelId, messages: [{ role: 'user', content: 'hi' }] });
    check('openai: a wrong key is an AuthenticationError', false, 'no error');
  } catch (e) {
    check('openai: a wrong key is an AuthenticationError', e instanceof OpenAI.AuthenticationError && e.status === 401 &&
          e.code === 'invalid_api_key', `${e.constructor.name} ${e.status} ${e.code}`);
  }
  process.exit(failed ? 1 : 0);
}

try {
  const models = await client.models.list();
  check('openai: models.list names the model', models.data.length === 1 && models.data[0].id === modelId,
        JSON.stringify(models.data));

  const c = await client.completions.create({ model: modelId, prompt: 'Once upon a time', max_tokens: 20, temperature: 0 });
  check('openai: completions greedy text equals the one-shot output', c.choices[0].text === expected,
        JSON.stringify(c.choices[0].text) + ' vs ' + JSON.stringify(expected));
  check('openai: completions usage', c.usage.prompt_tokens === 5 && c.usage.completion_tokens === 20 &&
        c.usage.total_tokens === 25 && c.choices[0].finish_reason === 'length', JSON.stringify(c.usage));

  const cs = await client.completions.create({ model: modelId, prompt: 'Once upon a time', max_tokens: 20, temperature: 0,
                                               stream: true, stream_options: { include_usage: true } });
  let text = '', usage = null, finish = null;
  for await (const ch of cs) {
    if (ch.choices.length) { text += ch.choices[0].text; if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason; }
    if (ch.usage) usage = ch.usage;
  }
  check('openai: streamed completion equals the one-shot output', text === expected && finish === 'length',
        JSON.stringify(text) + ' finish ' + finish);
  check('openai: streamed completion usage chunk', usage && usage.completion_tokens === 20 && usage.prompt_tokens === 5,
        JSON.stringify(usage));

  const msgs = [{ role: 'system', content: 'You tell stories.' }, { role: 'user', content: 'Once upon a time' }];
  const r = await client.chat.completions.create({ model: modelId, messages: msgs, max_tokens: 12, temperature: 0 });
  check('openai: chat completion', r.object === 'chat.completion' && r.choices[0].message.role === 'assistant' &&
        r.choices[0].message.content.length > 0 && r.usage.completion_tokens === 12 &&
        r.usage.prompt_tokens_details.cached_tokens >= 0, JSON.stringify(r));

  const rs = await client.chat.completions.create({ model: modelId, messages: msgs, max_tokens: 12, temperature: 0,
                                                    stream: true, stream_options: { include_usage: true } });
  let ctext = '', role = null, cfinish = null, cusage = null, n = 0;
  for await (const ch of rs) {
    n++;
    if (ch.choices.length) {
      const d = ch.choices[0].delta;
      if (d.role) role = d.role;
      if (d.content) ctext += d.content;
      if (ch.choices[0].finish_reason) cfinish = ch.choices[0].finish_reason;
    }
    if (ch.usage) cusage = ch.usage;
  }
  check('openai: streamed chat equals the non-streamed reply', ctext === r.choices[0].message.content &&
        role === 'assistant' && cfinish === 'length' && n >= 3, JSON.stringify(ctext) + ' vs ' +
        JSON.stringify(r.choices[0].message.content));
  check('openai: streamed chat usage', cusage && cusage.completion_tokens === 12 &&
        cusage.prompt_tokens === r.usage.prompt_tokens, JSON.stringify(cusage));

  try {
    await client.chat.completions.create({ model: modelId, messages: 'nope' });
    check('openai: a bad field is a BadRequestError', false, 'no error');
  } catch (e) {
    check('openai: a bad field is a BadRequestError', e instanceof OpenAI.BadRequestError && e.status === 400 &&
          e.param === 'messages', `${e.constructor.name} ${e.status} ${e.param}`);
  }
} catch (e) {
  failed++;
  console.log(`FAIL openai: unexpected error: ${e}`);
}
process.exit(failed ? 1 : 0);
