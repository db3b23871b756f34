/* serve: `kvchat serve` — an OpenAI-compatible HTTP server (chat completions, completions, models, health) over the engine. */
#ifndef KV_APP_SERVE_H
#define KV_APP_SERVE_H

/* `kvchat serve -m MODEL [--host 127.0.0.1] [--port 8080] [--parallel N] [--api-key KEY] [-c N] [-t N]
 * [-b N] [--kv-type T] [--chat-template NAME] [--max-body BYTES]` (argv[0] is "serve").
 * HTTP by libmicrohttpd (one thread per connection), JSON by cJSON. Routes:
 *   POST /v1/chat/completions, POST /v1/completions   (OpenAI's request and response shapes;
 *        "stream": true gives Server-Sent Events ending with "data: [DONE]")
 *   GET  /v1/models, GET /health (503 while the model loads)
 * Requests run one at a time on the generator thread, each on its own engine sequence (freed
 * afterwards, its full blocks stay cached, so a shared prefix is prefilled once); up to
 * --parallel requests are admitted (running + waiting), more get 503. Errors have OpenAI's shape
 * {"error": {"message", "type", "param", "code"}}. The API key (--api-key, else KVCHAT_API_KEY)
 * is required as "Authorization: Bearer KEY" on every route but /health.
 * Runs until SIGINT / SIGTERM. Returns an exit status (0 ok, 1 runtime, 2 usage, 3 model). */
int serve_main(int argc, char **argv);

#endif
