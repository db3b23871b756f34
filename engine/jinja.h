/* jinja: an interpreter of the Jinja2 subset that models' tokenizer.chat_template texts use, with the message-content bytes of its output marked. */
#ifndef KV_JINJA_H
#define KV_JINJA_H

#include <stddef.h>
#include <stdint.h>

#include "kv_error.h"

/*
 * Language: the Jinja2 template designer documentation (jinja.palletsprojects.com,
 * "Template Designer Documentation"), with the environment Hugging Face renders chat
 * templates in: trim_blocks and lstrip_blocks on, undefined values print as "" and have
 * undefined attributes, raise_exception(msg), tojson as json.dumps(ensure_ascii=False).
 * Where Jinja2 (Python) and the reference @huggingface/jinja (what Hugging Face's chat tools
 * run) print a value differently, we print as the reference does: true/false, none as "",
 * lists and dicts as JSON, 1.0 as "1.0"; == on lists and dicts is identity. Where the
 * reference has a plain bug we do what Python does (what the templates were written for):
 * strip/lstrip/rstrip(chars) strip those characters, title and capitalize lower the other
 * letters, % takes the divisor's sign, and filters/tests it lacks (reverse or first of a
 * string, map('filter'), reject, "is divisibleby 3") work.
 * Written from the documentation and by comparing outputs (tests/e2e/t_jinja.sh: the reference
 * and Python's Jinja2 as transformers runs it; tests/jinja/deviations.txt); no code of
 * any other implementation.
 *
 * Supported: {{ }}, {% %}, {# #}, "-" whitespace control; if/elif/else, for (with
 * loop.index/index0/revindex/revindex0/first/last/length/previtem/nextitem, an "if" filter,
 * else, tuple targets, break/continue), set (names, ns.attr, block set), macro (positional,
 * keyword and default arguments), filter blocks, generation blocks; literals, lists, tuples,
 * dicts, slicing, ~ + - * / // % **, comparisons, in / not in, and/or/not, a if c else b;
 * filters abs capitalize count d default first float indent int items join last length
 * list lower map reject rejectattr replace reverse round safe select selectattr sort string
 * title tojson trim unique upper; tests boolean callable defined divisibleby eq equalto even
 * false float ge gt in integer iterable le lower lt mapping ne none number odd sameas
 * sequence string true undefined upper; string methods strip lstrip rstrip split
 * startswith endswith replace upper lower title capitalize find count; dict methods get
 * items keys values; list append; functions range, namespace, dict, raise_exception and
 * strftime_now (when a clock is given).
 */

typedef struct jinja_template jinja_template;

/* Parse template text src[0..len) (UTF-8, need not be NUL-terminated).
 * Errors (KV_ERR_FORMAT): "chat template line N: <what>" for a syntax error (unclosed tag,
 * unknown statement, unexpected token, missing endif/endfor ...); KV_ERR_NOMEM.
 * Returns KV_OK and *out (free with jinja_free), or *out = NULL. */
int jinja_parse(const char *src, size_t len, jinja_template **out, kv_error *err);
void jinja_free(jinja_template *t);

/* Render with the variables of ctx_json (a JSON object, RFC 8259; its keys become template
 * variables). Every string inside ctx's "messages" array, except each message's "role", is
 * message content: its bytes, wherever they end up in the output (copied, sliced, stripped,
 * concatenated), are marked 1 in *mask (mask may be NULL when not wanted); every other byte
 * is 0. tojson of content marks the escaped text between the quotes.
 * now: the clock of strftime_now(fmt) (seconds since 1970, formatted in UTC; the reference
 * renderer defines it on the machine's clock), or < 0 to leave strftime_now undefined.
 * On success *out is malloc'd, NUL-terminated, *out_len bytes; *mask malloc'd *out_len
 * bytes. Errors (*out = NULL): KV_ERR_FORMAT "chat template line N: <what>" for a run-time
 * error (unknown filter, a call of something not callable, raise_exception("msg") gives
 * "chat template line N: raise_exception: msg"), or for ctx_json not a JSON object;
 * KV_ERR_NOMEM, also when a render uses over 256 MiB or nests macros 200 deep. */
int jinja_render(const jinja_template *t, const char *ctx_json, size_t ctx_len, int64_t now, char **out,
                 size_t *out_len, unsigned char **mask, kv_error *err);

/* One chat message for jinja_render_chat: role and content[0..len) (UTF-8). */
typedef struct jinja_chat_msg {
    const char *role;
    const char *content;
    size_t len;
} jinja_chat_msg;

/* Render a conversation the way chat tools call a model's template: variables messages
 * ([{role, content}] from msgs[0..n)), add_generation_prompt, bos_token and eos_token (the
 * vocabulary's texts, NULL = ""). Output, mask and errors as jinja_render. */
int jinja_render_chat(const jinja_template *t, const jinja_chat_msg *msgs, size_t n, int add_generation_prompt,
                      const char *bos_token, const char *eos_token, int64_t now, char **out, size_t *out_len,
                      unsigned char **mask, kv_error *err);

/* Append s[0..len) to *buf as a JSON string literal (quotes included), for building ctx_json.
 * *buf is a malloc'd NUL-terminated string (NULL to start), *blen its length.
 * Returns 0, or -1 when out of memory (the buffer is kept). */
int jinja_json_append_str(char **buf, size_t *blen, const char *s, size_t len);

#endif
