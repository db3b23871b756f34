/* tokenizer: loads a GGUF vocabulary, finds special tokens in text, dispatches to the SPM / BPE encoders, renders pieces and streams UTF-8-safe output. */
#include "tokenizer_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOK_MAX_VOCAB (1 << 26)
#define TOK_MAX_TEXT ((size_t)256 << 20)

/* Vocab strings that end a turn when they are control / user-defined tokens: the end-of-turn
 * and end-of-text markers of the published chat formats (ChatML, Llama 3, Phi-3, Gemma,
 * DeepSeek, Command-R, Granite, EXAONE, SmolVLM, gpt-oss, GPT-2-style <|endoftext|>). */
static const char *const k_eog_texts[] = {
    "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|end_of_text|>", "<|EOT|>", "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
    "<|END_OF_TURN_TOKEN|>", "<|end_of_turn|>", "<end_of_utterance>", "<|endofturn|>",
    "<|return|>", "<|call|>", NULL,
};

int tok_vec_push(tok_vec *v, int32_t x)
{
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 64;
        int32_t *nv = realloc(v->v, nc * sizeof *nv);
        if (!nv) return KV_ERR_NOMEM;
        v->v = nv;
        v->cap = nc;
    }
    v->v[v->n++] = x;
    return KV_OK;
}

uint32_t tok_hash(const char *s, size_t len)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 16777619u;
    }
    return h;
}

int32_t tok_lookup(const tokenizer *t, const char *s, size_t len)
{
    uint32_t i = tok_hash(s, len) & t->ht_mask;
    for (;;) {
        int32_t id = t->ht[i];
        if (id < 0) return -1;
        if (t->text_len[id] == len && memcmp(t->text_arena + t->text_off[id], s, len) == 0) return id;
        i = (i + 1) & t->ht_mask;
    }
}

/* ---- loading ------------------------------------------------------------------------- */

/* A special token id key: absent → *out unchanged; -1 or 0xFFFFFFFF (the "no such token"
 * sentinels old converters wrote, e.g. llama2.c's padding id) → -1; any other value outside
 * [0, n_vocab) is a load error naming the key — a wrong BOS / EOS changes every output. */
static int get_id(const gguf_file *f, const char *path, const char *key, int32_t n_vocab, int32_t *out,
                  kv_error *err)
{
    int64_t v = -1;
    int rc = gguf_get_i64(f, key, 0, &v, err);
    if (rc || !gguf_find_kv(f, key)) return rc;
    if (v == -1 || v == (int64_t)UINT32_MAX) {
        *out = -1;
    } else if (v < 0 || v >= n_vocab) {
        return kv_error_set(err, KV_ERR_FORMAT, "%s: %s = %lld is outside the vocabulary (%d tokens, ids 0..%d)", path,
                            key, (long long)v, n_vocab, n_vocab - 1);
    } else {
        *out = (int32_t)v;
    }
    return KV_OK;
}

/* Optional array of elem_type with exactly n entries; *out NULL when absent. */
static int get_opt_arr(const gguf_file *f, const char *path, const char *key, int elem_type, int64_t n,
                       const gguf_kv **out, kv_error *err)
{
    *out = NULL;
    if (!gguf_find_kv(f, key)) return KV_OK;
    int rc = gguf_get_arr(f, key, elem_type, -1, out, err);
    if (rc) return rc;
    if ((int64_t)(*out)->arr_len != n)
        return kv_error_set(err, KV_ERR_FORMAT, "%s: %s has %llu entries, expected %lld", path, key,
                            (unsigned long long)(*out)->arr_len, (long long)n);
    return KV_OK;
}

