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
} linechat_options;

/* Run the session on standard input / output until end of input or /quit: each line is appended
 * to the running text, which the model continues (the KV cache keeps it, so each turn prefills
 * only its new tokens); an empty line lets it go on. Slash commands: /help, /set NAME VALUE
 * (the chat's parameters and ranges: chat_set_param), /show [params], /quit (/exit, /q);
 * "//text" sends text starting with '/'. Each turn is saved (app/chatstore.h) as a new
 * conversation's messages, as in the full-screen chat. stdout a pipe or file: it gets the text
 * only; banner, prompt and echo go to stderr. Returns an exit status (0, 1). */
int linechat_run(engine *e, sampler *s, const linechat_options *o);

#endif
