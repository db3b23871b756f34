/* tokenizer_spm: SentencePiece-style BPE encoding ("llama" vocabularies): space escaping, score-driven merges, byte fallback. */
#include "tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

/* One symbol: a byte range of the escaped text, in a doubly linked list. len 0 = merged away. */
typedef struct spm_sym {
    uint32_t off, len;
    int32_t prev, next;
} spm_sym;

/* A candidate merge of symbols left+right whose concatenation (len bytes) is a vocab piece. */
typedef struct spm_pair {
    float score;
    int32_t left, right;
    uint32_t len;
} spm_pair;

typedef struct spm_heap {
    spm_pair *v;
    size_t n, cap;
} spm_heap;

/* Higher score first; ties → leftmost (SentencePiece bpe_model.cc resolves ties by position). */
static int pair_before(const spm_pair *a, const spm_pair *b)
{
    if (a->score != b->score) return a->score > b->score;
    return a->left < b->left;
}

static int heap_push(spm_heap *h, spm_pair p)
{
    if (h->n == h->cap) {
        size_t nc = h->cap ? h->cap * 2 : 64;
        spm_pair *nv = realloc(h->v, nc * sizeof *nv);
        if (!nv) return KV_ERR_NOMEM;
        h->v = nv;
        h->cap = nc;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!pair_before(&p, &h->v[parent])) break;
        h->v[i] = h->v[parent];
        i = parent;
    }
    h->v[i] = p;
    return KV_OK;
}

static spm_pair heap_pop(spm_heap *h)
{
    spm_pair top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && pair_before(&h->v[c + 1], &h->v[c])) c++;
        if (!pair_before(&h->v[c], &last)) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n) h->v[i] = last;
    return top;
}

/* Pieces a merge may produce: normal tokens (SentencePiece never emits control, unknown,
 * unused or byte pieces from text; user-defined ones are matched before, in tokenizer.c). */
static int mergeable(const tokenizer *t, int32_t id)
{
    return id >= 0 && t->type[id] == TOK_TYPE_NORMAL;
}

static int try_pair(const tokenizer *t, const char *buf, const spm_sym *sym, int32_t l, int32_t r, spm_heap *h)
{
    if (l < 0 || r < 0) return KV_OK;
    uint32_t len = sym[l].len + sym[r].len;
    int32_t id = tok_lookup(t, buf + sym[l].off, len);
    if (!mergeable(t, id)) return KV_OK;
    return heap_push(h, (spm_pair){ t->scores[id], l, r, len });
}

/* Merge and emit the symbols sym[first .. first+count) (already linked). */
static int spm_chunk(const tokenizer *t, const char *buf, spm_sym *sym, int32_t first, int32_t count, spm_heap *h,
                     tok_vec *out)
{
    int rc;
    int32_t last = first + count - 1;
    sym[first].prev = -1;
    sym[last].next = -1;
    h->n = 0;
    for (int32_t i = first; i < last; i++)
        if ((rc = try_pair(t, buf, sym, i, i + 1, h))) return rc;
    while (h->n) {
        spm_pair p = heap_pop(h);
        spm_sym *L = &sym[p.left], *R = &sym[p.right];
        if (L->len == 0 || R->len == 0 || L->next != p.right || L->len + R->len != p.len) continue; /* stale */
        L->len += R->len;
        L->next = R->next;
        if (R->next >= 0) sym[R->next].prev = p.left;
        R->len = 0;
        if ((rc = try_pair(t, buf, sym, L->prev, p.left, h)) || (rc = try_pair(t, buf, sym, p.left, L->next, h)))
            return rc;
    }
    /* emit: vocab pieces, else byte tokens, else unk (once per character) */
    for (int32_t i = first; i >= 0; i = sym[i].next) {
        int32_t id = tok_lookup(t, buf + sym[i].off, sym[i].len);
        if (mergeable(t, id)) {
            if ((rc = tok_vec_push(out, id))) return rc;
            continue;
        }
        int unk_done = 0;
        for (uint32_t k = 0; k < sym[i].len; k++) {
            int32_t b = t->byte_tok[(unsigned char)buf[sym[i].off + k]];
            if (b >= 0) {
                if ((rc = tok_vec_push(out, b))) return rc;
            } else if (t->unk_ok && !unk_done) {
                if ((rc = tok_vec_push(out, t->unk))) return rc;
                unk_done = 1;
            }
        }
    }
    return KV_OK;
}

static int is_ws_marker(const char *buf, const spm_sym *s)
{
    return s->len == 3 && memcmp(buf + s->off, "\xe2\x96\x81", 3) == 0;
}

int spm_encode_fragment(const tokenizer *t, const char *text, size_t len, int add_prefix, tok_vec *out,
                        kv_error *err)
{
    if (len == 0) return KV_OK;
    int rc = KV_OK;
    spm_heap h = { 0 };
    spm_sym *sym = NULL;
    /* 1. escape: optional leading U+2581, every ' ' → U+2581 */
    char *buf = malloc(len * 3 + 3);
    if (!buf) goto nomem;
    size_t n = 0;
    if (add_prefix) {
        memcpy(buf, "\xe2\x96\x81", 3);
        n = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(buf + n, "\xe2\x96\x81", 3);
            n += 3;
        } else {
            buf[n++] = text[i];
        }
    }
    /* 2. one symbol per UTF-8 character (an ill-formed byte is a symbol of its own) */
    sym = malloc(n * sizeof *sym);
    if (!sym) goto nomem;
    int32_t ns = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = utf8_decode((const unsigned char *)buf + i, n - i, &cp);
        sym[ns] = (spm_sym){ (uint32_t)i, (uint32_t)k, ns - 1, ns + 1 };
        ns++;
        i += k;
    }
    /* 3. merge the best-scoring adjacent pair until none is in the vocab. When no vocab piece
     *    has U+2581 right after another character, no merge can cross a point where U+2581
     *    follows another character, so each such "word" is merged on its own: same result,
     *    small heaps (the whole text at once otherwise). */
    int32_t first = 0;
    for (int32_t i = 1; i <= ns; i++) {
        if (i < ns && !(t->spm_word_split && is_ws_marker(buf, &sym[i]) && !is_ws_marker(buf, &sym[i - 1])))
            continue;
        if ((rc = spm_chunk(t, buf, sym, first, i - first, &h, out))) goto nomem;
        first = i;
    }
    free(h.v);
    free(sym);
    free(buf);
    return KV_OK;
nomem:
    free(h.v);
    free(sym);
    free(buf);
    return kv_error_set(err, KV_ERR_NOMEM, "%s: out of memory while tokenizing", t->path);
}