/* The value of one hexadecimal digit, -1 for any other byte. */
static int hex_digit(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int trie_insert(tokenizer *t, const char *s, size_t len, int32_t id)
{
    if (t->trie_n + len > t->trie_cap) {   /* at most len new nodes */
        size_t nc = t->trie_cap ? t->trie_cap * 2 : 256;
        while (nc < t->trie_n + len) nc *= 2;
        tok_trie_node *nn = realloc(t->trie, nc * sizeof *nn);
        if (!nn) return KV_ERR_NOMEM;
        t->trie = nn;
        t->trie_cap = nc;
    }
    int32_t node = t->trie_root[(unsigned char)s[0]];
    if (node < 0) {
        node = (int32_t)t->trie_n++;
        t->trie[node] = (tok_trie_node){ -1, -1, -1, (unsigned char)s[0] };
        t->trie_root[(unsigned char)s[0]] = node;
    }
    for (size_t i = 1; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        int32_t ch = t->trie[node].child;
        while (ch >= 0 && t->trie[ch].byte != c) ch = t->trie[ch].sibling;
        if (ch < 0) {
            ch = (int32_t)t->trie_n++;
            t->trie[ch] = (tok_trie_node){ -1, t->trie[node].child, -1, c };
            t->trie[node].child = ch;
        }
        node = ch;
    }
    if (t->trie[node].token < 0) t->trie[node].token = id;
    return KV_OK;
}

/* SPM output bytes of a vocab string: U+2581 → ' ', "<0xNN>" byte tokens → the byte. */
static size_t spm_render(const tokenizer *t, int32_t id, const char *s, size_t len, char *dst)
{
    if (t->type[id] == TOK_TYPE_BYTE && len == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>') {
        int hi = hex_digit(s[3]), lo = hex_digit(s[4]);
        if (hi >= 0 && lo >= 0) {
            dst[0] = (char)(hi * 16 + lo);
            return 1;
        }
    }
    if (t->type[id] == TOK_TYPE_CONTROL || t->type[id] == TOK_TYPE_UNKNOWN) {
        memcpy(dst, s, len);
        return len;
    }
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        if (i + 3 <= len && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
            dst[n++] = ' ';
            i += 3;
        } else {
            dst[n++] = s[i++];
        }
    }
    return n;
}

/* BPE output bytes: each code point of the GPT-2 byte alphabet → its byte; other characters
 * (and user-defined / control tokens, which are raw text) are kept as they are. */
static size_t bpe_render(const tokenizer *t, int32_t id, const char *s, size_t len, char *dst)
{
    int ty = t->type[id];
    if (ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_UNKNOWN || ty == TOK_TYPE_USER_DEFINED) {
        memcpy(dst, s, len);
        return len;
    }
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t k = utf8_decode((const unsigned char *)s + i, len - i, &cp);
        int b = cp == UTF8_INVALID ? -1 : bpe_cp_to_byte(cp);
        if (b >= 0) {
            dst[n++] = (char)b;
        } else {
            memcpy(dst + n, s + i, k);
            n += k;
        }
        i += k;
    }
    return n;
}

static int is_eog_text(const char *s, size_t len)
{
    for (int i = 0; k_eog_texts[i]; i++) {
        if (strlen(k_eog_texts[i]) == len && memcmp(k_eog_texts[i], s, len) == 0) return 1;
    }
    return 0;
}

