/* output: what the one-shot mode writes to stdout — plain text with control bytes made harmless, or JSON lines (one object per token, then a final stats object). */
#ifndef KV_APP_OUTPUT_H
#define KV_APP_OUTPUT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/generate.h"
#include "engine/logprob.h"

/* Plain text: the model's (or a stored message's) text with every control character
 * neutralised by the rule the chat screen uses (ui_neutralize, ui/text.h): C0 controls other
 * than TAB and LF → their Unicode control pictures (ESC → U+241B "␛", CR → "␍" unless it ends a
 * CR LF), DEL → U+2421, C1 controls (U+009B, the 8-bit CSI …) and invalid UTF-8 → U+FFFD. So
 * kvchat never writes an escape sequence. */
void out_plain(FILE *f, const char *text, size_t len);

/* out_plain for text that arrives in pieces (a reply, token by token): a CR at the end of a
 * piece waits for the next, so a CR LF split between two tokens is still one line break. */
typedef struct plain_out {
    FILE *f;
    int cr; /* a CR held back */
} plain_out;
void plain_out_write(plain_out *p, const char *text, size_t len);
void plain_out_flush(plain_out *p); /* the held CR, if any, as ␍ */

/* A JSON string literal of len bytes: '"', '\\' and controls — C0, DEL and C1 — escaped
 * (\n, \t, \u001b, \u009b …; a NUL byte as \u0000, so nothing is cut there),
 * valid UTF-8 copied, each byte of invalid UTF-8 (overlong forms, surrogates, > U+10FFFF,
 * stray or truncated sequences) written as \ufffd. */
void json_write_string(FILE *f, const char *s, size_t len);

/* A stream of JSON lines for one generation. Text of a token that ends inside a UTF-8
 * character is carried to the next token's object, so a character is never split. */
typedef struct json_out {
    FILE *f;
    char carry[4];
    size_t n_carry;
    int has_seed;   /* json_out_set_seed was called */
    int top_logprobs; /* --top-logprobs K: lines carry "top_logprobs" (an empty list when K is 0 and none given) */
    uint64_t seed;
} json_out;

void json_out_init(json_out *j, FILE *f);
/* The sampler seed the generation used (sampler_seed: the random one picked when none was
 * given), reported by json_out_done as "seed": "N" — a string, as JSON numbers lose 64-bit
 * precision — so the run can be repeated with --seed N. */
void json_out_set_seed(json_out *j, uint64_t seed);
/* {"token": ID, "text": "..."}\n */
void json_out_token(json_out *j, int32_t token, const char *text, size_t len);
/* The same with [, "eog": true] (an end-of-generation token) and, when lp is given,
 * "logprob": L (natural log, of the raw model's softmax: before penalties and temperature) and,
 * when lp->n_top > 0, "top_logprobs": [{"token": ID, "text": PIECE, "logprob": L}, ...] most
 * likely first (PIECE: the token's own text from tk, U+FFFD for a partial character). */
void json_out_token_lp(json_out *j, int32_t token, const char *text, size_t len, const token_logprob *lp, int eog,
                       const tokenizer *tk);
/* The final object: {"done": true, "finish": "eog"|"length"|"context"|"cancelled"|"error"|…,
 * "n_prompt": …, "n_reused": …, "n_prefilled": …, "n_generated": …, "ttft_ms": …,
 * "prefill_tps": …, "decode_tps": …, "itl_ms_mean": …, "itl_ms_max": …[, "n_drafted": …, "n_accepted": …,
 * "n_verify": … (speculative decoding)][, "seed": "N"][, "error": "…"]}\n.
 * Any carried bytes are written first as a last {"token": -1, "text": …} object. st may be
 * NULL (an error before generation). */
void json_out_done(json_out *j, const gen_stats *st, int finish, const char *error);

/* Short stable name of a gen_finish value for JSON ("eog", "length", "context", "cancelled",
 * "error"). */
const char *json_finish_name(int finish);

#endif
