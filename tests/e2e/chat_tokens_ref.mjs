// chat_tokens_ref: llama.cpp's tokenization (node-llama-cpp, the npm build) of rendered chat prompts,
// for tests/e2e/t_arch_chat.sh. Loads only the vocabulary of each model (vocabOnly).
// usage: node chat_tokens_ref.mjs LIST   (run in the folder whose node_modules holds node-llama-cpp)
//   LIST: lines "MODEL.gguf<TAB>PROMPT.txt<TAB>OUT"; OUT gets the ids of PROMPT.txt tokenized with
//   special tokens parsed and without BOS, as one JSON array.
import { getLlama } from "node-llama-cpp";
import { readFileSync, writeFileSync } from "node:fs";
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
for (const line of readFileSync(process.argv[2], "utf8").split("\n")) {
  if (!line) continue;
  const [modelPath, prompt, out] = line.split("\t");
  const model = await llama.loadModel({ modelPath, vocabOnly: true });
  writeFileSync(out, JSON.stringify([...model.tokenize(readFileSync(prompt, "utf8"), true)]) + "\n");
  await model.dispose();
}