int tokenizer_load(const gguf_file *f, tokenizer **out, kv_error *err)
{
    if (!out) return kv_error_set(err, KV_ERR_INVALID, "tokenizer_load: NULL output pointer");
    *out = NULL;
    if (!f) return kv_error_set(err, KV_ERR_INVALID, "tokenizer_load: NULL gguf file");
    const char *path = f->path ? f->path : "(gguf)";
    char *model = NULL, *pre = NULL;
    tokenizer *t = NULL;
    int rc = gguf_get_str(f, "tokenizer.ggml.model", 1, &model, err);
    if (rc) goto fail;
    int kind;
    if (strcmp(model, "llama") == 0) {
        kind = TOK_KIND_SPM;
    } else if (strcmp(model, "gpt2") == 0) {
        kind = TOK_KIND_BPE;
    } else {
        rc = kv_error_set(err, KV_ERR_UNSUPPORTED,
                          "%s: tokenizer model '%s' (tokenizer.ggml.model) is not supported; "
                          "supported: 'llama' (SentencePiece) and 'gpt2' (byte-level BPE)",
                          path, model);
        goto fail;
    }
    if ((rc = gguf_get_str(f, "tokenizer.ggml.pre", 0, &pre, err))) goto fail;

    const gguf_kv *kv_tok, *kv_scores = NULL, *kv_types;
    if ((rc = gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_VT_STRING, -1, &kv_tok, err))) goto fail;
    if (kv_tok->arr_len == 0 || kv_tok->arr_len > TOK_MAX_VOCAB || !kv_tok->arr_strs) {
        rc = kv_error_set(err, KV_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %llu entries, expected 1 .. %d",
                          path, (unsigned long long)kv_tok->arr_len, TOK_MAX_VOCAB);
        goto fail;
    }
    int32_t n = (int32_t)kv_tok->arr_len;
    if (kind == TOK_KIND_SPM && !gguf_find_kv(f, "tokenizer.ggml.scores")) {
        rc = kv_error_set(err, KV_ERR_FORMAT,
                          "%s: missing required key 'tokenizer.ggml.scores' (a SentencePiece vocab needs its scores)", path);
        goto fail;
    }
    if ((rc = get_opt_arr(f, path, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, n, &kv_scores, err))) goto fail;
    if ((rc = get_opt_arr(f, path, "tokenizer.ggml.token_type", GGUF_VT_INT32, n, &kv_types, err))) goto fail;

    t = calloc(1, sizeof *t);
    if (!t) goto nomem;
    t->kind = kind;
    t->n_vocab = n;
    t->bos = t->eos = t->unk = t->pad = t->eot = t->eom = -1;
    memset(t->trie_root, 0xff, sizeof t->trie_root);
    for (int i = 0; i < 256; i++) t->byte_tok[i] = -1;
    t->path = strdup(path);
    t->text_len = malloc((size_t)n * sizeof *t->text_len);
    t->text_off = malloc((size_t)n * sizeof *t->text_off);
    t->piece_len = malloc((size_t)n * sizeof *t->piece_len);
    t->piece_off = malloc((size_t)n * sizeof *t->piece_off);
    t->scores = calloc((size_t)n, sizeof *t->scores);
    t->type = malloc((size_t)n);
    t->flags = calloc((size_t)n, 1);
    if (!t->path || !t->text_len || !t->text_off || !t->piece_len || !t->piece_off || !t->scores ||
        !t->type || !t->flags)
        goto nomem;

    /* strings */
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        uint64_t len = kv_tok->arr_strs[i].len;
        if (len > UINT32_MAX / 2) {
            rc = kv_error_set(err, KV_ERR_FORMAT, "%s: tokenizer.ggml.tokens[%d] is %llu bytes long", path, i,
                              (unsigned long long)len);
            goto fail;
        }
        total += (size_t)len + 1;
    }
    t->text_arena = malloc(total);
    if (!t->text_arena) goto nomem;
    size_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        const gguf_str *s = &kv_tok->arr_strs[i];
        memcpy(t->text_arena + off, s->ptr, (size_t)s->len);
        t->text_arena[off + s->len] = 0;
        t->text_off[i] = off;
        t->text_len[i] = (uint32_t)s->len;
        off += (size_t)s->len + 1;
    }

    /* scores and types */
    if (kv_scores) memcpy(t->scores, kv_scores->data, (size_t)n * sizeof(float));
    for (int32_t i = 0; kv_scores && i < n; i++)
        if (isnan(t->scores[i])) {
            rc = kv_error_set(err, KV_ERR_FORMAT, "%s: tokenizer.ggml.scores[%d] is NaN (token '%s')", path, i,
                              t->text_arena + t->text_off[i]);
            goto fail;
        }
    for (int32_t i = 0; i < n; i++) {
        int32_t ty = TOK_TYPE_NORMAL;
        if (kv_types) {
            memcpy(&ty, kv_types->data + 4 * (size_t)i, 4);
            if (ty < 0 || ty > TOK_TYPE_BYTE) {
                rc = kv_error_set(err, KV_ERR_FORMAT,
                                  "%s: tokenizer.ggml.token_type[%d] = %d is not a token type (0..6), token '%s'",
                                  path, i, ty, t->text_arena + t->text_off[i]);
                goto fail;
            }
            if (ty == TOK_TYPE_UNDEFINED) ty = TOK_TYPE_NORMAL;
        }
        t->type[i] = (uint8_t)ty;
    }

    /* hash table: vocab string → first id with that string */
    uint32_t cap = 1024;
    while (cap < (uint32_t)n * 2u) cap <<= 1;
    t->ht = malloc((size_t)cap * sizeof *t->ht);
    if (!t->ht) goto nomem;
    memset(t->ht, 0xff, (size_t)cap * sizeof *t->ht);
    t->ht_mask = cap - 1;
    for (int32_t i = 0; i < n; i++) {
        const char *s = t->text_arena + t->text_off[i];
        uint32_t h = tok_hash(s, t->text_len[i]) & t->ht_mask;
        for (;;) {
            int32_t id = t->ht[h];
            if (id < 0) {
                t->ht[h] = i;
                break;
            }
            if (t->text_len[id] == t->text_len[i] && memcmp(t->text_arena + t->text_off[id], s, t->text_len[i]) == 0) {
                /* Two ids with one text: text → id is ambiguous (llama.cpp refuses such a vocab
                 * too). Empty texts are exempt: they never match text and llama.cpp renames them. */
                if (t->text_len[i] == 0) break;
                rc = kv_error_set(err, KV_ERR_FORMAT,
                                  "%s: tokenizer.ggml.tokens[%d] '%s' repeats tokenizer.ggml.tokens[%d] (token texts "
                                  "must be unique)",
                                  path, i, s, id);
                goto fail;
            }
            h = (h + 1) & t->ht_mask;
        }
    }

    /* special ids and flags */
    if (kind == TOK_KIND_SPM) {
        /* SentencePiece defaults: <unk>=0, <s>=1, </s>=2 */
        t->unk = n > 0 ? 0 : -1;
        t->bos = n > 1 ? 1 : -1;
        t->eos = n > 2 ? 2 : -1;
        t->add_bos = 1;
        t->add_space_prefix = 1;
    }
    if ((rc = get_id(f, path, "tokenizer.ggml.bos_token_id", n, &t->bos, err)) ||
        (rc = get_id(f, path, "tokenizer.ggml.eos_token_id", n, &t->eos, err)) ||
        (rc = get_id(f, path, "tokenizer.ggml.unknown_token_id", n, &t->unk, err)) ||
        (rc = get_id(f, path, "tokenizer.ggml.padding_token_id", n, &t->pad, err)) ||
        (rc = get_id(f, path, "tokenizer.ggml.eot_token_id", n, &t->eot, err)) ||
        (rc = get_id(f, path, "tokenizer.ggml.eom_token_id", n, &t->eom, err)) ||
        (rc = gguf_get_bool(f, "tokenizer.ggml.add_bos_token", 0, &t->add_bos, err)) ||
        (rc = gguf_get_bool(f, "tokenizer.ggml.add_space_prefix", 0, &t->add_space_prefix, err)))
        goto fail;
    if (!kv_types) {
        /* No types stored: mark what we can recognize. */
        if (t->unk >= 0) t->type[t->unk] = TOK_TYPE_UNKNOWN;
        if (t->bos >= 0) t->type[t->bos] = TOK_TYPE_CONTROL;
        if (t->eos >= 0) t->type[t->eos] = TOK_TYPE_CONTROL;
        if (kind == TOK_KIND_SPM)
            for (int32_t i = 0; i < n; i++) {
                const char *s = t->text_arena + t->text_off[i];
                if (t->text_len[i] == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>')
                    t->type[i] = TOK_TYPE_BYTE;
            }
    }
    /* Phi-3's tokenizer.json gives its added tokens rstrip = true (except <unk>, <s> and
     * <|endoftext|>); GGUF has no field for it, so the model's name tells, as llama.cpp reads it
     * (general.name containing "phi-3" or "phi3", any case). */
    int phi3_rstrip = 0;
    {
        char *gname = NULL;
        kv_error ne = { 0 };
        if (gguf_get_str(f, "general.name", 0, &gname, &ne) == KV_OK && gname) {
            for (char *q = gname; *q; q++)
                if (*q >= 'A' && *q <= 'Z') *q = (char)(*q + 32);
            phi3_rstrip = strstr(gname, "phi-3") || strstr(gname, "phi3");
        }
        free(gname);
    }
    for (int32_t i = 0; i < n; i++) {
        int ty = t->type[i];
        const char *s = t->text_arena + t->text_off[i];
        size_t len = t->text_len[i];
        if (i == t->eos || i == t->eot || i == t->eom ||
            ((ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER_DEFINED) && is_eog_text(s, len)))
            t->flags[i] |= TOK_FLAG_EOG;
        if (len > 0 && (ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER_DEFINED)) {
            t->flags[i] |= TOK_FLAG_MATCH_SPECIAL;
            if (ty == TOK_TYPE_USER_DEFINED && !(t->flags[i] & TOK_FLAG_EOG) && i != t->bos && i != t->eos)
                t->flags[i] |= TOK_FLAG_MATCH_RAW;
            if ((rc = trie_insert(t, s, len, i))) goto fail;
            if (phi3_rstrip && !(len == 5 && !memcmp(s, "<unk>", 5)) && !(len == 3 && !memcmp(s, "<s>", 3)) &&
                !(len == 13 && !memcmp(s, "<|endoftext|>", 13)))
                t->flags[i] |= TOK_FLAG_RSTRIP;
        }
        if (kind == TOK_KIND_SPM && ty == TOK_TYPE_BYTE && len == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' &&
            s[5] == '>') {
            /* two hex digits exactly (strtoul alone would take "<0x-A>" or "<0x +>") */
            int hi = hex_digit(s[3]), lo = hex_digit(s[4]);
            if (hi >= 0 && lo >= 0 && t->byte_tok[hi * 16 + lo] < 0) t->byte_tok[hi * 16 + lo] = i;
        }
    }

    t->unk_ok = t->unk >= 0 && t->type[t->unk] != TOK_TYPE_CONTROL && !(t->flags[t->unk] & TOK_FLAG_EOG);
    if (kind == TOK_KIND_SPM) {
        t->spm_word_split = 1;
        for (int32_t i = 0; i < n && t->spm_word_split; i++) {
            if (t->type[i] != TOK_TYPE_NORMAL) continue;
            const char *s = t->text_arena + t->text_off[i];
            for (uint32_t k = 1; k + 3 <= t->text_len[i]; k++)
                if (memcmp(s + k, "\xe2\x96\x81", 3) == 0 && !(k >= 3 && memcmp(s + k - 3, "\xe2\x96\x81", 3) == 0)) {
                    t->spm_word_split = 0;
                    break;
                }
        }
    }
    if (kind == TOK_KIND_BPE && (rc = bpe_load(t, f, pre, err))) goto fail;

    /* rendered pieces (a rendering is never longer than the vocab string) */
    t->piece_arena = malloc(total);
    if (!t->piece_arena) goto nomem;
    off = 0;
    for (int32_t i = 0; i < n; i++) {
        const char *s = t->text_arena + t->text_off[i];
        size_t len = kind == TOK_KIND_SPM ? spm_render(t, i, s, t->text_len[i], t->piece_arena + off)
                                          : bpe_render(t, i, s, t->text_len[i], t->piece_arena + off);
        t->piece_off[i] = off;
        t->piece_len[i] = (uint32_t)len;
        if (len > t->max_piece_len) t->max_piece_len = len;
        off += len;
    }

    free(model);
    free(pre);
    *out = t;
    return KV_OK;

nomem:
    rc = kv_error_set(err, KV_ERR_NOMEM, "%s: out of memory while loading the tokenizer", path);
fail:
    free(model);
    free(pre);
    tokenizer_free(t);
    return rc;
}

