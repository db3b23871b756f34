// bench_serve: N concurrent streamed completions against an OpenAI-compatible server (kvchat serve or
// llama.cpp's llama-server), timing every chunk. A measurement, not a test (tests/bench_serve.sh runs it).
// Usage: node bench_serve.mjs URL N TOKENS
// Prints one line: N, wall s, aggregate decode t/s (tokens after each stream's first / the span from the
// first stream's first token to the last stream's last), mean and p90 inter-token latency over every
// stream's gaps (ms), mean TTFT (ms), tokens.
const [url, nArg, tokArg] = process.argv.slice(2);
const N = +nArg, T = +tokArg;
const prompts = ['Once upon a time', 'The little dog', 'Lily and Tom went to the park', 'One day, a cat',
  'The old man', 'In a small town', 'Sam had a red ball', 'The sun was hot'];

async function stream(i, t0) {
  const body = { prompt: prompts[i % prompts.length] + (i >= prompts.length ? ` ${i}` : ''), max_tokens: T,
    temperature: 0, stream: true, ignore_eos: true, stream_options: { include_usage: true } };
  const r = await fetch(url, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  const dec = new TextDecoder();
  let buf = '', n = 0, usage = null;
  const times = [];
  for await (const part of r.body) {
    buf += dec.decode(part, { stream: true });
    let k;
    while ((k = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, k).trim();
      buf = buf.slice(k + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const j = JSON.parse(ev.slice(6));
      if (j.usage && j.usage.completion_tokens) usage = j.usage.completion_tokens;
      if (j.choices && j.choices.some((c) => c.text)) { n++; times.push(performance.now() - t0); }
    }
  }
  return { n: usage || n, times };
}

const t0 = performance.now();
const res = await Promise.all(Array.from({ length: N }, (_, i) => stream(i, t0)));
const wall = (performance.now() - t0) / 1e3;
const gaps = [];
let dec = 0, tok = 0, ttft = 0;
for (const r of res) {
  for (let i = 1; i < r.times.length; i++) gaps.push(r.times[i] - r.times[i - 1]);
  dec += r.n - 1;
  tok += r.n;
  ttft += r.times[0] || 0;
}
const first = Math.min(...res.map((r) => r.times[0])), last = Math.max(...res.map((r) => r.times[r.times.length - 1]));
gaps.sort((a, b) => a - b);
const mean = gaps.reduce((a, b) => a + b, 0) / (gaps.length || 1);
const p90 = gaps.length ? gaps[Math.floor(gaps.length * 0.9)] : 0;
console.log([N, wall.toFixed(2), (dec / ((last - first) / 1e3)).toFixed(1), mean.toFixed(1), p90.toFixed(1),
  (ttft / N).toFixed(0), tok].join(' '));
