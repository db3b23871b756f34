// greedy_ref: llama.cpp's greedy continuation (node-llama-cpp, the npm build, CPU, 2 threads, f32 KV
// cache, context 512) of the text "abc" after BOS, for tests/e2e/t_arch_greedy.sh.
// usage: node greedy_ref.mjs N MODEL.gguf ...   (run in the folder whose node_modules holds node-llama-cpp)
//   prints one line per model: "MODEL.gguf<TAB>[N generated token ids]" (temperature 0: the argmax at
//   every step, no repetition penalty).
import { getLlama } from "node-llama-cpp";
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const n = Number(process.argv[2]);
for (const modelPath of process.argv.slice(3)) {
  const model = await llama.loadModel({ modelPath, useMmap: true });
  const ctx = await model.createContext({ contextSize: 512, batchSize: 512, threads: 2, flashAttention: false,
    experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32" });
  const seq = ctx.getSequence();
  const out = [];
  for await (const t of seq.evaluate([model.tokens.bos, ...model.tokenize("abc", false)], { temperature: 0 })) {
    out.push(t);
    if (out.length >= n) break;
  }
  console.log(`${modelPath}\t${JSON.stringify(out)}`);
  await ctx.dispose();
  await model.dispose();
}