void tokenizer_free(tokenizer *t)
{
    if (!t) return;
    bpe_free(t->bpe);
    free(t->path);
    free(t->text_arena);
    free(t->text_len);
    free(t->text_off);
    free(t->piece_arena);
    free(t->piece_len);
    free(t->piece_off);
    free(t->scores);
    free(t->type);
    free(t->flags);
    free(t->ht);
    free(t->trie);
    free(t->warning);
    free(t);
}

/* ---- small accessors ----------------------------------------------------------------- */

const char *tokenizer_warning(const tokenizer *t) { return t ? t->warning : NULL; }
int32_t tokenizer_n_vocab(const tokenizer *t) { return t ? t->n_vocab : 0; }
int32_t tokenizer_bos(const tokenizer *t) { return t ? t->bos : -1; }
int32_t tokenizer_eos(const tokenizer *t) { return t ? t->eos : -1; }
int tokenizer_add_bos(const tokenizer *t) { return t ? t->add_bos : 0; }
size_t tokenizer_max_piece_len(const tokenizer *t) { return t ? t->max_piece_len : 0; }

int tokenizer_is_eog(const tokenizer *t, int32_t id)
{
    return t && id >= 0 && id < t->n_vocab && (t->flags[id] & TOK_FLAG_EOG);
}

