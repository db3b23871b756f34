/* config: kvchat's settings — built-in defaults, the config file (INI, inih), the environment and the command line, resolved in that order of precedence. */
#ifndef KV_APP_CONFIG_H
#define KV_APP_CONFIG_H

#include <getopt.h>
#include <stddef.h>
#include <stdio.h>

#include "engine/generate.h"
#include "engine/sampler.h"

/*
 * Precedence, highest first: command line > environment > config file > built-in default.
 *
 * The config file is $XDG_CONFIG_HOME/kvchat/config.ini (default ~/.config/kvchat/config.ini),
 * an INI file (kvchat.conf(5)):
 *
 *   [model]     model, n_ctx, n_batch, threads, kv_type, chat_template
 *   [sampling]  temp, top_k, top_p, min_p, repeat_penalty, repeat_last_n, presence_penalty,
 *               frequency_penalty, seed, n_predict, draft (off, lookup or a draft model's path),
 *               draft_max (1..32, default 8), draft_min_p (0..1, default 0.5)
 *   [chat]      theme, mouse, system, markdown
 *   [storage]   db, cache_size
 *   [persona NAME]  system and any [sampling] key: a persona, the chat's /persona NAME
 *   [remote]    url, api_key, model, timeout (the chat on an OpenAI-compatible server: app/remote.h)
 *
 * Keys may also stand before the first section; '-' and '_' are the same in key names. A line
 * that cannot be used (no '=', unknown section or key, bad value, too long) gives a warning
 * "FILE:LINE: what is wrong; ..." and is ignored; the rest of the file applies. A missing
 * file is not an error. Environment: KVCHAT_MODEL (model), KVCHAT_DB (db), KVCHAT_REMOTE_API_KEY
 * (api_key; --print-config never shows a key). "~/" at the start
 * of a path value is the home directory. cache_size is MiB, or a size with a unit (512M, 2G).
 */

enum cfg_key {
    CFG_MODEL = 0, CFG_N_CTX, CFG_N_BATCH, CFG_THREADS, CFG_KV_TYPE, CFG_CHAT_TEMPLATE,
    CFG_TEMP, CFG_TOP_K, CFG_TOP_P, CFG_MIN_P, CFG_REPEAT_PENALTY, CFG_REPEAT_LAST_N,
    CFG_PRESENCE_PENALTY, CFG_FREQUENCY_PENALTY, CFG_SEED, CFG_N_PREDICT,
    CFG_THEME, CFG_MOUSE, CFG_SYSTEM, CFG_MARKDOWN, CFG_DB, CFG_CACHE_SIZE,
    CFG_DRAFT, CFG_DRAFT_MAX, CFG_DRAFT_MIN_P,
    CFG_REMOTE_URL, CFG_REMOTE_API_KEY, CFG_REMOTE_MODEL, CFG_REMOTE_TIMEOUT,
    CFG_COUNT
};

/* Where a value came from. */
enum cfg_source { CFG_SRC_DEFAULT = 0, CFG_SRC_FILE, CFG_SRC_ENV, CFG_SRC_CLI };

typedef struct cfg_value {
    char *value;       /* normalized text ("0.7", "f16", "/home/u/m.gguf"); NULL = unset */
    int source;        /* enum cfg_source */
    char where[600];   /* "FILE:LINE", "KVCHAT_MODEL", "--temp" */
} cfg_value;

/* A [persona NAME] section of the config file: a system prompt and sampler settings the chat's
 * /persona NAME applies together. Its keys are system and the [sampling] keys, checked by the
 * same table as everywhere (config_check); v[key] the normalized text, NULL when not set. */
#define CFG_MAX_PERSONAS 32
typedef struct cfg_persona {
    char name[64];
    char *v[CFG_COUNT];
} cfg_persona;

typedef struct kv_config {
    char path[512];    /* the config file looked for ("" when neither XDG_CONFIG_HOME nor HOME is set) */
    int file_found;    /* 1: it exists and was read */
    int n_warnings;
    cfg_value v[CFG_COUNT];
    cfg_persona persona[CFG_MAX_PERSONAS];
    int n_personas;
} kv_config;

/* Warnings ("FILE:LINE: ...") go here; NULL = stderr with a "kvchat: " prefix. */
typedef void (*cfg_warn_fn)(void *ud, const char *msg);

/* Built-in defaults (engine_params_default / sampler_params_default). */
void config_init(kv_config *c);
void config_free(kv_config *c);

