/* tokenizer: text <-> token ids for GGUF vocabularies (SentencePiece-style "llama" BPE and byte-level "gpt2" BPE), plus UTF-8-safe streaming detokenization. */
#ifndef KV_TOKENIZER_H
#define KV_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "kv_error.h"

typedef struct tokenizer tokenizer;

/* Build a tokenizer from the GGUF metadata of `f` (the tokenizer copies everything it needs,
 * so `f` may be closed afterwards).
 * Keys read: tokenizer.ggml.model ("llama" = SentencePiece-style BPE with byte fallback,
 * "gpt2" = byte-level BPE; anything else → KV_ERR_UNSUPPORTED naming the file and the model),
 * tokenizer.ggml.pre (gpt2 only: selects the pre-tokenizer split rules), .tokens (required),
 * .scores (f32, required for "llama", optional for "gpt2"), .token_type (i32, optional:
 * 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte), .merges (required for
 * "gpt2", "left right" strings in rank order), .bos/.eos/.unknown/.padding/.eot/.eom_token_id
 * (-1 and 0xFFFFFFFF mean "none"; any other id outside [0, n_vocab) is KV_ERR_FORMAT naming
 * the key), .add_bos_token (default 1 for "llama",
 * 0 for "gpt2"), .add_space_prefix ("llama", default 1).
 * Errors: KV_ERR_FORMAT when a key has the wrong type or an array the wrong length
 * ("x.gguf: tokenizer.ggml.scores has 10 entries, expected 512"), a token type is out of range,
 * a merge has no space, a score is NaN, or two tokens have the same non-empty text (llama.cpp
 * refuses such a vocab too); KV_ERR_UNSUPPORTED for another tokenizer model or an unknown
 * tokenizer.ggml.pre (the message lists the known ones); KV_ERR_NOMEM. A gpt2 vocab with no
 * tokenizer.ggml.pre gets GPT-2 rules and tokenizer_warning() says so. Cost: O(n_vocab + n_merges) hashing (a 150k vocab loads in
 * tens of milliseconds). Returns KV_OK and *out on success, *out = NULL otherwise. */
int tokenizer_load(const gguf_file *f, tokenizer **out, kv_error *err);
void tokenizer_free(tokenizer *t);

/* A message the caller may show the user (e.g. a missing pre-tokenizer was replaced by the
 * GPT-2 rules), or NULL when there is nothing to say. Owned by the tokenizer. */
const char *tokenizer_warning(const tokenizer *t);

int32_t tokenizer_n_vocab(const tokenizer *t);
int32_t tokenizer_bos(const tokenizer *t);          /* -1 if none */
int32_t tokenizer_eos(const tokenizer *t);          /* -1 if none */
int tokenizer_add_bos(const tokenizer *t);          /* metadata add_bos_token (see load) */
/* 1 for end-of-generation ids: eos, eot, eom, and control / user-defined tokens whose text is
 * a known end-of-turn marker (<|im_end|>, <|eot_id|>, <|end|>, <end_of_turn>, <|endoftext|>,
 * <|EOT|>, <｜end▁of▁sentence｜>, <|END_OF_TURN_TOKEN|>, <|eom_id|>, <|end_of_text|> …). */
int tokenizer_is_eog(const tokenizer *t, int32_t id);
/* 1 if token_type says control (3). Out-of-range ids give 0. */
int tokenizer_is_control(const tokenizer *t, int32_t id);

/* Id of the token whose vocab string is exactly text[0..len), or -1. */
int32_t tokenizer_token_id(const tokenizer *t, const char *text, size_t len);

/* Encode UTF-8 text (len bytes, need not be NUL-terminated, may contain invalid UTF-8 or NUL
 * bytes: they are kept as byte tokens, never a crash).
 * add_bos: prepend tokenizer_bos() when it exists.
 * parse_special = 0: control tokens are never produced from text (a user typing "<s>" or
 *   "<|im_end|>" gets those characters as text). User-defined tokens (HF "added tokens" that
 *   are not special, e.g. GPT-NeoX's runs of spaces) are still matched, as the original
 *   tokenizers do, except those that end generation or are bos/eos.
 * parse_special = 1: exact occurrences of control and user-defined token strings (leftmost,
 *   longest first) become those tokens; the text between them is encoded normally (for SPM
 *   each such piece gets the space prefix, as llama.cpp does).
 * Algorithms: "llama" — SentencePiece BPE (Kudo & Richardson 2018): the text gets a leading
 *   U+2581 (add_space_prefix) and every ' ' becomes U+2581; starting from UTF-8 characters,
 *   repeatedly merge the adjacent pair whose concatenation is a normal vocab piece with the
 *   highest score (ties → leftmost); pieces left outside the vocab become <0xNN> byte tokens
 *   (or unk when the vocab has none). "gpt2" — GPT-2 byte-level BPE (Radford et al. 2019):
 *   the pre-tokenizer of tokenizer.ggml.pre splits the text (Hugging Face tokenizers'
 *   pre_tokenizer definition of that family: Split regexes run with PCRE2 UTF+UCP, Digits,
 *   Punctuation, ByteLevel), bytes map to printable code points, then merges apply lowest
 *   rank first (ties → leftmost). Both use a priority queue over a linked list:
 *   O(n log n) in the text length.
 * *tokens_out is malloc'd (caller frees; non-NULL even when *n_out == 0).
 * Errors: KV_ERR_INVALID (NULL arguments, text over 256 MiB), KV_ERR_NOMEM. */