int tokenizer_is_control(const tokenizer *t, int32_t id)
{
    return t && id >= 0 && id < t->n_vocab && t->type[id] == TOK_TYPE_CONTROL;
}

int32_t tokenizer_token_id(const tokenizer *t, const char *text, size_t len)
{
    if (!t || (!text && len)) return -1;
    return tok_lookup(t, text ? text : "", len);
}

const char *tokenizer_token_text(const tokenizer *t, int32_t id)
{
    if (!t || id < 0 || id >= t->n_vocab) return "";
    return t->text_arena + t->text_off[id];
}

size_t tokenizer_token_to_piece(const tokenizer *t, int32_t id, int render_special, char *buf, size_t cap)
{
    if (!t || id < 0 || id >= t->n_vocab) return 0;
    int ty = t->type[id];
    if (!render_special && (ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_UNKNOWN)) return 0;
    size_t len = t->piece_len[id];
    if (len <= cap && buf) memcpy(buf, t->piece_arena + t->piece_off[id], len);
    return len;
}

/* ---- encoding ------------------------------------------------------------------------ */

/* Longest special token starting at s (leftmost-longest, like HF's added-token matcher). */
static int32_t trie_match(const tokenizer *t, const char *s, size_t n, int flag_mask, size_t *mlen)
{
    int32_t node = t->trie_root[(unsigned char)s[0]];
    int32_t best = -1;
    size_t i = 1;
    while (node >= 0) {
        int32_t tok = t->trie[node].token;
        if (tok >= 0 && (t->flags[tok] & flag_mask)) {
            best = tok;
            *mlen = i;
        }
        if (i >= n) break;
        unsigned char c = (unsigned char)s[i];
        int32_t ch = t->trie[node].child;
        while (ch >= 0 && t->trie[ch].byte != c) ch = t->trie[ch].sibling;
        node = ch;
        i++;
    }
    return best;
}

