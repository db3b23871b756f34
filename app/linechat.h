/* linechat: the line-by-line session (TERM=dumb, or no terminal to draw on) — completion mode with the chat's slash commands, saved like the chat. */
#ifndef APP_LINECHAT_H
#define APP_LINECHAT_H

#include <signal.h>
#include <stdint.h>

#include "engine/generate.h"
#include "engine/sampler.h"

typedef struct linechat_options {
    int n_predict;               /* max tokens per reply, < 0: 256 (a line session never runs on) */
    int no_bos;
    int stats;                   /* --stats: a stats line after each reply */
    const char *db_path;         /* the conversation database; NULL: nothing is saved */
    uint64_t cache_bytes;        /* its KV prefix store budget */
    volatile sig_atomic_t *interrupted; /* set by SIGINT: stops a reply */
    const char *system;          /* --system (or the config's): the text starts with it and a blank line */
    const engine_params *ep;     /* the engine options /model loads another model with (NULL: no /model) */
    const struct kv_config *config; /* its [persona NAME] sections (/persona); NULL: none */
} linechat_options;

/* Run the session on standard input / output until end of input or /quit: each line is appended
 * to the running text, which the model continues (the KV cache keeps it, so each turn prefills
 * only its new tokens); an empty line lets it go on. Slash commands: the full screen's table
 * (chat_command_name; /help lists the same set in its words), each done here — /help, /set,
 * /show [params|cache], /clear, /regen, /undo, /edit TEXT, /system, /export, /persona, /model,
 * /read, /quit — or refused with the reason (/sessions, /branch, /theme, /copy need the full
 * screen); "//text" sends text starting with '/'. Each turn is saved (app/chatstore.h) as the
 * full-screen chat saves it (/regen and /edit as branches). stdout a pipe or file: it gets the
 * text only; banner, prompt and echo go to stderr. /model replaces *e and *s (the caller frees
 * what they are at the end). Returns an exit status (0, 1). */
int linechat_run(engine **e, sampler **s, const linechat_options *o);

#endif
