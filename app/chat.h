/* chat: the session controller — the conversation, prompt building (completion mode or chat template), slash commands, and the wiring between the UI thread and the generator thread. */
#ifndef APP_CHAT_H
#define APP_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "engine/generate.h"
#include "engine/sampler.h"

typedef struct chat_options {
    const char *theme;        /* theme name or path; NULL: "default" */
    int n_predict;            /* max tokens per reply, < 0: until end of text / full context */
    int no_bos;
    int mouse;                /* 1: the mouse wheel scrolls (the terminal's own selection then needs Shift) */
    const char *history_path; /* NULL: chat_history_path(); "": no history file */
    const char *chat_template;/* template family name (chat_template_from_name) or a .jinja file, NULL: the model's */
    const char *db_path;      /* the conversation database (app/chatstore.h); NULL: nothing is saved */
    uint64_t cache_bytes;     /* budget of the KV prefix store in it; 0: no KV store */
    const char *resume;       /* NULL, or "last" / a conversation ID to open at start */
    const char *const *stops; /* --stop: the chat's first stop strings (/set stop adds, clears) */
    int n_stops;
    const char *system;       /* --system: the system prompt of new conversations; NULL: none */
    int markdown;             /* 1: replies are shown as rendered Markdown (--no-markdown: 0) */
    const struct kv_config *config; /* the settings, for /persona's [persona NAME] sections (NULL: none) */
    const engine_params *ep;  /* how e was opened: /model opens another model with these (NULL: no /model) */
    const char *const *warnings; /* config.ini / environment warnings to show in the chat */
    int n_warnings;
    const struct spec_params *spec; /* speculative decoding at start (engine/speculate.h; its draft
                                 engine stays the caller's); /set draft changes it; NULL: off */
    const char *draft_path;   /* the draft model's file, for /set draft and /show params */
    /* --remote URL: the replies come from an OpenAI-compatible server (app/remote.h) instead of
     * the local engine; chat_run then gets e = NULL and s = NULL */
    const char *remote_url;
    const char *remote_api_key;  /* NULL: none */
    const char *remote_model;    /* NULL: the server's first model */
    double remote_timeout_s;     /* a server silent this long fails the reply (<= 0: 120) */
    const sampler_params *sp;    /* with remote: the sampling parameters to start from */
} chat_options;

/* Run the full-screen chat on engine *e with sampler *s until the user quits — or, with
 * o->remote_url (*e and *s NULL), on a server. Both stay the caller's to close after it returns;
 * /model replaces them (closing the old ones), so *e and *s are then the ones in use at the end.
 * Returns an exit status:
 * 0, 2 (an unknown --theme), 1 (the screen could not start; message on stderr), 4 (--resume
 * could not be honoured: no database, no such conversation; message on stderr), or 128 + the
 * signal that ended it (SIGTERM, SIGHUP). The terminal is restored on every path, also on a
 * fatal signal (SIGSEGV, SIGABRT …). Conversations are saved as they go (app/chatstore.h);
 * a reply streaming when the chat ends is stopped and saved as partial. */
int chat_run(engine **e, sampler **s, const chat_options *o);

/* `/set NAME VALUE` for a sampling parameter or max_tokens (the chat's names: temp, top_k, …,
 * seed, max_tokens; ranges from the settings table, app/config.c): applies it to *sp and
 * *max_tokens (< 0: no limit) and writes "temp = 0.70" to msg; or returns -1 with the error in
 * msg (nothing changed). Also the line-by-line session's /set. */
int chat_set_param(const char *name, const char *value, sampler_params *sp, int *max_tokens, char *msg, size_t cap);

/* The full-screen chat's slash commands, in /help order (the one table, chat.c's commands[]):
 * the name ("/set") and *help (lines "USAGE<TAB>TEXT", continued by "<TAB>  " lines; a line "@set"
 * or a trailing "@personas" marks a list the screen's help fills in). NULL past the end. The
 * line-by-line session lists and dispatches the same set (app/linechat.c). */
const char *chat_command_name(size_t i, const char **help);

/* /read FILE's checks, shared by both chats: FILE (a leading ~/ is $HOME) as text, malloc'd, NUL-
 * terminated, trailing newlines cut, its length in *len and its path in path. NULL with why
 * (*unreadable 1: it could not be opened; else larger than 1 MiB, binary — a NUL byte or not
 * UTF-8 —, or out of memory). */
char *chat_read_text(const char *arg, size_t *len, char *path, size_t path_cap, int *unreadable, char *why,
                     size_t why_cap);

/* /export [md|json] [FILE], shared by both chats: cs's current conversation as `kvchat export`
 * writes it (app/store_cli.c) to FILE (default ./kvchat-ID.md|json). 0 with msg saying what was
 * written, or -1 with msg saying why not (nothing saved yet, no store, a write error). */
struct chatstore;
int chat_export_conv(struct chatstore *cs, const char *args, char *msg, size_t cap);

/* The readline history file: $XDG_STATE_HOME/kvchat/history, else
 * ~/.local/state/kvchat/history. Returns 0, or -1 if neither variable is set. */
int chat_history_path(char *buf, size_t cap);

#endif
