/* tokenizer_bpe: byte-level BPE ("gpt2" vocabularies): merge ranks, per-family pre-tokenizers (PCRE2), GPT-2 byte alphabet, rank-driven merges. */
#include "tokenizer_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* ---- GPT-2 byte alphabet -------------------------------------------------------------
 * Source: GPT-2 encoder.py bytes_to_unicode(): the printable bytes '!'..'~', '¡'..'¬',
 * '®'..'ÿ' stand for themselves; the other 68 bytes (0..32, 127..160, 173), in increasing
 * order, become U+0100, U+0101, … so that every byte is a visible character. */
static int byte_is_printable(unsigned b)
{
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

uint32_t bpe_byte_to_cp(unsigned char b)
{
    if (byte_is_printable(b)) return b;
    if (b <= 32) return 256u + b;
    if (b <= 160) return 256u + 33u + (b - 127u);
    return 256u + 67u; /* 173 */
}

int bpe_cp_to_byte(uint32_t cp)
{
    if (cp < 256) return byte_is_printable(cp) ? (int)cp : -1;
    if (cp < 256 + 33) return (int)(cp - 256);
    if (cp < 256 + 67) return (int)(cp - 256 - 33 + 127);
    if (cp == 256 + 67) return 173;
    return -1;
}

/* ---- pre-tokenizers ------------------------------------------------------------------
 * Each family's pre_tokenizer as published in its Hugging Face tokenizer.json, written as a
 * sequence of steps applied to every piece produced so far:
 *   SPLIT re   — HF Split(Regex re, behavior Isolated): matches and the gaps between them
 *                become separate pieces (HF Digits = \p{N} / \p{N}+, HF Punctuation
 *                (Contiguous) = runs of Unicode P or ASCII punctuation, are the same thing);
 *   BYTELEVEL  — HF ByteLevel(use_regex=false): map every byte to the GPT-2 alphabet
 *                (ByteLevel(use_regex=true) is SPLIT RE_GPT2 followed by BYTELEVEL).
 * Steps after BYTELEVEL see the mapped text, exactly as in HF (it matters for Falcon, whose
 * Digits step then also isolates the mapped bytes ² ³ ¹ ¼ ½ ¾). Regexes run with PCRE2 in
 * UTF + UCP mode, so \s \p{L} \p{N} follow Unicode like HF's Oniguruma. */
enum { STEP_END = 0, STEP_SPLIT = 1, STEP_BYTELEVEL = 2 };
#define MAX_STEPS 8

typedef struct pre_step {
    int kind;
    const char *re;
} pre_step;

typedef struct pre_def {
    const char *names;       /* tokenizer.ggml.pre values, '|'-separated */
    int ignore_merges;       /* HF BPE ignore_merges: a piece already in the vocab is one token */
    pre_step steps[MAX_STEPS];
} pre_def;

/* GPT-2 (openai/gpt-2 encoder.py; HF ByteLevel use_regex=true) */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
/* cl100k_base (tiktoken), used by Llama 3, DBRX, GLM-4 … */
#define RE_CL100K "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Qwen2: cl100k with single digits */
#define RE_QWEN2 "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* o200k_base (tiktoken), GPT-4o / Llama 4 */
#define RE_O200K "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Mistral Tekken */
#define RE_TEKKEN "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* HF Digits(individual_digits) and Punctuation (Rust char::is_ascii_punctuation || is_punctuation) */
#define RE_DIGIT "\\p{N}"
#define RE_DIGITS "\\p{N}+"
#define RE_PUNCT "[\\p{P}!-/:-@\\[-`{-~]+"
/* DeepSeek LLM / Coder (deepseek-ai tokenizer.json Split patterns) */
#define RE_DS_NEWLINE "[\\r\\n]"
#define RE_DS_LETTERS                                                                                    \
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}"  \
    "\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}" \
    "\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}"         \
    "\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}"     \
    "\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}"     \
    "\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}"                \
    "\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}"              \
    "\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}"     \
    "\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}"       \
    "\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}"                \
    "\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}"                \
    "\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}"      \
    "\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}"     \
    "\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}"                    \
    "\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}"                \
    "\\x{1E900}-\\x{1E943}]+"
#define RE_DS_PUNCT "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+"
#define RE_DS_TRAIL_WS "\\s+$"
#define RE_DS_CJK "[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"

/* DeepSeek V3 / R1 */
#define RE_DS3_CJK "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+"
#define RE_DS3_WORDS                                                                                        \
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|" \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

