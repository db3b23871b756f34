/* tokenizer_internal: the tokenizer struct and helpers shared by tokenizer.c, tokenizer_spm.c, tokenizer_bpe.c, tokenizer_utf8.c (not a public API). */
#ifndef KV_TOKENIZER_INTERNAL_H
#define KV_TOKENIZER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "kv_error.h"
#include "tokenizer.h"

/* tokenizer.ggml.token_type values (llama.cpp / gguf-py TokenType). */
enum {
    TOK_TYPE_UNDEFINED = 0,
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER_DEFINED = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6,
};

enum tok_kind { TOK_KIND_SPM = 1, TOK_KIND_BPE = 2 };

/* Per-token flags. */
enum {
    TOK_FLAG_EOG = 1,        /* ends generation */
    TOK_FLAG_MATCH_RAW = 2,  /* matched in text even when parse_special = 0 */
    TOK_FLAG_MATCH_SPECIAL = 4, /* matched in text when parse_special = 1 */
    TOK_FLAG_RSTRIP = 8,     /* whitespace right after a match in text is dropped (HF added-token rstrip) */
};

/* Growable id vector used by the encoders. */
typedef struct tok_vec {
    int32_t *v;
    size_t n, cap;
} tok_vec;

int tok_vec_push(tok_vec *v, int32_t x);   /* KV_OK or KV_ERR_NOMEM */

/* Special-token trie node (first-child / next-sibling). */
typedef struct tok_trie_node {
    int32_t child, sibling;  /* node indices, -1 = none */
    int32_t token;           /* token ending here, -1 = none */
    unsigned char byte;
} tok_trie_node;

struct bpe_state;            /* tokenizer_bpe.c */

struct tokenizer {
    int kind;                /* enum tok_kind */
    char *path;              /* for messages */
    int32_t n_vocab;

    char *text_arena;        /* every vocab string, NUL-terminated */
    uint32_t *text_len;      /* bytes, without the NUL */
    size_t *text_off;
    char *piece_arena;       /* decoded output bytes of each token (normal rendering) */
    uint32_t *piece_len;
    size_t *piece_off;
    size_t max_piece_len;

    float *scores;           /* n_vocab, zeros when absent */
    uint8_t *type;           /* TOK_TYPE_* */
    uint8_t *flags;          /* TOK_FLAG_* */

    int32_t *ht;             /* open-addressing hash: vocab string → id (-1 empty) */
    uint32_t ht_mask;

    int32_t bos, eos, unk, pad, eot, eom;
    int add_bos;
    int add_space_prefix;    /* SPM */
    int spm_word_split;      /* SPM: no normal piece has U+2581 after another character, so
                                merging can run word by word (see tokenizer_spm.c) */
    int unk_ok;              /* unk may be emitted for text (it exists and is not control/eog) */
    int32_t byte_tok[256];   /* SPM: <0xNN> token per byte; BPE: token of the byte's mapped char */

    tok_trie_node *trie;     /* special / user-defined tokens, matched in raw text */
    size_t trie_n, trie_cap;
    int32_t trie_root[256];

    struct bpe_state *bpe;   /* BPE merges and pre-tokenizer, NULL for SPM */
    char *warning;           /* NULL or malloc'd message */
};

/* Hash of a byte string (FNV-1a, 32 bit). */
uint32_t tok_hash(const char *s, size_t len);
/* Id of the vocab string s[0..len), or -1. */
int32_t tok_lookup(const tokenizer *t, const char *s, size_t len);

/* UTF-8 (tokenizer_utf8.c). Decode one character at s (n > 0 bytes available): returns its
 * length 1..4 and *cp, or length 1 and *cp = UTF8_INVALID for an ill-formed sequence
 * (overlongs, surrogates, > U+10FFFF and truncated sequences are ill-formed; RFC 3629). */
#define UTF8_INVALID 0xFFFFFFFFu
size_t utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);
/* Encode cp (<= 0x10FFFF) into out; returns 1..4. */
size_t utf8_encode(uint32_t cp, char *out);
/* Length of the maximal prefix of s[0..n) that could begin a well-formed character: 0 when
 * s[0] cannot start one, k < need when the sequence is valid so far but n < need (truncated),
 * and sets *need to the full length of a character starting with s[0]. */
size_t utf8_valid_prefix(const unsigned char *s, size_t n, size_t *need);

/* SentencePiece BPE over one raw text fragment (tokenizer_spm.c); add_prefix: prepend U+2581. */
int spm_encode_fragment(const tokenizer *t, const char *text, size_t len, int add_prefix,
                        tok_vec *out, kv_error *err);

/* Byte-level BPE (tokenizer_bpe.c). bpe_load reads merges and picks the pre-tokenizer
 * (pre may be NULL); it may set t->warning. */
int bpe_load(tokenizer *t, const gguf_file *f, const char *pre, kv_error *err);
void bpe_free(struct bpe_state *b);
/* Map a byte to its GPT-2 printable code point, and back (-1 if cp is not one). */
uint32_t bpe_byte_to_cp(unsigned char b);
int bpe_cp_to_byte(uint32_t cp);
/* Encode one raw text fragment (no special tokens inside). */
int bpe_encode_fragment(const tokenizer *t, const char *text, size_t len, tok_vec *out, kv_error *err);

#endif
