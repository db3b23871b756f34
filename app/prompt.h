/* prompt: turns a conversation into the model's prompt — plain text in completion mode, or a chat template cut into scaffolding and message contents. */
#ifndef APP_PROMPT_H
#define APP_PROMPT_H

#include <stddef.h>

#include "engine/worker.h"
#include "engine/jinja.h"

/* One message of the conversation: role "system" | "user" | "assistant", raw UTF-8 text. */
typedef struct prompt_msg {
    const char *role;
    const char *text;
    size_t len;
} prompt_msg;

/* The prompt as segments for worker_submit: text (owned here) and segments pointing into it. */
typedef struct prompt_buf {
    char *text;
    size_t len, cap;
    worker_segment *seg;
    size_t n_seg, cap_seg;
} prompt_buf;

/* Whether two texts are joined with a space in completion mode: the first ends and the
 * second starts with something other than whitespace. */
int prompt_needs_space(const char *prev, size_t prev_len, const char *next, size_t next_len);

/* Build the whole prompt of msgs[0..n) (a system message, if any, first) into *out (reset
 * first). tmpl CHAT_TMPL_NONE: completion mode — one plain-text segment: the system text and
 * a blank line, then the messages, a user message joined to the text before it with a space
 * when prompt_needs_space says so. Any other family: chat_template_render with the assistant
 * cue, where the template's own text (scaffolding) becomes parse_special = 1 segments and
 * every message content a parse_special = 0 segment, so nothing a user typed or a model wrote
 * becomes a control token (the contents are trimmed where the family trims them).
 * Returns 0, or -1 with a message in err (out of memory, a template error). */
int prompt_build(int tmpl, const prompt_msg *msgs, size_t n, prompt_buf *out, char *err, size_t err_cap);

/* Completion mode, appending to the conversation's tokens: only `next` (joined to `prev`,
 * the text before it, with a space when needed), as one segment. */
int prompt_build_append(const char *prev, size_t prev_len, const char *next, size_t next_len, prompt_buf *out);

void prompt_buf_free(prompt_buf *b);

/* The model's own tokenizer.chat_template, run by the Jinja interpreter (engine/jinja.h). */
typedef struct prompt_jinja prompt_jinja;

/* 1 if a --chat-template value names a template file (it contains '/' or ends in ".jinja")
 * rather than a built-in family. */
int prompt_is_template_file(const char *name);

/* Choose how the chat renders prompts. name (--chat-template NAME) wins: that family of the
 * shape table (chat_template.h), "none" completion mode; *pj stays NULL. A name that is a
 * template file (prompt_is_template_file) is read and run as the model's own would be (an
 * unreadable file: a notice, and the model's own is used). Without a name: no
 * template text → CHAT_TMPL_NONE; a text the interpreter parses and renders (a probe
 * conversation of a user, an assistant and a user turn) → CHAT_TMPL_JINJA with *pj set
 * (bos / eos: the vocabulary's BOS and EOS texts, NULL = none); otherwise the family the
 * shape table detects, with notice set to one line saying the template could not be run and
 * which family is used instead (CHAT_TMPL_UNKNOWN when none matches). notice is "" when there
 * is nothing to say. Never fails (out of memory falls back to the shape table, with a notice). */
int prompt_choose(const char *tmpl_text, const char *name, const char *bos, const char *eos, prompt_jinja **pj,
                  char *notice, size_t notice_cap);

/* prompt_build for CHAT_TMPL_JINJA: renders msgs (messages, add_generation_prompt = true,
 * bos_token, eos_token) and cuts the text into segments by the interpreter's content marks:
 * bytes that came from message contents → parse_special = 0, the template's own → 1.
 * A render error (e.g. the template's raise_exception for a system message) falls back to
 * the shape-table family detected from the same text, when there is one: returns 0 and, the
 * first time only, a one-line notice in err. Otherwise -1 with the error in err. */
int prompt_build_jinja(prompt_jinja *pj, const prompt_msg *msgs, size_t n, prompt_buf *out, char *err, size_t err_cap);

/* Fix the clock strftime_now() sees (seconds since 1970, UTC), for reproducible renderings;
 * by default it is the time of each render. */
void prompt_jinja_set_clock(prompt_jinja *pj, int64_t now);

void prompt_jinja_free(prompt_jinja *pj);

#endif
