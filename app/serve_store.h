/* serve_store: `kvchat serve --store [DB]` — each finished request saved as a conversation in the chat's SQLite database (app/chatstore.h), so `kvchat list`, export and the chat's F3 show it. */
#ifndef APP_SERVE_STORE_H
#define APP_SERVE_STORE_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "engine/generate.h"
#include "engine/sampler.h"

typedef struct serve_store serve_store;

/* Open (create) the database at db_path for the model of engine e (registered as the chat does;
 * no KV prefix store). NULL with why on failure. */
serve_store *serve_store_open(engine *e, const char *db_path, char *why, size_t why_cap);
void serve_store_close(serve_store *ss); /* NULL is a no-op */
const char *serve_store_path(const serve_store *ss);

/* What to keep of a request until it finishes: its "messages" (chat) or "prompt" (completion,
 * a string or the first of a list) as JSON text (malloc'd); NULL when there is nothing to store
 * or no memory. */
char *serve_store_capture(const cJSON *root, int chat);

/* Save one finished request as a new conversation: the captured messages (system → the
 * conversation's system prompt; user / assistant in order; a completion's prompt as the user
 * message) and the reply under the last one, with its finish (enum gen_finish), timings and
 * parameters. Any thread (a mutex serialises them). Returns 0 and the conversation's id in *conv_id,
 * or -1 with why. */
int serve_store_save(serve_store *ss, const char *captured, const char *reply, size_t len, int finish,
                     const gen_stats *st, const sampler_params *sp, int n_predict, long long *conv_id, char *why,
                     size_t why_cap);

#endif