static int encode_fragment(const tokenizer *t, const char *s, size_t len, int after_special, tok_vec *out,
                           kv_error *err)
{
    if (len == 0) return KV_OK;
    if (t->kind == TOK_KIND_SPM) return spm_encode_fragment(t, s, len, t->add_space_prefix && after_special, out, err);
    return bpe_encode_fragment(t, s, len, out, err);
}

int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int add_bos, int parse_special,
                     int32_t **tokens_out, size_t *n_out, kv_error *err)
{
    return tokenizer_encode_masked(t, text, len, add_bos, parse_special ? NULL : TOKENIZER_ALL_LITERAL, tokens_out,
                                   n_out, err);
}

/* sentinel: every byte literal (no per-byte array) */
const unsigned char tokenizer_all_literal_[1];

int tokenizer_encode_masked(const tokenizer *t, const char *text, size_t len, int add_bos, const unsigned char *literal,
                            int32_t **tokens_out, size_t *n_out, kv_error *err)
{
    if (!t || !tokens_out || !n_out || (!text && len))
        return kv_error_set(err, KV_ERR_INVALID, "tokenizer_encode: NULL argument");
    *tokens_out = NULL;
    *n_out = 0;
    if (len > TOK_MAX_TEXT)
        return kv_error_set(err, KV_ERR_INVALID, "%s: text to tokenize is %zu bytes, the limit is %zu", t->path, len,
                            TOK_MAX_TEXT);
    tok_vec out = { 0 };
    int rc = KV_OK;
    int all_literal = literal == TOKENIZER_ALL_LITERAL;
    if (add_bos && t->bos >= 0 && (rc = tok_vec_push(&out, t->bos))) goto nomem;
    size_t frag = 0, i = 0;
    size_t scaffold_end = 0; /* end of the run of non-literal bytes that contains i */
    int after_special = 1;
    while (i < len) {
        if (t->trie_root[(unsigned char)text[i]] >= 0) {
            size_t mlen = 0;
            int32_t tok = -1;
            int lit = all_literal || (literal && literal[i]);
            if (!lit) {
                /* control tokens only wholly inside the scaffolding */
                if (scaffold_end <= i) {
                    scaffold_end = i;
                    while (scaffold_end < len && !(literal && literal[scaffold_end])) scaffold_end++;
                }
                tok = trie_match(t, text + i, scaffold_end - i, TOK_FLAG_MATCH_SPECIAL, &mlen);
            }
            if (tok < 0) tok = trie_match(t, text + i, len - i, TOK_FLAG_MATCH_RAW, &mlen);
            if (tok >= 0) {
                if (i > frag) {
                    if ((rc = encode_fragment(t, text + frag, i - frag, after_special, &out, err))) goto fail;
                }
                if ((rc = tok_vec_push(&out, tok))) goto nomem;
                after_special = 1;
                i += mlen;
                if (t->flags[tok] & TOK_FLAG_RSTRIP)
                    while (i < len && (text[i] == ' ' || (text[i] >= '\t' && text[i] <= '\r'))) i++;
                frag = i;
                continue;
            }
        }
        i++;
    }
    if (frag < len && (rc = encode_fragment(t, text + frag, len - frag, after_special, &out, err))) goto fail;
    if (!out.v && !(out.v = malloc(sizeof *out.v))) goto nomem;
    *tokens_out = out.v;
    *n_out = out.n;
    return KV_OK;
nomem:
    rc = kv_error_set(err, KV_ERR_NOMEM, "%s: out of memory while tokenizing %zu bytes", t->path, len);
fail:
    free(out.v);
    return rc;
}