int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int add_bos, int parse_special,
                     int32_t **tokens_out, size_t *n_out, kv_error *err);

/* tokenizer_encode over one text whose bytes are scaffolding or literal: literal[i] != 0 marks
 * byte i as text that must never become a control token (what a user typed or a model wrote);
 * a control / user-defined token string is matched only when it lies wholly in scaffolding
 * (literal bytes still match user-defined tokens, as parse_special = 0 does). The text is
 * tokenized as one sequence — the fragments between matched tokens run across the
 * scaffolding/literal boundaries — so with no control-token text in the literal bytes the
 * result equals tokenizer_encode(parse_special = 1) of the whole text (llama.cpp's tokens for
 * a rendered chat prompt). literal NULL: all scaffolding; TOKENIZER_ALL_LITERAL: all literal.
 * Errors as tokenizer_encode. */
extern const unsigned char tokenizer_all_literal_[1];
#define TOKENIZER_ALL_LITERAL (tokenizer_all_literal_)
int tokenizer_encode_masked(const tokenizer *t, const char *text, size_t len, int add_bos, const unsigned char *literal,
                            int32_t **tokens_out, size_t *n_out, kv_error *err);

/* A chat prompt: tokenizer_encode_masked, except that when add_bos is asked and the text
 * already starts with the BOS token's text in scaffolding (a template's "<s>" or
 * {{ bos_token }}), that text stands for the BOS: one BOS, never two (llama.cpp's chat path
 * strips the rendered one for the same reason). */
int tokenizer_encode_prompt(const tokenizer *t, const char *text, size_t len, int add_bos, const unsigned char *literal,
                            int32_t **tokens_out, size_t *n_out, kv_error *err);

/* Raw vocab string of a token (as stored in the GGUF), NUL-terminated; "" for an out-of-range
 * id. (A vocab string with an embedded NUL is cut there.) */
const char *tokenizer_token_text(const tokenizer *t, int32_t id);

/* Bytes the token stands for in output text, written to buf (not NUL-terminated):
 * SPM: U+2581 → ' ', <0xNN> byte tokens → that byte; BPE: the byte-to-unicode mapping
 * reversed (user-defined tokens are raw text); control and unknown tokens → "" unless
 * render_special (then their vocab text). Returns the piece's byte count; when it exceeds cap
 * nothing is written (like snprintf, call again with a bigger buffer). Out-of-range id → 0. */
size_t tokenizer_token_to_piece(const tokenizer *t, int32_t id, int render_special, char *buf, size_t cap);

/* Longest piece any token produces with render_special = 1 (bytes). */
size_t tokenizer_max_piece_len(const tokenizer *t);

/* Streaming detokenizer: feed tokens one at a time, get back only complete UTF-8 characters;
 * a character split over several byte tokens appears once, whole; invalid sequences become
 * U+FFFD (EF BF BD), one per maximal invalid subpart (Unicode §3.9 "best practice").
 * Control tokens produce nothing. pending holds at most 3 bytes of an unfinished character. */
typedef struct detok_stream { unsigned char pending[8]; int n_pending; } detok_stream;
void detok_stream_init(detok_stream *s);
/* Returns bytes written to out (never more than cap; from the first character that does not
 * fit, the rest of this piece is dropped, so the output never has holes). The
 * output is at most 3 * (3 + piece length) bytes (every byte invalid), at most 3 + piece
 * length when the piece is valid UTF-8: cap >= 64 + 3 * tokenizer_max_piece_len(t) is always
 * enough, cap >= 64 + tokenizer_max_piece_len(t) whenever no U+FFFD is produced. */
size_t detok_stream_push(detok_stream *s, const tokenizer *t, int32_t id, char *out, size_t cap);
/* End of stream: an unfinished character → one U+FFFD. Returns bytes written (0 or 3; cap >= 3). */
size_t detok_stream_flush(detok_stream *s, char *out, size_t cap);

#endif