#define SPLIT(re) { STEP_SPLIT, re }
#define BYTELEVEL { STEP_BYTELEVEL, NULL }

static const pre_def k_pre[] = {
    { "gpt-2|default|mpt|olmo|phi-2|roberta-bpe|gpt-neox", 0, { SPLIT(RE_GPT2), BYTELEVEL } },
    { "starcoder|refact|smollm|command-r", 0, { SPLIT(RE_DIGIT), SPLIT(RE_GPT2), BYTELEVEL } },
    { "falcon", 0, { SPLIT(RE_PUNCT), SPLIT(RE_GPT2), BYTELEVEL, SPLIT(RE_DIGITS), SPLIT("[0-9][0-9][0-9]") } },
    { "llama3|llama-bpe|llama-v3", 1, { SPLIT(RE_CL100K), BYTELEVEL } },
    { "dbrx|smaug-bpe|chatglm-bpe", 0, { SPLIT(RE_CL100K), BYTELEVEL } },
    { "qwen2|deepseek-r1-qwen|stablelm2|megrez", 0, { SPLIT(RE_QWEN2), BYTELEVEL } },
    { "gpt-4o|llama4", 0, { SPLIT(RE_O200K), BYTELEVEL } },
    { "tekken", 0, { SPLIT(RE_TEKKEN), BYTELEVEL } },
    { "deepseek-llm", 0,
      { SPLIT(RE_DS_NEWLINE), SPLIT(RE_DS_LETTERS), SPLIT(RE_DS_PUNCT), SPLIT(RE_DS_TRAIL_WS), SPLIT(RE_DS_CJK),
        SPLIT(RE_DIGITS), BYTELEVEL } },
    { "deepseek-v3", 0, { SPLIT("\\p{N}{1,3}"), SPLIT(RE_DS3_CJK), SPLIT(RE_DS3_WORDS), BYTELEVEL } },
    { "deepseek-coder", 0,
      { SPLIT(RE_DS_NEWLINE), SPLIT("\\s?\\p{L}+"), SPLIT("\\s?\\p{P}+"), SPLIT(RE_DS_CJK), SPLIT(RE_DIGIT),
        BYTELEVEL } },
};

static int name_in_list(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, '|');
        size_t k = e ? (size_t)(e - p) : strlen(p);
        if (k == n && memcmp(p, name, n) == 0) return 1;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

/* ---- merges -------------------------------------------------------------------------- */

typedef struct merge_slot {
    uint64_t key;            /* (left id << 32) | right id */
    int32_t rank;            /* -1 = empty slot */
    int32_t result;          /* id of the merged token */
} merge_slot;

struct bpe_state {
    merge_slot *mt;
    uint64_t mt_mask;
    int ignore_merges;
    int n_steps;
    int step_kind[MAX_STEPS];
    pcre2_code *re[MAX_STEPS];
};

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static const merge_slot *merge_find(const struct bpe_state *b, int32_t l, int32_t r)
{
    uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
    uint64_t i = mix64(key) & b->mt_mask;
    for (;;) {
        const merge_slot *s = &b->mt[i];
        if (s->rank < 0) return NULL;
        if (s->key == key) return s;
        i = (i + 1) & b->mt_mask;
    }
}

void bpe_free(struct bpe_state *b)
{
    if (!b) return;
    for (int i = 0; i < b->n_steps; i++)
        if (b->re[i]) pcre2_code_free(b->re[i]);
    free(b->mt);
    free(b);
}

static int set_warning(tokenizer *t, const char *fmt, const char *a, const char *b)
{
    char buf[512];
    snprintf(buf, sizeof buf, fmt, a, b);
    free(t->warning);
    t->warning = strdup(buf);
    return t->warning ? KV_OK : KV_ERR_NOMEM;
}