int tokenizer_encode_prompt(const tokenizer *t, const char *text, size_t len, int add_bos, const unsigned char *literal,
                            int32_t **tokens_out, size_t *n_out, kv_error *err)
{
    if (t && text && add_bos && t->bos >= 0 && literal != TOKENIZER_ALL_LITERAL) {
        const char *bt = tokenizer_token_text(t, t->bos);
        size_t bl = strlen(bt);
        int lead = bl && len >= bl && !memcmp(text, bt, bl);
        for (size_t i = 0; lead && literal && i < bl; i++) lead = !literal[i];
        if (lead) add_bos = 0;
    }
    return tokenizer_encode_masked(t, text, len, add_bos, literal, tokens_out, n_out, err);
}

/* ---- streaming detokenizer ----------------------------------------------------------- */

void detok_stream_init(detok_stream *s)
{
    memset(s, 0, sizeof *s);
}

/* Output cursor: once a character does not fit, nothing more is written (no gaps). */
typedef struct detok_out {
    char *buf;
    size_t cap, w;
    int full;
} detok_out;

static void emit(detok_out *o, const void *p, size_t n)
{
    if (o->full || o->w + n > o->cap) {
        o->full = 1;
        return;
    }
    memcpy(o->buf + o->w, p, n);
    o->w += n;
}

static const char k_fffd[3] = { (char)0xEF, (char)0xBF, (char)0xBD };

static void feed_byte(detok_stream *s, unsigned char b, detok_out *o)
{
    for (;;) {
        if (s->n_pending == 0) {
            size_t need;
            if (b < 0x80) {
                emit(o, &b, 1);
                return;
            }
            if (utf8_valid_prefix(&b, 1, &need) == 0) {
                emit(o, k_fffd, 3);
                return;
            }
            s->pending[0] = b;
            s->n_pending = 1;
            return;
        }
        unsigned char tmp[4];
        size_t np = (size_t)s->n_pending, need;
        memcpy(tmp, s->pending, np);
        tmp[np] = b;
        size_t ok = utf8_valid_prefix(tmp, np + 1, &need);
        if (ok == np + 1) {
            if (np + 1 == need) {
                emit(o, tmp, need);
                s->n_pending = 0;
            } else {
                s->pending[np] = b;
                s->n_pending++;
            }
            return;
        }
        /* the pending prefix cannot be completed: one U+FFFD for it, then b afresh */
        emit(o, k_fffd, 3);
        s->n_pending = 0;
    }
}

size_t detok_stream_push(detok_stream *s, const tokenizer *t, int32_t id, char *out, size_t cap)
{
    if (!s || !t || id < 0 || id >= t->n_vocab) return 0;
    int ty = t->type[id];
    if (ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_UNKNOWN) return 0;
    const unsigned char *p = (const unsigned char *)t->piece_arena + t->piece_off[id];
    size_t n = t->piece_len[id];
    detok_out o = { out, out ? cap : 0, 0, 0 };
    for (size_t i = 0; i < n; i++) feed_byte(s, p[i], &o);
    return o.w;
}

size_t detok_stream_flush(detok_stream *s, char *out, size_t cap)
{
    detok_out o = { out, out ? cap : 0, 0, 0 };
    if (s && s->n_pending) {
        emit(&o, k_fffd, 3);
        s->n_pending = 0;
    }
    return o.w;
}
