/* chatstore: the chat's conversations in the SQLite store — autosave, resume, the sessions list, /show cache, and the KV prefix store wired to the generator thread (restore before a prefill, save after a reply). */
#ifndef APP_CHATSTORE_H
#define APP_CHATSTORE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/generate.h"
#include "engine/sampler.h"
#include "engine/worker.h"
#include "storage/store.h"

/*
 * DESIGN.md "Who may know whom": storage stores rows and opaque blobs, the engine owns the KV
 * blob format, and this module (app) moves blobs between them. Two store handles: one for the
 * UI thread (messages, conversations; synchronous = FULL) and one opened on the generator
 * thread by the worker hooks (KV prefixes; synchronous = NORMAL — a cache).
 *
 * KV keys: the model fingerprint (chatstore_fingerprint), the KV type name, and the token
 * prefix with the engine's chained block hashes (kv_hash_block over KV_BLOCK_SIZE tokens; the
 * whole key's hash chains a partial last block the same way).
 *
 * Every function that can fail returns 0, or -1 with a one-line message in why; the chat shows
 * it and goes on (without saving, or without the cache).
 */

typedef struct chatstore chatstore;

#define CHATSTORE_DEFAULT_CACHE_MIB 1024

/* The database path: opt (--db, or the config's db / KVCHAT_DB) when set, else KVCHAT_DB,
 * else $XDG_DATA_HOME/kvchat/kvchat.db (XDG_DATA_HOME absolute), else
 * ~/.local/share/kvchat/kvchat.db. The default directory is created (0700) when create_dir.
 * Returns 0, or -1 with the reason in why. */
int chatstore_db_path(const char *opt, int create_dir, char *buf, size_t cap, char *why, size_t why_cap);

/* --cache-size: a number of MiB ("1024"), or a size with a unit ("512M", "2G", "2GiB", "100K").
 * Returns 0 and the bytes in *bytes, or -1. */
int chatstore_parse_cache_size(const char *s, uint64_t *bytes);

/* The model's identity in the store, 32 hex digits: the engine's fingerprint (kv_checksum64 of
 * the GGUF header, metadata and tensor table — everything before the tensor data — mixed with
 * the file size; engine_model_fingerprint), then kv_checksum64 of 64 evenly spaced 4 KiB
 * samples of the tensor data (so re-trained weights under an identical header differ too). */
void chatstore_fingerprint(const engine *e, char out[33]);

/* Open the store for the chat on engine e (registers the model). cache_bytes: the KV prefix
 * budget (0: no KV store). NULL with why on failure. */
chatstore *chatstore_open(engine *e, const char *db_path, uint64_t cache_bytes, char *why, size_t why_cap);
void chatstore_close(chatstore *cs); /* NULL is a no-op; call after the worker is destroyed */
/* /model: the chat goes on with engine e (registered as a model; the current conversation stays
 * current and from now on names e's model, so --resume opens it with that). Call with the old
 * worker destroyed and before the new one runs. Returns 0, or -1 with why. */
int chatstore_switch_engine(chatstore *cs, engine *e, char *why, size_t why_cap);
/* How a model is named on screen: its general.name, unless that is missing or only the
 * architecture ("llama"): then the file's name without .gguf, which says more. */
void chatstore_label(const char *name, const char *arch, const char *path, char *buf, size_t cap);
/* The same for a chat whose replies come from a server (app/remote.h): the "model" registered is
 * the server — path url, name model_name, architecture "remote", fingerprint "remote" + FNV-1a
 * hashes of url and name — and there is no KV prefix store (the server's cache is its own; no
 * worker hooks, chatstore_load never returns exact tokens). NULL with why on failure. */
chatstore *chatstore_open_remote(const char *url, const char *model_name, const char *db_path, char *why,
                                 size_t why_cap);
const char *chatstore_path(const chatstore *cs);

/* The hooks to install on the worker (worker_set_hooks): KV restore and save. */
void chatstore_worker_hooks(chatstore *cs, worker_hooks *h);
/* The next restore hook call comes from opening a chat: say what it restored (a note). */
void chatstore_announce_restore(chatstore *cs);
/* A message from the generator-thread side (a KV prefix not used and why, a restore), or 0. */
int chatstore_take_note(chatstore *cs, char *buf, size_t cap);