int bpe_load(tokenizer *t, const gguf_file *f, const char *pre, kv_error *err)
{
    int rc;
    const gguf_kv *kv;
    if ((rc = gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_VT_STRING, -1, &kv, err))) return rc;
    struct bpe_state *b = calloc(1, sizeof *b);
    if (!b) return kv_error_set(err, KV_ERR_NOMEM, "%s: out of memory loading merges", t->path);
    t->bpe = b;

    /* pre-tokenizer */
    const pre_def *def = &k_pre[0];
    if (!pre) {
        if ((rc = set_warning(t, "%s: no tokenizer.ggml.pre in the file; using the GPT-2 pre-tokenizer%s", t->path,
                              " (tokenization may differ from the original model)")))
            goto nomem;
    } else {
        size_t i;
        for (i = 0; i < sizeof k_pre / sizeof k_pre[0]; i++)
            if (name_in_list(k_pre[i].names, pre)) break;
        if (i < sizeof k_pre / sizeof k_pre[0]) {
            def = &k_pre[i];
        } else {
            /* Guessing rules would feed the model token sequences it never saw: an error
             * (llama.cpp refuses an unknown pre too). The message lists the known names. */
            char known[1024];
            size_t k = 0;
            for (i = 0; i < sizeof k_pre / sizeof k_pre[0]; i++)
                for (const char *p = k_pre[i].names; *p; p++) {
                    if (k + 3 >= sizeof known) break;
                    if (p == k_pre[i].names && i > 0) known[k++] = '|';
                    known[k++] = *p;
                }
            known[k] = 0;
            for (char *p = known; (p = strchr(p, '|'));) *p = ' '; /* "gpt-2 default mpt ..." */
            return kv_error_set(err, KV_ERR_UNSUPPORTED,
                                "%s: unknown pre-tokenizer '%s' (tokenizer.ggml.pre); known: %s", t->path, pre, known);
        }
    }
    b->ignore_merges = def->ignore_merges;
    for (int i = 0; i < MAX_STEPS && def->steps[i].kind != STEP_END; i++) {
        b->step_kind[i] = def->steps[i].kind;
        b->n_steps = i + 1;
        if (def->steps[i].kind != STEP_SPLIT) continue;
        int ecode;
        PCRE2_SIZE eoff;
        b->re[i] = pcre2_compile((PCRE2_SPTR)def->steps[i].re, PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &ecode, &eoff, NULL);
        if (!b->re[i]) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(ecode, msg, sizeof msg);
            return kv_error_set(err, KV_ERR_UNSUPPORTED, "%s: pre-tokenizer regex %d for '%s' does not compile: %s",
                                t->path, i, pre ? pre : "gpt-2", (const char *)msg);
        }
        pcre2_jit_compile(b->re[i], PCRE2_JIT_COMPLETE); /* optional: the interpreter is the fallback */
    }

    /* byte alphabet → token ids */
    for (int c = 0; c < 256; c++) {
        char u[4];
        size_t k = utf8_encode(bpe_byte_to_cp((unsigned char)c), u);
        t->byte_tok[c] = tok_lookup(t, u, k);
    }

    /* merges: "left right" in rank order */
    uint64_t nm = kv->arr_len, cap = 1024;
    while (cap < nm * 2) cap <<= 1;
    b->mt = malloc(cap * sizeof *b->mt);
    if (!b->mt) goto nomem;
    for (uint64_t i = 0; i < cap; i++) b->mt[i].rank = -1;
    b->mt_mask = cap - 1;
    char *cat = NULL;
    size_t cat_cap = 0;
    for (uint64_t r = 0; r < nm && r < INT32_MAX; r++) {
        const char *s = kv->arr_strs[r].ptr;
        size_t len = (size_t)kv->arr_strs[r].len;
        const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
        if (!sp) {
            free(cat);
            return kv_error_set(err, KV_ERR_FORMAT, "%s: tokenizer.ggml.merges[%llu] '%.*s' has no space between its two parts",
                                t->path, (unsigned long long)r, (int)(len > 64 ? 64 : len), s);
        }
        size_t la = (size_t)(sp - s), lb = len - la - 1;
        int32_t ia = tok_lookup(t, s, la), ib = tok_lookup(t, sp + 1, lb);
        if (ia < 0 || ib < 0) continue;      /* a part outside the vocab: the merge can never apply */
        if (la + lb > cat_cap) {
            cat_cap = (la + lb) * 2;
            char *nc = realloc(cat, cat_cap);
            if (!nc) {
                free(cat);
                goto nomem;
            }
            cat = nc;
        }
        memcpy(cat, s, la);
        memcpy(cat + la, sp + 1, lb);
        int32_t im = tok_lookup(t, cat, la + lb);
        if (im < 0) continue;
        uint64_t key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
        uint64_t h = mix64(key) & b->mt_mask;
        while (b->mt[h].rank >= 0 && b->mt[h].key != key) h = (h + 1) & b->mt_mask;
        if (b->mt[h].rank < 0) b->mt[h] = (merge_slot){ key, (int32_t)r, im }; /* first rank wins */
    }
    free(cat);
    return KV_OK;