/* The config file's path: $XDG_CONFIG_HOME/kvchat/config.ini (XDG_CONFIG_HOME absolute),
 * else $HOME/.config/kvchat/config.ini. Returns 0, or -1 when neither is set. */
int config_default_path(char *buf, size_t cap);

/* Read an INI file over the current values (source CFG_SRC_FILE). A missing file returns 0
 * with file_found = 0; an unreadable one warns and returns -1. */
int config_load_file(kv_config *c, const char *path, cfg_warn_fn warn, void *ud);

/* Apply KVCHAT_MODEL and KVCHAT_DB (source CFG_SRC_ENV). An empty variable is ignored; a bad
 * value warns and is ignored. */
void config_load_env(kv_config *c, cfg_warn_fn warn, void *ud);

/* Everything below the command line: defaults, the default config file, the environment. */
void config_load_all(kv_config *c, cfg_warn_fn warn, void *ud);

/* Set key from text with source src (where: "--temp", "FILE:LINE" …). Returns 0, or -1 with
 * the reason in why (the value is then left as it was). */
int config_set(kv_config *c, int key, const char *text, int src, const char *where, char *why, size_t why_cap);

/* Record that a command-line option was given (after main.c has parsed it): the key it sets,
 * if any, takes the option's text with source CFG_SRC_CLI ("--no-mouse" sets mouse = false).
 * `name` is the long option name ("temp", "model"). Returns the key, or -1 (not a setting). */
int config_note_option(kv_config *c, const char *name, const char *optarg_text);

/* The same for an option getopt_long returned: val is its return value (a short option
 * letter or a long option's val), opts the table it was given. */
int config_note_getopt(kv_config *c, const struct option *opts, int val, const char *optarg_text);

/* Key by name ("top_k", "top-k"), or -1. */
int config_key_from_name(const char *name);
const char *config_key_name(int key);
const char *config_key_section(int key);

/* The resolved text of a key (NULL when unset: model, db, cache_size by default). */
const char *config_get(const kv_config *c, int key);

/* Copy the typed values into the engine and sampler parameters and n_predict; theme,
 * chat_template, mouse, db, cache_size and model are read with config_get(). */
void config_apply(const kv_config *c, engine_params *ep, sampler_params *sp, int *n_predict);

/* One key's value, as config_apply does for all: text must be normalized (config_check). ep may
 * be NULL (sampling keys only). */
void config_apply_key(int key, const char *text, engine_params *ep, sampler_params *sp, int *n_predict);

/* Validate text for key as every source does (command line, config.ini, the environment, the
 * chat's /set) and write its normalized form to out ("0.7", "auto", "random"). Returns 0, or -1
 * with the reason in why ("'5' is not a number from 0 to 2"). */
int config_check(int key, const char *text, char *out, size_t cap, char *why, size_t why_cap);

/* The one table of ranges: what a numeric key accepts, and how its slider shows it. */
typedef struct cfg_range {
    double lo, hi;        /* accepted values (inclusive) */
    int integer;          /* whole numbers only */
    double ui_lo, ui_hi;  /* the slider's span; equal: the key has no slider */
    double step;          /* the slider's step */
    int decimals;         /* digits shown */
    double off_value;     /* with off_label: the value that means "off" ("greedy", "∞") */
    const char *off_label;
    int log;              /* logarithmic slider with off_value past its right end (max tokens) */
} cfg_range;

/* The range of key; 0, or -1 when it is not numeric (*r zeroed). */
int config_key_range(int key, cfg_range *r);
/* "0-2", "0-1000000, 0 off", "-1-N, -1 no limit"; "N|random" for the seed; "" otherwise. */
void config_range_text(int key, char *buf, size_t cap);
/* The long option that sets key ("temp", "ctx-size"), or NULL. */
const char *config_key_option(int key);

/* The persona named name (case-sensitive), or NULL. */
const cfg_persona *config_persona_find(const kv_config *c, const char *name);
/* 1 if a persona may set key (system and the [sampling] keys). */
int config_persona_key(int key);

/* Parse a boolean: 1/0, true/false, yes/no, on/off. Returns 0/1, or -1. */
int config_parse_bool(const char *s);

/* `kvchat --print-config`: every key, its resolved value and where it came from, as an INI
 * file that could be saved as config.ini. resolved_model, if not NULL, is the model path
 * after models-directory lookup (shown when it differs from the value). */
void config_print(const kv_config *c, FILE *out, const char *resolved_model);

#endif
