/* prompt: turns a conversation into the model's prompt — plain text in completion mode, or a chat template cut into scaffolding and message contents. */
#ifndef APP_PROMPT_H
#define APP_PROMPT_H

#include <stddef.h>

#include "engine/worker.h"

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

#endif