nomem:
    return kv_error_set(err, KV_ERR_NOMEM, "%s: out of memory loading the BPE tokenizer", t->path);
}

/* ---- encoding ------------------------------------------------------------------------ */

typedef struct span {
    size_t off, len;
} span;

typedef struct span_vec {
    span *v;
    size_t n, cap;
} span_vec;

static int span_push(span_vec *s, size_t off, size_t len)
{
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 64;
        span *nv = realloc(s->v, nc * sizeof *nv);
        if (!nv) return KV_ERR_NOMEM;
        s->v = nv;
        s->cap = nc;
    }
    s->v[s->n++] = (span){ off, len };
    return KV_OK;
}

/* HF Split(behavior Isolated) of every piece of `in` into `out`. A matcher error (e.g. the JIT
 * stack running out) keeps the rest of that piece whole rather than failing the encode. */
static int split_pieces(const pcre2_code *re, pcre2_match_data *md, const char *buf, const span_vec *in,
                        span_vec *out)
{
    out->n = 0;
    for (size_t p = 0; p < in->n; p++) {
        const char *subj = buf + in->v[p].off;
        size_t L = in->v[p].len, start = 0, prev = 0;
        while (start < L) {
            int rc = pcre2_match(re, (PCRE2_SPTR)subj, L, start, 0, md, NULL);
            if (rc < 0) break;
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t ms = ov[0], me = ov[1];
            if (me <= ms) { /* empty match: step over one character */
                uint32_t cp;
                start = ms + utf8_decode((const unsigned char *)subj + ms, L - ms, &cp);
                continue;
            }
            if (ms > prev && span_push(out, in->v[p].off + prev, ms - prev)) return KV_ERR_NOMEM;
            if (span_push(out, in->v[p].off + ms, me - ms)) return KV_ERR_NOMEM;
            prev = start = me;
        }
        if (prev < L && span_push(out, in->v[p].off + prev, L - prev)) return KV_ERR_NOMEM;
    }
    return KV_OK;
}

/* Scratch for the merge loop of one word. */
typedef struct bpe_sym {
    int32_t id, prev, next;
} bpe_sym;

typedef struct bpe_pair {
    int32_t rank, left, right, lid, rid, result;
} bpe_pair;

typedef struct bpe_scratch {
    bpe_sym *sym;
    size_t sym_cap;
    bpe_pair *heap;
    size_t heap_n, heap_cap;
} bpe_scratch;

/* Lowest rank first; ties → leftmost (HF tokenizers word.rs merge_all). */
static int bp_before(const bpe_pair *a, const bpe_pair *b)
{
    if (a->rank != b->rank) return a->rank < b->rank;
    return a->left < b->left;
}

static int bheap_push(bpe_scratch *s, bpe_pair p)
{
    if (s->heap_n == s->heap_cap) {
        size_t nc = s->heap_cap ? s->heap_cap * 2 : 64;
        bpe_pair *nv = realloc(s->heap, nc * sizeof *nv);
        if (!nv) return KV_ERR_NOMEM;
        s->heap = nv;
        s->heap_cap = nc;
    }
    size_t i = s->heap_n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!bp_before(&p, &s->heap[parent])) break;
        s->heap[i] = s->heap[parent];
        i = parent;
    }
    s->heap[i] = p;
    return KV_OK;
}

static bpe_pair bheap_pop(bpe_scratch *s)
{
    bpe_pair top = s->heap[0], last = s->heap[--s->heap_n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= s->heap_n) break;
        if (c + 1 < s->heap_n && bp_before(&s->heap[c + 1], &s->heap[c])) c++;
        if (!bp_before(&s->heap[c], &last)) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (s->heap_n) s->heap[i] = last;
    return top;
}

static int try_merge(const struct bpe_state *b, bpe_scratch *s, int32_t l, int32_t r)
{
    if (l < 0 || r < 0) return KV_OK;
    int32_t lid = s->sym[l].id, rid = s->sym[r].id;
    if (lid < 0 || rid < 0) return KV_OK;
    const merge_slot *m = merge_find(b, lid, rid);
    if (!m) return KV_OK;
    return bheap_push(s, (bpe_pair){ m->rank, l, r, lid, rid, m->result });
}

