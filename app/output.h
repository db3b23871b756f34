/* output: what the one-shot mode writes to stdout — plain text with control bytes made harmless, or JSON lines (one object per token, then a final stats object). */
#ifndef KV_APP_OUTPUT_H
#define KV_APP_OUTPUT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/generate.h"

/* Plain text: the model's bytes as they are, except control bytes, which never reach the
 * terminal or pipe raw — C0 controls other than TAB, LF and CR become their Unicode control
 * pictures (ESC → U+241B "␛"), DEL becomes U+2421. So kvchat never writes an escape sequence. */
void out_plain(FILE *f, const char *text, size_t len);

/* A JSON string literal of len bytes: '"', '\\' and controls escaped (\n, \t, \u001b …),
 * valid UTF-8 copied, each byte of invalid UTF-8 (overlong forms, surrogates, > U+10FFFF,
 * stray or truncated sequences) written as \ufffd. */
void json_write_string(FILE *f, const char *s, size_t len);

/* A stream of JSON lines for one generation. Text of a token that ends inside a UTF-8
 * character is carried to the next token's object, so a character is never split. */
typedef struct json_out {
    FILE *f;
    char carry[4];
    size_t n_carry;
} json_out;

void json_out_init(json_out *j, FILE *f);
/* {"token": ID, "text": "..."}\n */
void json_out_token(json_out *j, int32_t token, const char *text, size_t len);
/* The final object: {"done": true, "finish": "eog"|"length"|"context"|"cancelled"|"error"|…,
 * "n_prompt": …, "n_reused": …, "n_prefilled": …, "n_generated": …, "ttft_ms": …,
 * "prefill_tps": …, "decode_tps": …, "itl_ms_mean": …, "itl_ms_max": …[, "error": "…"]}\n.
 * Any carried bytes are written first as a last {"token": -1, "text": …} object. st may be
 * NULL (an error before generation). */
void json_out_done(json_out *j, const gen_stats *st, int finish, const char *error);

/* Short stable name of a gen_finish value for JSON ("eog", "length", "context", "cancelled",
 * "error"). */
const char *json_finish_name(int finish);

#endif