/* ---- the current conversation ----------------------------------------------------------- */
int64_t chatstore_current(const chatstore *cs); /* 0: none yet */
/* The UI thread's store handle (for exports from the chat); NULL for a NULL cs. */
store *chatstore_db(chatstore *cs);
/* The next message starts a new conversation. */
void chatstore_new(chatstore *cs);
/* A user message sent after parent (0: the first): creates the conversation on the first one
 * (with system prompt and parameters) and stores the message; *id its row. */
int chatstore_user_message(chatstore *cs, int64_t parent, const char *text, size_t len, const char *system,
                           const sampler_params *sp, int max_tokens, int64_t *id, char *why, size_t why_cap);
/* A reply that finished (gen_finish): a new message under parent, or (existing > 0) the update
 * of a continued one; with its generation record, and the conversation's exact tokens
 * conv[0..n_conv) at it. user_id (> 0) gets the token count its prompt added. */
int chatstore_reply(chatstore *cs, int64_t parent, int64_t existing, int64_t user_id, const char *text, size_t len,
                    int finish, const gen_stats *st, const sampler_params *sp, int max_tokens, uint64_t seed,
                    const int32_t *conv, size_t n_conv, int64_t *id, char *why, size_t why_cap);
/* Move the current conversation's head (/undo, /regen). */
int chatstore_set_head(chatstore *cs, int64_t head, char *why, size_t why_cap);
int chatstore_set_system(chatstore *cs, const char *system, char *why, size_t why_cap);

/* A conversation to show and continue. */
typedef struct chatstore_msg {
    int role;            /* STORE_ROLE_USER / _ASSISTANT (system messages are not listed) */
    char *text;
    size_t len;
    int64_t id;
    int64_t parent;      /* the message it follows (0: the first); siblings are branches */
    int finish;          /* store_finish of a reply */
    int partial;
    int64_t model_id;    /* the model that wrote a reply (0: unknown) */
    char author[128];    /* its name as the screen gives one (chatstore_label); "": unknown */
    char problem[200];   /* "" or why the row could not be read */
} chatstore_msg;

typedef struct chatstore_conv {
    int64_t id;
    char *title, *system;   /* system NULL: none */
    char model_name[128];   /* when it was held with another model than the chat's: that model's
                               name as the screen shows one ("" otherwise) */
    int have_params;
    sampler_params sp;
    int max_tokens;
    chatstore_msg *msgs;    /* from the first message to the head */
    size_t n;
    chatstore_msg *others;  /* the other branches' messages (not on the path), in id order */
    size_t n_others;
    int32_t *ctx;           /* the exact tokens at the head for this model, or NULL */
    size_t n_ctx;
    char note[800];         /* for the user: another model, unreadable rows ("" if none) */
} chatstore_conv;

/* "last" or an ID → the conversation's id. */
int chatstore_resolve(chatstore *cs, const char *spec, int64_t *id, char *why, size_t why_cap);
/* Load conversation id and make it the current one. */
int chatstore_load(chatstore *cs, int64_t id, chatstore_conv *out, char *why, size_t why_cap);
void chatstore_conv_free(chatstore_conv *c);

/* ---- the sessions list ------------------------------------------------------------------ */
int chatstore_list(chatstore *cs, const char *query, store_conv **rows, size_t *n, char *why, size_t why_cap);
int chatstore_rename(chatstore *cs, int64_t id, const char *title, char *why, size_t why_cap);
/* Delete a conversation (the current one too: the next message then starts a new one). */
int chatstore_delete(chatstore *cs, int64_t id, char *why, size_t why_cap);

/* /show cache: the store's size, budget, prefixes, this session's hit rate and restores. */
void chatstore_report(chatstore *cs, char *buf, size_t cap);

/* Open the database at path to read it (kvchat list, export, --resume without -m): read-only,
 * but a database of an older schema is migrated first when the file is writable (the
 * forward-only migrations of storage/store.c; a kvchat upgrade must not make `kvchat list`
 * fail). Returns store_open's status with err filled. */
int chatstore_open_reading(const char *path, store **s, store_error *err);

/* --resume without -m: the model file conversation spec ("last" or an ID) was saved with, read
 * from the database at db_path (read-only). Returns 0 with the path, or -1 with why (no such
 * conversation, its model file is gone). */
int chatstore_resume_model(const char *db_path, const char *spec, char *path, size_t cap, char *why, size_t why_cap);

/* Conversions shared with the CLI. */
void chatstore_params_from(store_params *out, const sampler_params *sp, int max_tokens);
void chatstore_params_to(const store_params *in, sampler_params *sp, int *max_tokens);
int chatstore_finish_of(int gen_finish); /* enum gen_finish → enum store_finish */

#endif