/* A character outside the vocab becomes unk, or nothing when unk is missing or is a control
 * / end-of-generation token (GPT-NeoX uses <|endoftext|>: text must never produce it). */
static int emit_id(const tokenizer *t, int32_t id, tok_vec *out)
{
    if (id >= 0) return tok_vec_push(out, id);
    return t->unk_ok ? tok_vec_push(out, t->unk) : KV_OK;
}

/* BPE of one pre-tokenized piece in the byte alphabet (w[0..n), UTF-8). */
static int bpe_word(const tokenizer *t, const char *w, size_t n, bpe_scratch *s, tok_vec *out)
{
    const struct bpe_state *b = t->bpe;
    if (b->ignore_merges) {
        int32_t id = tok_lookup(t, w, n);
        if (id >= 0) return tok_vec_push(out, id);
    }
    if (n > s->sym_cap) {
        bpe_sym *ns = realloc(s->sym, n * sizeof *ns);
        if (!ns) return KV_ERR_NOMEM;
        s->sym = ns;
        s->sym_cap = n;
    }
    int32_t count = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = utf8_decode((const unsigned char *)w + i, n - i, &cp);
        int byte = cp == UTF8_INVALID ? -1 : bpe_cp_to_byte(cp);
        int32_t id = byte >= 0 ? t->byte_tok[byte] : tok_lookup(t, w + i, k);
        s->sym[count] = (bpe_sym){ id, count - 1, count + 1 };
        count++;
        i += k;
    }
    if (count == 0) return KV_OK;
    s->sym[count - 1].next = -1;
    if (count == 1) return emit_id(t, s->sym[0].id, out);
    s->heap_n = 0;
    int rc;
    for (int32_t i = 0; i + 1 < count; i++)
        if ((rc = try_merge(b, s, i, i + 1))) return rc;
    while (s->heap_n) {
        bpe_pair p = bheap_pop(s);
        bpe_sym *L = &s->sym[p.left], *R = &s->sym[p.right];
        if (L->next != p.right || L->id != p.lid || R->id != p.rid) continue; /* stale */
        L->id = p.result;
        L->next = R->next;
        if (R->next >= 0) s->sym[R->next].prev = p.left;
        R->id = -2;
        R->prev = R->next = -1;
        if ((rc = try_merge(b, s, L->prev, p.left)) || (rc = try_merge(b, s, p.left, L->next))) return rc;
    }
    for (int32_t i = 0; i >= 0; i = s->sym[i].next)
        if ((rc = emit_id(t, s->sym[i].id, out))) return rc;
    return KV_OK;
}

int bpe_encode_fragment(const tokenizer *t, const char *text, size_t len, tok_vec *out, kv_error *err)
{
    const struct bpe_state *b = t->bpe;
    int rc = KV_OK;
    span_vec a = { 0 }, c = { 0 };
    char *mapped = NULL;
    const char *buf = text;
    bpe_scratch s = { 0 };
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!md || span_push(&a, 0, len)) goto nomem;
    for (int i = 0; i < b->n_steps; i++) {
        if (b->step_kind[i] == STEP_SPLIT) {
            if (split_pieces(b->re[i], md, buf, &a, &c)) goto nomem;
            span_vec tmp = a;
            a = c;
            c = tmp;
            continue;
        }
        /* BYTELEVEL: every byte → its GPT-2 alphabet character (1 or 2 UTF-8 bytes) */
        size_t total = 0;
        for (size_t p = 0; p < a.n; p++) total += a.v[p].len;
        char *m = malloc(total * 2 + 1);
        if (!m) goto nomem;
        size_t o = 0;
        for (size_t p = 0; p < a.n; p++) {
            size_t start = o;
            for (size_t k = 0; k < a.v[p].len; k++)
                o += utf8_encode(bpe_byte_to_cp((unsigned char)buf[a.v[p].off + k]), m + o);
            a.v[p].off = start;
            a.v[p].len = o - start;
        }
        free(mapped);
        mapped = m;
        buf = m;
    }
    for (size_t p = 0; p < a.n; p++)
        if ((rc = bpe_word(t, buf + a.v[p].off, a.v[p].len, &s, out))) goto nomem;
    goto done;
nomem:
    rc = kv_error_set(err, KV_ERR_NOMEM, "%s: out of memory while tokenizing", t->path);
done:
    if (md) pcre2_match_data_free(md);
    free(a.v);
    free(c.v);
    free(mapped);
    free(s.sym);
    free(s.heap);
    return rc;
}
