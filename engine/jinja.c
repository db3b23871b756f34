/* jinja: lexer, parser and tree-walking evaluator of the Jinja2 subset chat templates use (see jinja.h), with per-byte "message content" marks. */
#include "jinja.h"

#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- arena: every allocation of a parse or a render; freed at once ------------------- */

#define ARENA_LIMIT ((size_t)256 << 20)
#define MAX_DEPTH 200

typedef struct ablk {
    struct ablk *next;
    size_t used, cap;
    max_align_t data[];
} ablk;

typedef struct arena {
    ablk *head;
    size_t total;
    jmp_buf *oom; /* where to go when an allocation fails */
} arena;

static void *ar_alloc(arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        if (a->total + cap > ARENA_LIMIT) longjmp(*a->oom, 2);
        ablk *b = malloc(sizeof *b + cap);
        if (!b) longjmp(*a->oom, 2);
        b->next = a->head;
        b->used = 0;
        b->cap = cap;
        a->head = b;
        a->total += cap;
    }
    void *p = (char *)a->head->data + a->head->used;
    a->head->used += n;
    return p;
}

static void ar_free(arena *a)
{
    for (ablk *b = a->head; b;) {
        ablk *n = b->next;
        free(b);
        b = n;
    }
    a->head = NULL;
    a->total = 0;
}

/* ---- values -------------------------------------------------------------------------- */

enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_ARR, V_OBJ, V_FUNC };

typedef struct jstr {
    size_t len;
    const char *s;
    const unsigned char *mask; /* NULL: no content byte */
} jstr;

typedef struct jval jval;
typedef struct jarr { size_t n, cap; jval *v; } jarr;
typedef struct jobj { size_t n, cap; jstr **k; jval *v; } jobj;
struct node;
struct scope;
typedef struct jfunc {
    int builtin;               /* B_* or 0 for a macro */
    const struct node *macro;
    struct scope *closure;
} jfunc;

struct jval {
    int t;
    union {
        int b;
        long long i;
        double f;
        jstr *s;
        jarr *a;
        jobj *o;
        jfunc *fn;
    } u;
};

static const jval UNDEF = { V_UNDEF, { 0 } };
static const jval NONE = { V_NONE, { 0 } };

/* ---- template tree ------------------------------------------------------------------- */

enum {
    /* statements */
    N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_FILTERBLOCK, N_BREAK, N_CONTINUE, N_BLOCK,
    /* expressions */
    E_LIT, E_NAME, E_ATTR, E_INDEX, E_SLICE, E_CALL, E_FILTER, E_TEST, E_NEG, E_POS, E_BIN, E_AND, E_OR, E_NOT,
    E_COND, E_LIST, E_DICT, E_CMP,
};

enum { OP_ADD = 1, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT,
       OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN };

typedef struct node {
    int k, line, op;
    struct node *a, *b, *c;
    struct node **list;   /* body / args / elements / keys */
    size_t n;
    struct node **list2;  /* else body / kwarg values / dict values / macro defaults */
    size_t n2;
    jstr *name;           /* identifier, attribute, filter/test name, set target attr */
    jstr **names;         /* for targets, kwarg names, macro params */
    size_t n_names;
    int *ops;             /* E_CMP: operators of the chain */
    jval lit;
} node;

struct jinja_template {
    arena ar;
    node **body;
    size_t n;
};

/* ---- shared error state -------------------------------------------------------------- */

typedef struct jstate {
    arena *ar;
    jmp_buf jb;
    char msg[400];
    int line;
} jstate;

static void failf(jstate *S, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4), noreturn));
static void failf(jstate *S, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(S->msg, sizeof S->msg, fmt, ap);
    va_end(ap);
    S->line = line;
    longjmp(S->jb, 1);
}

static jstr *mkstr(arena *a, const char *s, size_t len, const unsigned char *mask)
{
    jstr *r = ar_alloc(a, sizeof *r);
    char *p = ar_alloc(a, len + 1);
    if (len) memcpy(p, s, len);
    p[len] = 0;
    r->s = p;
    r->len = len;
    r->mask = NULL;
    if (mask) {
        int any = 0;
        for (size_t i = 0; i < len && !any; i++) any = mask[i];
        if (any) {
            unsigned char *m = ar_alloc(a, len ? len : 1);
            memcpy(m, mask, len);
            r->mask = m;
        }
    }
    return r;
}

static jstr *cstr(arena *a, const char *s) { return mkstr(a, s, strlen(s), NULL); }

static jval vstr(jstr *s) { jval v = { V_STR, { 0 } }; v.u.s = s; return v; }
static jval vint(long long i) { jval v = { V_INT, { 0 } }; v.u.i = i; return v; }
static jval vflt(double f) { jval v = { V_FLOAT, { 0 } }; v.u.f = f; return v; }
static jval vbool(int b) { jval v = { V_BOOL, { 0 } }; v.u.b = !!b; return v; }

static int streq(const jstr *s, const char *c) { return s->len == strlen(c) && !memcmp(s->s, c, s->len); }

/* growable byte buffer with a parallel mask */
typedef struct obuf {
    char *s;
    unsigned char *m;
    size_t len, cap;
    int any;
} obuf;

static void ob_put(arena *a, obuf *b, const char *s, size_t n, const unsigned char *mask, int all)
{
    if (!n) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *ns = ar_alloc(a, cap);
        unsigned char *nm = ar_alloc(a, cap);
        if (b->len) {
            memcpy(ns, b->s, b->len);
            memcpy(nm, b->m, b->len);
        }
        b->s = ns;
        b->m = nm;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    if (mask) {
        memcpy(b->m + b->len, mask, n);
        b->any = 1;
    } else {
        memset(b->m + b->len, all ? 1 : 0, n);
        if (all) b->any = 1;
    }
    b->len += n;
    b->s[b->len] = 0;
}

static void ob_puts(arena *a, obuf *b, const char *s) { ob_put(a, b, s, strlen(s), NULL, 0); }
static void ob_putj(arena *a, obuf *b, const jstr *s) { ob_put(a, b, s->s, s->len, s->mask, 0); }
static jstr *ob_str(arena *a, obuf *b) { return mkstr(a, b->s ? b->s : "", b->len, b->any ? b->m : NULL); }

/* ---- lexer --------------------------------------------------------------------------- */

enum { T_TEXT, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STR, T_INT, T_FLOAT, T_OP, T_EOF };

typedef struct tok {
    int t, line;
    const char *s; /* T_TEXT: into the source (after whitespace control); T_NAME/T_OP: text */
    size_t len;
    jstr *str;     /* T_STR (decoded) */
    long long i;
    double f;
} tok;

typedef struct lexer {
    jstate *S;
    const char *src;
    size_t len, pos;
    int line;
    tok *v;
    size_t n, cap;
} lexer;

static tok *lx_push(lexer *L, int t, int line)
{
    if (L->n == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        tok *nv = ar_alloc(L->S->ar, cap * sizeof *nv);
        if (L->n) memcpy(nv, L->v, L->n * sizeof *nv);
        L->v = nv;
        L->cap = cap;
    }
    tok *k = &L->v[L->n++];
    memset(k, 0, sizeof *k);
    k->t = t;
    k->line = line;
    return k;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
static int is_idstart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int is_digit(char c) { return c >= '0' && c <= '9'; }

static int count_lines(const char *s, size_t n)
{
    int k = 0;
    for (size_t i = 0; i < n; i++) k += s[i] == '\n';
    return k;
}

static void put_utf8(arena *a, obuf *b, unsigned cp);

/* Decode a quoted string literal at L->pos (the quote). */
static void lx_string(lexer *L, tok *k)
{
    char q = L->src[L->pos++];
    int k_line = k->line;
    obuf b = { 0 };
    arena *a = L->S->ar;
    while (1) {
        if (L->pos >= L->len) failf(L->S, k->line, "unterminated string literal");
        char c = L->src[L->pos++];
        if (c == q) break;
        if (c == '\n') L->line++;
        if (c == '\\' && L->pos < L->len) {
            char e = L->src[L->pos++];
            char o;
            switch (e) {
            case 'n': o = '\n'; break;
            case 't': o = '\t'; break;
            case 'r': o = '\r'; break;
            case 'b': o = '\b'; break;
            case 'f': o = '\f'; break;
            case 'v': o = '\v'; break;
            case '0': o = '\0'; break;
            case '\\': o = '\\'; break;
            case '\'': o = '\''; break;
            case '"': o = '"'; break;
            case '\n': L->line++; continue;
            case 'x': case 'u': case 'U': { /* \xHH, \uHHHH, \UHHHHHHHH: a code point, written as UTF-8 */
                int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
                unsigned cp = 0;
                int got = 0;
                for (; got < nd && L->pos < L->len; got++) {
                    char h = L->src[L->pos];
                    int v = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                          : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
                    if (v < 0) break;
                    cp = cp * 16 + (unsigned)v;
                    L->pos++;
                }
                if (got != nd) failf(L->S, k_line, "bad \\%c escape in a string literal", e);
                if (cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) cp = 0xFFFD;
                put_utf8(a, &b, cp);
                continue;
            }
            default: ob_put(a, &b, "\\", 1, NULL, 0); o = e; break;
            }
            ob_put(a, &b, &o, 1, NULL, 0);
            continue;
        }
        ob_put(a, &b, &c, 1, NULL, 0);
    }
    k->str = ob_str(a, &b);
}

static const char *const OPS3[] = { "**", "//", "==", "!=", "<=", ">=", NULL };

/* Tokens of one tag's inside until its end marker; returns with L->pos after the marker. */
static void lx_tag(lexer *L, int is_block, int *strip_right, int *plus_right)
{
    const char *endm = is_block ? "%}" : "}}";
    int start_line = L->line;
    while (1) {
        while (L->pos < L->len && is_ws(L->src[L->pos])) {
            if (L->src[L->pos] == '\n') L->line++;
            L->pos++;
        }
        if (L->pos >= L->len) failf(L->S, start_line, "unclosed %s tag", is_block ? "{%" : "{{");
        const char *p = L->src + L->pos;
        size_t rest = L->len - L->pos;
        if ((*p == '-' || *p == '+') && rest >= 3 && !memcmp(p + 1, endm, 2)) {
            *strip_right = *p == '-';
            *plus_right = *p == '+';
            L->pos += 3;
            return;
        }
        if (rest >= 2 && !memcmp(p, endm, 2)) {
            L->pos += 2;
            return;
        }
        char c = *p;
        if (is_idstart(c)) {
            size_t n = 1;
            while (n < rest && (is_idstart(p[n]) || is_digit(p[n]))) n++;
            tok *k = lx_push(L, T_NAME, L->line);
            k->s = p;
            k->len = n;
            L->pos += n;
        } else if (is_digit(c)) {
            size_t n = 0;
            int flt = 0;
            while (n < rest && (is_digit(p[n]) || p[n] == '_')) n++;
            if (n + 1 < rest && p[n] == '.' && is_digit(p[n + 1])) {
                flt = 1;
                n++;
                while (n < rest && is_digit(p[n])) n++;
            }
            if (n < rest && (p[n] == 'e' || p[n] == 'E') && n + 1 < rest &&
                (is_digit(p[n + 1]) || ((p[n + 1] == '-' || p[n + 1] == '+') && n + 2 < rest && is_digit(p[n + 2])))) {
                flt = 1;
                n += 2;
                while (n < rest && is_digit(p[n])) n++;
            }
            char buf[64];
            size_t w = 0;
            for (size_t i = 0; i < n && w < sizeof buf - 1; i++)
                if (p[i] != '_') buf[w++] = p[i];
            buf[w] = 0;
            tok *k = lx_push(L, flt ? T_FLOAT : T_INT, L->line);
            if (flt) k->f = strtod(buf, NULL);
            else k->i = strtoll(buf, NULL, 10);
            L->pos += n;
        } else if (c == '\'' || c == '"') {
            tok *k = lx_push(L, T_STR, L->line);
            lx_string(L, k);
        } else {
            size_t n = 1;
            for (int i = 0; OPS3[i]; i++)
                if (rest >= 2 && !memcmp(p, OPS3[i], 2)) n = 2;
            if (n == 1 && !strchr("+-*/%~|.,:()[]{}=<>", c)) failf(L->S, L->line, "unexpected character '%c'", c);
            tok *k = lx_push(L, T_OP, L->line);
            k->s = p;
            k->len = n;
            L->pos += n;
        }
    }
}

static void lexer_run(lexer *L)
{
    /* text tokens are kept as source ranges; whitespace control edits the ranges */
    int pending_strip = 0;   /* previous tag asked to strip the following whitespace ("-") */
    int pending_trim = 0;    /* previous tag was a block/comment: drop one newline (trim_blocks) */
    while (L->pos <= L->len) {
        const char *p = L->src + L->pos;
        size_t rest = L->len - L->pos;
        /* find the next tag opener */
        size_t i = 0;
        int kind = 0; /* 1 var, 2 block, 3 comment */
        for (; i + 1 < rest; i++) {
            if (p[i] != '{') continue;
            if (p[i + 1] == '{') { kind = 1; break; }
            if (p[i + 1] == '%') { kind = 2; break; }
            if (p[i + 1] == '#') { kind = 3; break; }
        }
        size_t tlen = kind ? i : rest;
        const char *ts = p;
        int text_line = L->line;
        L->line += count_lines(p, tlen);
        /* the tag's own left modifier */
        char lmod = kind && i + 2 < rest ? p[i + 2] : 0;
        if (lmod != '-' && lmod != '+') lmod = 0;
        /* whitespace control on this text */
        if (pending_strip) {
            while (tlen && is_ws(*ts)) ts++, tlen--;
        } else if (pending_trim) {
            if (tlen && *ts == '\n') ts++, tlen--;
            else if (tlen >= 2 && ts[0] == '\r' && ts[1] == '\n') ts += 2, tlen -= 2;
        }
        if (kind && lmod == '-') {
            while (tlen && is_ws(ts[tlen - 1])) tlen--;
        } else if ((kind == 2 || kind == 3) && lmod != '+') {
            /* lstrip_blocks: spaces and tabs from the start of the line to the tag */
            size_t j = tlen;
            while (j && (ts[j - 1] == ' ' || ts[j - 1] == '\t')) j--;
            if (j ? ts[j - 1] == '\n' : (ts == L->src || ts[-1] == '\n')) tlen = j;
        }
        if (tlen) {
            tok *k = lx_push(L, T_TEXT, text_line);
            k->s = ts;
            k->len = tlen;
        }
        if (!kind) break;
        L->pos += i + 2 + (lmod ? 1 : 0);
        int sr = 0, pr = 0;
        if (kind == 3) {
            const char *q = L->src + L->pos;
            size_t r = L->len - L->pos, j = 0;
            while (j + 1 < r && !(q[j] == '#' && q[j + 1] == '}')) j++;
            if (j + 1 >= r) failf(L->S, L->line, "unclosed comment");
            sr = j > 0 && q[j - 1] == '-';
            pr = j > 0 && q[j - 1] == '+';
            L->line += count_lines(q, j);
            L->pos += j + 2;
        } else {
            tok *b = lx_push(L, kind == 1 ? T_VAR_BEGIN : T_BLOCK_BEGIN, L->line);
            (void)b;
            lx_tag(L, kind == 2, &sr, &pr);
            lx_push(L, kind == 1 ? T_VAR_END : T_BLOCK_END, L->line);
        }
        pending_strip = sr;
        pending_trim = (kind == 2 || kind == 3) && !pr;
        if (L->pos == L->len) {
            /* nothing after the last tag */
            break;
        }
    }
    lx_push(L, T_EOF, L->line);
}

/* ---- parser -------------------------------------------------------------------------- */

typedef struct parser {
    jstate *S;
    tok *v;
    size_t n, i;
    int depth;                /* nesting of the recursive descent (expressions, unary ops, blocks) */
} parser;

/* Enter one level of the recursive descent: a template nested deeper than MAX_DEPTH is an error,
 * not a stack overflow (found by fuzz_jinja_tmpl: "[[[[..." thousands deep). */
static void p_enter(parser *P)
{
    if (++P->depth > MAX_DEPTH) failf(P->S, P->v[P->i].line, "template nested too deep (over %d levels)", MAX_DEPTH);
}

static tok *pk(parser *P) { return &P->v[P->i]; }
static tok *nx(parser *P) { return &P->v[P->i < P->n - 1 ? P->i++ : P->i]; }
static int is_name(tok *k, const char *s) { return k->t == T_NAME && k->len == strlen(s) && !memcmp(k->s, s, k->len); }
static int is_op(tok *k, const char *s) { return k->t == T_OP && k->len == strlen(s) && !memcmp(k->s, s, k->len); }

static const char *tokdesc(tok *k, char *buf, size_t cap)
{
    switch (k->t) {
    case T_NAME: case T_OP: snprintf(buf, cap, "'%.*s'", (int)(k->len > 40 ? 40 : k->len), k->s); break;
    case T_STR: snprintf(buf, cap, "a string"); break;
    case T_INT: case T_FLOAT: snprintf(buf, cap, "a number"); break;
    case T_VAR_END: snprintf(buf, cap, "'}}'"); break;
    case T_BLOCK_END: snprintf(buf, cap, "'%%}'"); break;
    case T_EOF: snprintf(buf, cap, "the end of the template"); break;
    default: snprintf(buf, cap, "text"); break;
    }
    return buf;
}

static void __attribute__((noreturn)) unexpected(parser *P, const char *want)
{
    char b[64];
    failf(P->S, pk(P)->line, "expected %s, found %s", want, tokdesc(pk(P), b, sizeof b));
}

static void expect_op(parser *P, const char *s)
{
    if (!is_op(pk(P), s)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", s);
        unexpected(P, w);
    }
    nx(P);
}

static node *mk(parser *P, int k, int line)
{
    node *n = ar_alloc(P->S->ar, sizeof *n);
    memset(n, 0, sizeof *n);
    n->k = k;
    n->line = line;
    return n;
}

static jstr *tokname(parser *P, tok *k) { return mkstr(P->S->ar, k->s, k->len, NULL); }

static jstr *expect_name(parser *P)
{
    if (pk(P)->t != T_NAME) unexpected(P, "a name");
    return tokname(P, nx(P));
}

/* growable node list */
typedef struct nlist { node **v; size_t n, cap; } nlist;
static void nl_push(parser *P, nlist *l, node *x)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        node **nv = ar_alloc(P->S->ar, cap * sizeof *nv);
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = x;
}
typedef struct slist { jstr **v; size_t n, cap; } slist;
static void sl_push(parser *P, slist *l, jstr *x)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        jstr **nv = ar_alloc(P->S->ar, cap * sizeof *nv);
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = x;
}

static node *p_expr(parser *P);
static node *p_or(parser *P);
static node *p_unary(parser *P, int with_filter);
static node *p_primary(parser *P);
static node *p_postfix(parser *P, node *n);

/* ( args ) after the '(' was seen: positional and name=value */
static void p_args(parser *P, node *n)
{
    nlist pos = { 0 }, kv = { 0 };
    slist kn = { 0 };
    while (!is_op(pk(P), ")")) {
        if (pk(P)->t == T_NAME && is_op(&P->v[P->i + 1], "=")) {
            sl_push(P, &kn, tokname(P, nx(P)));
            nx(P);
            nl_push(P, &kv, p_expr(P));
        } else {
            if (kn.n) failf(P->S, pk(P)->line, "positional argument after keyword argument");
            nl_push(P, &pos, p_expr(P));
        }
        if (!is_op(pk(P), ",")) break;
        nx(P);
    }
    expect_op(P, ")");
    n->list = pos.v;
    n->n = pos.n;
    n->list2 = kv.v;
    n->n2 = kv.n;
    n->names = kn.v;
    n->n_names = kn.n;
}

static node *p_primary(parser *P)
{
    tok *k = pk(P);
    node *n;
    if (k->t == T_NAME) {
        nx(P);
        n = mk(P, E_LIT, k->line);
        if (is_name(k, "true") || is_name(k, "True")) n->lit = vbool(1);
        else if (is_name(k, "false") || is_name(k, "False")) n->lit = vbool(0);
        else if (is_name(k, "none") || is_name(k, "None")) n->lit = NONE;
        else {
            n->k = E_NAME;
            n->name = tokname(P, k);
        }
        return n;
    }
    if (k->t == T_STR) {
        nx(P);
        n = mk(P, E_LIT, k->line);
        jstr *s = k->str;
        while (pk(P)->t == T_STR) { /* adjacent literals concatenate */
            jstr *t = nx(P)->str;
            obuf b = { 0 };
            ob_putj(P->S->ar, &b, s);
            ob_putj(P->S->ar, &b, t);
            s = ob_str(P->S->ar, &b);
        }
        n->lit = vstr(s);
        return n;
    }
    if (k->t == T_INT || k->t == T_FLOAT) {
        nx(P);
        n = mk(P, E_LIT, k->line);
        n->lit = k->t == T_INT ? vint(k->i) : vflt(k->f);
        return n;
    }
    if (is_op(k, "(")) {
        nx(P);
        if (is_op(pk(P), ")")) {
            nx(P);
            return mk(P, E_LIST, k->line);
        }
        node *e = p_expr(P);
        if (is_op(pk(P), ",")) { /* tuple: a list */
            nlist l = { 0 };
            nl_push(P, &l, e);
            while (is_op(pk(P), ",")) {
                nx(P);
                if (is_op(pk(P), ")")) break;
                nl_push(P, &l, p_expr(P));
            }
            e = mk(P, E_LIST, k->line);
            e->list = l.v;
            e->n = l.n;
        }
        expect_op(P, ")");
        return e;
    }
    if (is_op(k, "[")) {
        nx(P);
        nlist l = { 0 };
        while (!is_op(pk(P), "]")) {
            nl_push(P, &l, p_expr(P));
            if (!is_op(pk(P), ",")) break;
            nx(P);
        }
        expect_op(P, "]");
        n = mk(P, E_LIST, k->line);
        n->list = l.v;
        n->n = l.n;
        return n;
    }
    if (is_op(k, "{")) {
        nx(P);
        nlist ks = { 0 }, vs = { 0 };
        while (!is_op(pk(P), "}")) {
            nl_push(P, &ks, p_expr(P));
            expect_op(P, ":");
            nl_push(P, &vs, p_expr(P));
            if (!is_op(pk(P), ",")) break;
            nx(P);
        }
        expect_op(P, "}");
        n = mk(P, E_DICT, k->line);
        n->list = ks.v;
        n->n = ks.n;
        n->list2 = vs.v;
        n->n2 = vs.n;
        return n;
    }
    unexpected(P, "an expression");
}

static node *p_postfix(parser *P, node *n)
{
    while (1) {
        tok *k = pk(P);
        if (is_op(k, ".")) {
            nx(P);
            node *a = mk(P, E_ATTR, k->line);
            a->a = n;
            if (pk(P)->t == T_INT) { /* x.0 */
                a->k = E_INDEX;
                a->b = mk(P, E_LIT, k->line);
                a->b->lit = vint(nx(P)->i);
            } else {
                a->name = expect_name(P);
            }
            n = a;
        } else if (is_op(k, "[")) {
            nx(P);
            node *s[3] = { NULL, NULL, NULL };
            int is_slice = 0;
            for (int part = 0; part < 3; part++) {
                if (!is_op(pk(P), ":") && !is_op(pk(P), "]")) s[part] = p_expr(P);
                if (is_op(pk(P), ":") && part < 2) {
                    is_slice = 1;
                    nx(P);
                    continue;
                }
                break;
            }
            expect_op(P, "]");
            node *x = mk(P, is_slice ? E_SLICE : E_INDEX, k->line);
            x->a = n;
            if (is_slice) {
                x->list = ar_alloc(P->S->ar, 3 * sizeof *x->list);
                memcpy(x->list, s, sizeof s);
                x->n = 3;
            } else {
                if (!s[0]) failf(P->S, k->line, "empty subscript");
                x->b = s[0];
            }
            n = x;
        } else if (is_op(k, "(")) {
            nx(P);
            node *c = mk(P, E_CALL, k->line);
            c->a = n;
            p_args(P, c);
            n = c;
        } else {
            return n;
        }
    }
}

static int starts_expr(tok *k)
{
    if (k->t == T_STR || k->t == T_INT || k->t == T_FLOAT) return 1;
    if (k->t == T_NAME) {
        static const char *const kw[] = { "and", "or", "else", "if", "in", "is", "not", NULL };
        for (int i = 0; kw[i]; i++)
            if (is_name(k, kw[i])) return 0;
        return 1;
    }
    return is_op(k, "(") || is_op(k, "[") || is_op(k, "{") || is_op(k, "-");
}

static node *p_filters(parser *P, node *n)
{
    while (1) {
        tok *k = pk(P);
        if (is_op(k, "|")) {
            nx(P);
            node *f = mk(P, E_FILTER, k->line);
            f->a = n;
            f->name = expect_name(P);
            while (is_op(pk(P), ".")) { /* dotted filter names are not used; keep the last part */
                nx(P);
                f->name = expect_name(P);
            }
            if (is_op(pk(P), "(")) {
                nx(P);
                p_args(P, f);
            }
            n = f;
        } else if (is_name(k, "is")) {
            nx(P);
            node *t = mk(P, E_TEST, k->line);
            if (is_name(pk(P), "not")) {
                nx(P);
                t->op = 1;
            }
            t->a = n;
            if (pk(P)->t == T_NAME) t->name = expect_name(P);
            else if (is_op(pk(P), "==")) { nx(P); t->name = cstr(P->S->ar, "eq"); }
            else unexpected(P, "a test name");
            if (is_op(pk(P), "(")) {
                nx(P);
                p_args(P, t);
            } else if (starts_expr(pk(P)) && !is_op(pk(P), "-")) {
                node *arg = p_postfix(P, p_primary(P));
                t->list = ar_alloc(P->S->ar, sizeof *t->list);
                t->list[0] = arg;
                t->n = 1;
            }
            n = t;
        } else {
            return n;
        }
    }
}

static node *p_unary(parser *P, int with_filter)
{
    tok *k = pk(P);
    node *n;
    p_enter(P);
    if (is_op(k, "-") || is_op(k, "+")) {
        nx(P);
        n = mk(P, is_op(k, "-") ? E_NEG : E_POS, k->line);
        n->a = p_unary(P, 0);
    } else {
        n = p_postfix(P, p_primary(P));
    }
    P->depth--;
    return with_filter ? p_filters(P, n) : n;
}

static node *bin(parser *P, int op, node *a, node *b, int line)
{
    node *n = mk(P, E_BIN, line);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static node *p_pow(parser *P)
{
    node *n = p_unary(P, 1);
    while (is_op(pk(P), "**")) {
        int line = nx(P)->line;
        n = bin(P, OP_POW, n, p_unary(P, 1), line);
    }
    return n;
}

static node *p_math2(parser *P)
{
    node *n = p_pow(P);
    while (1) {
        tok *k = pk(P);
        int op = is_op(k, "*") ? OP_MUL : is_op(k, "/") ? OP_DIV : is_op(k, "//") ? OP_FLOORDIV : is_op(k, "%") ? OP_MOD : 0;
        if (!op) return n;
        nx(P);
        n = bin(P, op, n, p_pow(P), k->line);
    }
}

static node *p_concat(parser *P)
{
    node *n = p_math2(P);
    while (is_op(pk(P), "~")) {
        int line = nx(P)->line;
        n = bin(P, OP_CONCAT, n, p_math2(P), line);
    }
    return n;
}

static node *p_math1(parser *P)
{
    node *n = p_concat(P);
    while (1) {
        tok *k = pk(P);
        int op = is_op(k, "+") ? OP_ADD : is_op(k, "-") ? OP_SUB : 0;
        if (!op) return n;
        nx(P);
        n = bin(P, op, n, p_concat(P), k->line);
    }
}

static int cmp_op(parser *P)
{
    tok *k = pk(P);
    if (is_op(k, "==")) return OP_EQ;
    if (is_op(k, "!=")) return OP_NE;
    if (is_op(k, "<")) return OP_LT;
    if (is_op(k, "<=")) return OP_LE;
    if (is_op(k, ">")) return OP_GT;
    if (is_op(k, ">=")) return OP_GE;
    if (is_name(k, "in")) return OP_IN;
    if (is_name(k, "not") && is_name(&P->v[P->i + 1], "in")) return OP_NOTIN;
    return 0;
}

static node *p_compare(parser *P)
{
    node *n = p_math1(P);
    int op = cmp_op(P);
    if (!op) return n;
    nlist l = { 0 };
    int ops[64], nops = 0;
    nl_push(P, &l, n);
    int line = pk(P)->line;
    while ((op = cmp_op(P))) {
        nx(P);
        if (op == OP_NOTIN) nx(P);
        if (nops == 64) failf(P->S, line, "comparison chain too long");
        ops[nops++] = op;
        nl_push(P, &l, p_math1(P));
    }
    if (nops == 1) return bin(P, ops[0], l.v[0], l.v[1], line);
    node *c = mk(P, E_CMP, line);
    c->list = l.v;
    c->n = l.n;
    c->ops = ar_alloc(P->S->ar, nops * sizeof *c->ops);
    memcpy(c->ops, ops, nops * sizeof *ops);
    return c;
}

static node *p_not(parser *P)
{
    if (is_name(pk(P), "not")) {
        node *n = mk(P, E_NOT, nx(P)->line);
        p_enter(P);
        n->a = p_not(P);
        P->depth--;
        return n;
    }
    return p_compare(P);
}

static node *p_and(parser *P)
{
    node *n = p_not(P);
    while (is_name(pk(P), "and")) {
        node *x = mk(P, E_AND, nx(P)->line);
        x->a = n;
        x->b = p_not(P);
        n = x;
    }
    return n;
}

static node *p_or(parser *P)
{
    node *n = p_and(P);
    while (is_name(pk(P), "or")) {
        node *x = mk(P, E_OR, nx(P)->line);
        x->a = n;
        x->b = p_and(P);
        n = x;
    }
    return n;
}

static node *p_expr(parser *P)
{
    p_enter(P);
    node *n = p_or(P);
    while (is_name(pk(P), "if")) {
        node *c = mk(P, E_COND, nx(P)->line);
        c->a = n;
        c->b = p_or(P);
        if (is_name(pk(P), "else")) {
            nx(P);
            c->c = p_expr(P);
        }
        n = c;
    }
    P->depth--;
    return n;
}

/* expression, or a bare tuple "a, b" (for "for k, v in" and "set a = 1, 2") */
static node *p_tuple_or_expr(parser *P)
{
    node *e = p_expr(P);
    if (!is_op(pk(P), ",")) return e;
    nlist l = { 0 };
    nl_push(P, &l, e);
    while (is_op(pk(P), ",")) {
        nx(P);
        nl_push(P, &l, p_expr(P));
    }
    node *t = mk(P, E_LIST, e->line);
    t->list = l.v;
    t->n = l.n;
    return t;
}

static void expect_block_end(parser *P)
{
    if (pk(P)->t != T_BLOCK_END) unexpected(P, "'%}'");
    nx(P);
}

/* Parse statements until a block tag whose keyword is one of ends (NULL-terminated);
 * the keyword is consumed, *which gets its index. ends NULL: until the end of the template. */
static node **p_body(parser *P, const char *const *ends, size_t *n_out, int *which);

static node *p_statement(parser *P, int line)
{
    tok *k = pk(P);
    if (k->t != T_NAME) unexpected(P, "a statement");
    if (is_name(k, "if")) {
        nx(P);
        node *n = mk(P, N_IF, line);
        n->a = p_expr(P);
        expect_block_end(P);
        static const char *const ends[] = { "elif", "else", "endif", NULL };
        int w;
        n->list = p_body(P, ends, &n->n, &w);
        node *cur = n;
        while (w == 0) { /* elif */
            node *e = mk(P, N_IF, pk(P)->line);
            e->a = p_expr(P);
            expect_block_end(P);
            e->list = p_body(P, ends, &e->n, &w);
            cur->list2 = ar_alloc(P->S->ar, sizeof *cur->list2);
            cur->list2[0] = e;
            cur->n2 = 1;
            cur = e;
        }
        if (w == 1) {
            expect_block_end(P);
            static const char *const e2[] = { "endif", NULL };
            cur->list2 = p_body(P, e2, &cur->n2, &w);
        }
        expect_block_end(P);
        return n;
    }
    if (is_name(k, "for")) {
        nx(P);
        node *n = mk(P, N_FOR, line);
        slist t = { 0 };
        int paren = is_op(pk(P), "(");
        if (paren) nx(P);
        sl_push(P, &t, expect_name(P));
        while (is_op(pk(P), ",")) {
            nx(P);
            sl_push(P, &t, expect_name(P));
        }
        if (paren) expect_op(P, ")");
        n->names = t.v;
        n->n_names = t.n;
        if (!is_name(pk(P), "in")) unexpected(P, "'in'");
        nx(P);
        n->a = p_or(P);
        if (is_name(pk(P), "if")) {
            nx(P);
            n->b = p_expr(P);
        }
        if (is_name(pk(P), "recursive")) failf(P->S, line, "recursive loops are not supported");
        expect_block_end(P);
        static const char *const ends[] = { "else", "endfor", NULL };
        int w;
        n->list = p_body(P, ends, &n->n, &w);
        expect_block_end(P);
        if (w == 0) {
            static const char *const e2[] = { "endfor", NULL };
            n->list2 = p_body(P, e2, &n->n2, &w);
            expect_block_end(P);
        }
        return n;
    }
    if (is_name(k, "set")) {
        nx(P);
        node *n = mk(P, N_SET, line);
        slist t = { 0 };
        sl_push(P, &t, expect_name(P));
        if (is_op(pk(P), ".")) {
            nx(P);
            n->name = expect_name(P);
        } else {
            while (is_op(pk(P), ",")) {
                nx(P);
                sl_push(P, &t, expect_name(P));
            }
        }
        n->names = t.v;
        n->n_names = t.n;
        if (is_op(pk(P), "=")) {
            nx(P);
            n->b = p_tuple_or_expr(P);
            expect_block_end(P);
            return n;
        }
        /* block set: {% set x %}...{% endset %}, optionally {% set x | filter %} */
        if (n->name || t.n != 1) unexpected(P, "'='");
        n->k = N_SETBLOCK;
        if (is_op(pk(P), "|")) {
            n->c = p_filters(P, NULL);
        }
        expect_block_end(P);
        static const char *const ends[] = { "endset", NULL };
        int w;
        n->list = p_body(P, ends, &n->n, &w);
        expect_block_end(P);
        return n;
    }
    if (is_name(k, "macro")) {
        nx(P);
        node *n = mk(P, N_MACRO, line);
        n->name = expect_name(P);
        expect_op(P, "(");
        slist ps = { 0 };
        nlist ds = { 0 };
        while (!is_op(pk(P), ")")) {
            sl_push(P, &ps, expect_name(P));
            node *d = NULL;
            if (is_op(pk(P), "=")) {
                nx(P);
                d = p_expr(P);
            }
            nl_push(P, &ds, d);
            if (!is_op(pk(P), ",")) break;
            nx(P);
        }
        expect_op(P, ")");
        n->names = ps.v;
        n->n_names = ps.n;
        n->list2 = ds.v;
        n->n2 = ds.n;
        expect_block_end(P);
        static const char *const ends[] = { "endmacro", NULL };
        int w;
        n->list = p_body(P, ends, &n->n, &w);
        if (pk(P)->t == T_NAME) nx(P); /* {% endmacro name %} */
        expect_block_end(P);
        return n;
    }
    if (is_name(k, "filter")) {
        nx(P);
        node *n = mk(P, N_FILTERBLOCK, line);
        /* a filter chain applied to the body: parse as "| name(args) | ..." on a hole */
        node *f = mk(P, E_FILTER, line);
        f->name = expect_name(P);
        if (is_op(pk(P), "(")) {
            nx(P);
            p_args(P, f);
        }
        n->c = p_filters(P, f);
        expect_block_end(P);
        static const char *const ends[] = { "endfilter", NULL };
        int w;
        n->list = p_body(P, ends, &n->n, &w);
        expect_block_end(P);
        return n;
    }
    if (is_name(k, "generation")) { /* Hugging Face's marker of assistant text: renders its body */
        nx(P);
        node *n = mk(P, N_BLOCK, line);
        expect_block_end(P);
        static const char *const ends[] = { "endgeneration", NULL };
        int w;
        n->list = p_body(P, ends, &n->n, &w);
        expect_block_end(P);
        return n;
    }
    if (is_name(k, "break") || is_name(k, "continue")) {
        node *n = mk(P, is_name(k, "break") ? N_BREAK : N_CONTINUE, line);
        nx(P);
        expect_block_end(P);
        return n;
    }
    char b[64];
    failf(P->S, line, "unknown statement %s", tokdesc(k, b, sizeof b));
}

static node **p_body(parser *P, const char *const *ends, size_t *n_out, int *which)
{
    nlist l = { 0 };
    int start_line = pk(P)->line;
    p_enter(P);
    while (1) {
        tok *k = pk(P);
        if (k->t == T_EOF) {
            if (ends) {
                int last = 0;
                while (ends[last + 1]) last++;
                failf(P->S, start_line, "missing {%% %s %%} for the block opened here", ends[last]);
            }
            break;
        }
        if (k->t == T_TEXT) {
            nx(P);
            node *n = mk(P, N_TEXT, k->line);
            n->lit = vstr(mkstr(P->S->ar, k->s, k->len, NULL));
            nl_push(P, &l, n);
        } else if (k->t == T_VAR_BEGIN) {
            nx(P);
            node *n = mk(P, N_OUT, k->line);
            n->a = p_expr(P);
            if (pk(P)->t != T_VAR_END) unexpected(P, "'}}'");
            nx(P);
            nl_push(P, &l, n);
        } else if (k->t == T_BLOCK_BEGIN) {
            nx(P);
            tok *kw = pk(P);
            int found = -1;
            for (int i = 0; ends && ends[i]; i++)
                if (is_name(kw, ends[i])) found = i;
            if (found >= 0) {
                nx(P);
                *which = found;
                break;
            }
            if (kw->t == T_NAME && kw->len > 3 && (!memcmp(kw->s, "end", 3) || is_name(kw, "elif") || is_name(kw, "else"))) {
                char b[64];
                failf(P->S, kw->line, "unexpected %s", tokdesc(kw, b, sizeof b));
            }
            if (is_name(kw, "else")) failf(P->S, kw->line, "unexpected 'else'");
            nl_push(P, &l, p_statement(P, kw->line));
        } else {
            unexpected(P, "text or a tag");
        }
    }
    P->depth--;
    *n_out = l.n;
    return l.v;
}

void jinja_free(jinja_template *t)
{
    if (!t) return;
    arena a = t->ar;
    ar_free(&a); /* t itself lives in the arena */
}

int jinja_parse(const char *src, size_t len, jinja_template **out, kv_error *err)
{
    if (!out || (!src && len)) return kv_error_set(err, KV_ERR_INVALID, "jinja_parse: NULL argument");
    *out = NULL;
    jstate S;
    arena ar = { 0 };
    ar.oom = &S.jb;
    S.ar = &ar;
    S.msg[0] = 0;
    int r = setjmp(S.jb);
    if (r) {
        ar_free(&ar);
        if (r == 2) return kv_error_set(err, KV_ERR_NOMEM, "chat template: out of memory parsing %zu bytes", len);
        return kv_error_set(err, KV_ERR_FORMAT, "chat template line %d: %s", S.line, S.msg);
    }
    lexer L = { &S, src ? src : "", len, 0, 1, NULL, 0, 0 };
    lexer_run(&L);
    parser P = { .S = &S, .v = L.v, .n = L.n };
    jinja_template *t = ar_alloc(&ar, sizeof *t);
    int w;
    t->body = p_body(&P, NULL, &t->n, &w);
    t->ar = ar;
    *out = t;
    return KV_OK;
}

/* ---- JSON in and out ----------------------------------------------------------------- */

typedef struct jsonp {
    jstate *S;
    const char *s;
    size_t n, i;
    int depth;
} jsonp;

static void js_ws(jsonp *J)
{
    while (J->i < J->n && is_ws(J->s[J->i])) J->i++;
}

static void __attribute__((noreturn)) js_fail(jsonp *J, const char *what)
{
    failf(J->S, 0, "context JSON at byte %zu: %s", J->i, what);
}

static void put_utf8(arena *a, obuf *b, unsigned cp)
{
    char u[4];
    size_t n;
    if (cp < 0x80) { u[0] = (char)cp; n = 1; }
    else if (cp < 0x800) { u[0] = (char)(0xC0 | cp >> 6); u[1] = (char)(0x80 | (cp & 63)); n = 2; }
    else if (cp < 0x10000) { u[0] = (char)(0xE0 | cp >> 12); u[1] = (char)(0x80 | ((cp >> 6) & 63)); u[2] = (char)(0x80 | (cp & 63)); n = 3; }
    else { u[0] = (char)(0xF0 | cp >> 18); u[1] = (char)(0x80 | ((cp >> 12) & 63)); u[2] = (char)(0x80 | ((cp >> 6) & 63)); u[3] = (char)(0x80 | (cp & 63)); n = 4; }
    ob_put(a, b, u, n, NULL, 0);
}

static unsigned js_hex4(jsonp *J)
{
    if (J->i + 4 > J->n) js_fail(J, "short \\u escape");
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = J->s[J->i++];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else js_fail(J, "bad \\u escape");
    }
    return v;
}

static jstr *js_string(jsonp *J, int content)
{
    arena *a = J->S->ar;
    obuf b = { 0 };
    J->i++; /* opening quote */
    while (1) {
        if (J->i >= J->n) js_fail(J, "unterminated string");
        char c = J->s[J->i++];
        if (c == '"') break;
        if (c == '\\') {
            if (J->i >= J->n) js_fail(J, "unterminated string");
            char e = J->s[J->i++];
            char o;
            switch (e) {
            case '"': o = '"'; break;
            case '\\': o = '\\'; break;
            case '/': o = '/'; break;
            case 'b': o = '\b'; break;
            case 'f': o = '\f'; break;
            case 'n': o = '\n'; break;
            case 'r': o = '\r'; break;
            case 't': o = '\t'; break;
            case 'u': {
                unsigned cp = js_hex4(J);
                if (cp >= 0xD800 && cp < 0xDC00 && J->i + 6 <= J->n && J->s[J->i] == '\\' && J->s[J->i + 1] == 'u') {
                    size_t save = J->i;
                    J->i += 2;
                    unsigned lo = js_hex4(J);
                    if (lo >= 0xDC00 && lo < 0xE000) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    else J->i = save;
                }
                if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD;
                put_utf8(a, &b, cp);
                continue;
            }
            default: js_fail(J, "bad escape");
            }
            ob_put(a, &b, &o, 1, NULL, 0);
            continue;
        }
        ob_put(a, &b, &c, 1, NULL, 0);
    }
    jstr *s = ob_str(a, &b);
    if (content && s->len) {
        unsigned char *m = ar_alloc(a, s->len);
        memset(m, 1, s->len);
        s->mask = m;
    }
    return s;
}

static void obj_set(arena *a, jobj *o, jstr *k, jval v);

/* content: 0 outside messages, 1 the messages array, 2 a message, 3 message content (its
 * strings are marked), 4 a message's role */
static jval js_value(jsonp *J, int content)
{
    arena *a = J->S->ar;
    js_ws(J);
    if (J->i >= J->n) js_fail(J, "unexpected end");
    if (++J->depth > 200) js_fail(J, "nested too deep");
    char c = J->s[J->i];
    jval v = UNDEF;
    if (c == '{') {
        J->i++;
        jobj *o = ar_alloc(a, sizeof *o);
        memset(o, 0, sizeof *o);
        js_ws(J);
        if (J->i < J->n && J->s[J->i] == '}') J->i++;
        else
            while (1) {
                js_ws(J);
                if (J->i >= J->n || J->s[J->i] != '"') js_fail(J, "expected a key");
                jstr *k = js_string(J, 0);
                js_ws(J);
                if (J->i >= J->n || J->s[J->i++] != ':') js_fail(J, "expected ':'");
                int sub = content == 0 ? (streq(k, "messages") ? 1 : 0)
                        : content == 2 ? (streq(k, "role") ? 4 : 3)
                        : content == 1 ? 0 : content;
                jval x = js_value(J, sub);
                obj_set(a, o, k, x);
                js_ws(J);
                if (J->i < J->n && J->s[J->i] == ',') { J->i++; continue; }
                if (J->i < J->n && J->s[J->i] == '}') { J->i++; break; }
                js_fail(J, "expected ',' or '}'");
            }
        v.t = V_OBJ;
        v.u.o = o;
    } else if (c == '[') {
        J->i++;
        jarr *r = ar_alloc(a, sizeof *r);
        memset(r, 0, sizeof *r);
        js_ws(J);
        if (J->i < J->n && J->s[J->i] == ']') J->i++;
        else
            while (1) {
                jval x = js_value(J, content == 1 ? 2 : content);
                if (r->n == r->cap) {
                    size_t cap = r->cap ? r->cap * 2 : 8;
                    jval *nv = ar_alloc(a, cap * sizeof *nv);
                    if (r->n) memcpy(nv, r->v, r->n * sizeof *nv);
                    r->v = nv;
                    r->cap = cap;
                }
                r->v[r->n++] = x;
                js_ws(J);
                if (J->i < J->n && J->s[J->i] == ',') { J->i++; continue; }
                if (J->i < J->n && J->s[J->i] == ']') { J->i++; break; }
                js_fail(J, "expected ',' or ']'");
            }
        v.t = V_ARR;
        v.u.a = r;
    } else if (c == '"') {
        /* strings of a message other than its role are content (also nested: tool calls) */
        v = vstr(js_string(J, content == 3));
    } else if (J->n - J->i >= 4 && !strncmp(J->s + J->i, "true", 4)) {
        J->i += 4;
        v = vbool(1);
    } else if (J->n - J->i >= 5 && !strncmp(J->s + J->i, "false", 5)) {
        J->i += 5;
        v = vbool(0);
    } else if (J->n - J->i >= 4 && !strncmp(J->s + J->i, "null", 4)) {
        J->i += 4;
        v = NONE;
    } else if (c == '-' || is_digit(c)) {
        size_t st0 = J->i;
        int flt = 0;
        if (J->s[J->i] == '-') J->i++;
        while (J->i < J->n && (is_digit(J->s[J->i]) || J->s[J->i] == '.' || J->s[J->i] == 'e' || J->s[J->i] == 'E' ||
                               ((J->s[J->i] == '-' || J->s[J->i] == '+') && (J->s[J->i - 1] == 'e' || J->s[J->i - 1] == 'E')))) {
            if (!is_digit(J->s[J->i])) flt = 1;
            J->i++;
        }
        char buf[64];
        size_t n = J->i - st0;
        if (n == 0 || n >= sizeof buf) js_fail(J, "bad number");
        memcpy(buf, J->s + st0, n);
        buf[n] = 0;
        v = flt ? vflt(strtod(buf, NULL)) : vint(strtoll(buf, NULL, 10));
    } else {
        js_fail(J, "unexpected character");
    }
    J->depth--;
    return v;
}

static void js_quote(arena *a, obuf *b, const jstr *s, int keep_mask)
{
    ob_puts(a, b, "\"");
    size_t start = b->len;
    for (size_t i = 0; i < s->len; i++) {
        unsigned char c = (unsigned char)s->s[i];
        char e[8];
        const char *o = NULL;
        switch (c) {
        case '"': o = "\\\""; break;
        case '\\': o = "\\\\"; break;
        case '\n': o = "\\n"; break;
        case '\r': o = "\\r"; break;
        case '\t': o = "\\t"; break;
        case '\b': o = "\\b"; break;
        case '\f': o = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(e, sizeof e, "\\u%04x", c);
                o = e;
            }
        }
        if (o) ob_puts(a, b, o);
        else ob_put(a, b, (const char *)&c, 1, NULL, 0);
    }
    if (keep_mask && s->mask && b->len > start) { /* content stays content, escaped as a whole */
        memset(b->m + start, 1, b->len - start);
        b->any = 1;
    }
    ob_puts(a, b, "\"");
}

/* shortest text that reads back as f; JS-like spelling when js (tojson: 3.0 → "3"),
 * the reference's {{ }} spelling otherwise (3.0 → "3.0") */
static void fmt_float(char *buf, size_t cap, double f, int js)
{
    if (isnan(f)) { snprintf(buf, cap, "NaN"); return; }
    if (isinf(f)) { snprintf(buf, cap, f > 0 ? "Infinity" : "-Infinity"); return; }
    if (f == floor(f) && fabs(f) < 1e21) {
        snprintf(buf, cap, js ? "%.0f" : "%.1f", f);
        if (!strcmp(buf, "-0") ) snprintf(buf, cap, "0");
        return;
    }
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, cap, "%.*g", p, f);
        if (strtod(buf, NULL) == f) break;
    }
    /* %g writes 1e-07; JS writes 1e-7 */
    char *e = strchr(buf, 'e');
    if (e) {
        char *d = e + 1;
        char sign = *d == '-' ? '-' : '+';
        if (*d == '-' || *d == '+') d++;
        while (*d == '0' && d[1]) d++;
        char tmp[32];
        snprintf(tmp, sizeof tmp, "e%c%s", sign, d);
        snprintf(e, cap - (size_t)(e - buf), "%s", tmp);
    }
}

static void to_json(jstate *S, obuf *b, jval v, int indent, int level, int keep_mask);

static void json_nl(arena *a, obuf *b, int indent, int level)
{
    if (indent < 0) return;
    ob_puts(a, b, "\n");
    for (int i = 0; i < indent * level; i++) ob_puts(a, b, " ");
}

static void to_json(jstate *S, obuf *b, jval v, int indent, int level, int keep_mask)
{
    arena *a = S->ar;
    char buf[64];
    if (level > MAX_DEPTH) failf(S, 0, "tojson: value nested too deep");
    switch (v.t) {
    case V_UNDEF: case V_NONE: ob_puts(a, b, "null"); break;
    case V_BOOL: ob_puts(a, b, v.u.b ? "true" : "false"); break;
    case V_INT: snprintf(buf, sizeof buf, "%lld", v.u.i); ob_puts(a, b, buf); break;
    case V_FLOAT: fmt_float(buf, sizeof buf, v.u.f, 1); ob_puts(a, b, buf); break;
    case V_STR: js_quote(a, b, v.u.s, keep_mask); break;
    case V_ARR:
        ob_puts(a, b, "[");
        for (size_t i = 0; i < v.u.a->n; i++) {
            if (i) ob_puts(a, b, indent >= 0 ? "," : ", ");
            json_nl(a, b, indent, level + 1);
            to_json(S, b, v.u.a->v[i], indent, level + 1, keep_mask);
        }
        if (v.u.a->n) json_nl(a, b, indent, level);
        ob_puts(a, b, "]");
        break;
    case V_OBJ:
        ob_puts(a, b, "{");
        for (size_t i = 0; i < v.u.o->n; i++) {
            if (i) ob_puts(a, b, indent >= 0 ? "," : ", ");
            json_nl(a, b, indent, level + 1);
            js_quote(a, b, v.u.o->k[i], keep_mask);
            ob_puts(a, b, ": ");
            to_json(S, b, v.u.o->v[i], indent, level + 1, keep_mask);
        }
        if (v.u.o->n) json_nl(a, b, indent, level);
        ob_puts(a, b, "}");
        break;
    default: ob_puts(a, b, "null"); break;
    }
}

int jinja_json_append_str(char **buf, size_t *blen, const char *s, size_t len)
{
    size_t need = *blen + len * 6 + 3;
    char *nb = realloc(*buf, need);
    if (!nb) return -1;
    *buf = nb;
    char *w = nb + *blen;
    *w++ = '"';
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') { *w++ = '\\'; *w++ = (char)c; }
        else if (c < 0x20) w += sprintf(w, "\\u%04x", c);
        else *w++ = (char)c;
    }
    *w++ = '"';
    *w = 0;
    *blen = (size_t)(w - nb);
    return 0;
}

/* ---- objects, scopes ----------------------------------------------------------------- */

static jval *obj_get(const jobj *o, const char *k, size_t klen)
{
    for (size_t i = 0; i < o->n; i++)
        if (o->k[i]->len == klen && !memcmp(o->k[i]->s, k, klen)) return &o->v[i];
    return NULL;
}

static void obj_set(arena *a, jobj *o, jstr *k, jval v)
{
    jval *p = obj_get(o, k->s, k->len);
    if (p) {
        *p = v;
        return;
    }
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 8;
        jstr **nk = ar_alloc(a, cap * sizeof *nk);
        jval *nv = ar_alloc(a, cap * sizeof *nv);
        if (o->n) {
            memcpy(nk, o->k, o->n * sizeof *nk);
            memcpy(nv, o->v, o->n * sizeof *nv);
        }
        o->k = nk;
        o->v = nv;
        o->cap = cap;
    }
    o->k[o->n] = k;
    o->v[o->n++] = v;
}

static void arr_push(arena *a, jarr *r, jval v)
{
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 8;
        jval *nv = ar_alloc(a, cap * sizeof *nv);
        if (r->n) memcpy(nv, r->v, r->n * sizeof *nv);
        r->v = nv;
        r->cap = cap;
    }
    r->v[r->n++] = v;
}

static jval new_arr(arena *a)
{
    jval v = { V_ARR, { 0 } };
    v.u.a = ar_alloc(a, sizeof *v.u.a);
    memset(v.u.a, 0, sizeof *v.u.a);
    return v;
}

static jval new_obj(arena *a)
{
    jval v = { V_OBJ, { 0 } };
    v.u.o = ar_alloc(a, sizeof *v.u.o);
    memset(v.u.o, 0, sizeof *v.u.o);
    return v;
}

typedef struct scope {
    struct scope *parent;
    jobj vars;
} scope;

enum { B_RANGE = 1, B_NAMESPACE, B_RAISE, B_STRFTIME, B_DICT };

typedef struct rt {
    jstate S;
    scope *globals;
    int64_t now;
    int depth;
    int loop_ctl; /* 1 break, 2 continue */
} rt;

static scope *new_scope(rt *R, scope *parent)
{
    scope *s = ar_alloc(R->S.ar, sizeof *s);
    memset(s, 0, sizeof *s);
    s->parent = parent;
    return s;
}

static jval lookup(rt *R, scope *sc, const jstr *name)
{
    for (scope *s = sc; s; s = s->parent) {
        jval *v = obj_get(&s->vars, name->s, name->len);
        if (v) return *v;
    }
    static const struct { const char *n; int b; } BUILTINS[] = {
        { "range", B_RANGE }, { "namespace", B_NAMESPACE }, { "raise_exception", B_RAISE },
        { "strftime_now", B_STRFTIME }, { "dict", B_DICT },
    };
    for (size_t i = 0; i < sizeof BUILTINS / sizeof BUILTINS[0]; i++)
        if (streq(name, BUILTINS[i].n)) {
            if (BUILTINS[i].b == B_STRFTIME && R->now < 0) break;
            jval v = { V_FUNC, { 0 } };
            v.u.fn = ar_alloc(R->S.ar, sizeof *v.u.fn);
            memset(v.u.fn, 0, sizeof *v.u.fn);
            v.u.fn->builtin = BUILTINS[i].b;
            return v;
        }
    return UNDEF;
}

/* ---- conversions --------------------------------------------------------------------- */

static int truthy(jval v)
{
    switch (v.t) {
    case V_BOOL: return v.u.b;
    case V_INT: return v.u.i != 0;
    case V_FLOAT: return v.u.f != 0;
    case V_STR: return v.u.s->len != 0;
    case V_ARR: return v.u.a->n != 0;
    case V_OBJ: return v.u.o->n != 0;
    case V_FUNC: return 1;
    default: return 0;
    }
}

static const char *type_name(jval v)
{
    static const char *const N[] = { "undefined", "none", "boolean", "integer", "float", "string", "list", "dict", "function" };
    return N[v.t];
}

/* text of a value as {{ }} prints it (the reference's spelling) */
static jstr *to_str(rt *R, jval v)
{
    arena *a = R->S.ar;
    char buf[64];
    switch (v.t) {
    case V_STR: return v.u.s;
    case V_UNDEF: case V_NONE: return cstr(a, "");
    case V_BOOL: return cstr(a, v.u.b ? "true" : "false");
    case V_INT: snprintf(buf, sizeof buf, "%lld", v.u.i); return cstr(a, buf);
    case V_FLOAT: fmt_float(buf, sizeof buf, v.u.f, 0); return cstr(a, buf);
    case V_ARR: case V_OBJ: {
        obuf b = { 0 };
        to_json(&R->S, &b, v, -1, 0, 1);
        return ob_str(a, &b);
    }
    default: return cstr(a, "");
    }
}

static double num(jval v) { return v.t == V_INT ? (double)v.u.i : v.t == V_FLOAT ? v.u.f : v.t == V_BOOL ? v.u.b : 0; }
static int is_num(jval v) { return v.t == V_INT || v.t == V_FLOAT || v.t == V_BOOL; }

static int equal(jval x, jval y)
{
    if (is_num(x) && is_num(y)) {
        if (x.t == V_BOOL || y.t == V_BOOL) return x.t == y.t && x.u.b == y.u.b;
        return num(x) == num(y);
    }
    if (x.t != y.t) return 0;
    switch (x.t) {
    case V_UNDEF: case V_NONE: return 1;
    case V_STR: return x.u.s->len == y.u.s->len && !memcmp(x.u.s->s, y.u.s->s, x.u.s->len);
    case V_ARR: return x.u.a == y.u.a;
    case V_OBJ: return x.u.o == y.u.o;
    case V_FUNC: return x.u.fn == y.u.fn;
    default: return 0;
    }
}

static jstr *substr(arena *a, const jstr *s, size_t off, size_t len)
{
    return mkstr(a, s->s + off, len, s->mask ? s->mask + off : NULL);
}

static jstr *concat(arena *a, const jstr *x, const jstr *y)
{
    obuf b = { 0 };
    ob_putj(a, &b, x);
    ob_putj(a, &b, y);
    return ob_str(a, &b);
}

/* ---- evaluation ---------------------------------------------------------------------- */

static jval eval(rt *R, scope *sc, const node *n);
static void exec_body(rt *R, scope *sc, node *const *body, size_t n, obuf *out);

typedef struct args {
    jval pos[8];
    size_t n;
    jstr *kn[8];
    jval kv[8];
    size_t nk;
} args;

static void eval_args(rt *R, scope *sc, const node *n, args *A, size_t skip)
{
    (void)skip;
    A->n = 0;
    A->nk = 0;
    if (n->n > 8 || n->n2 > 8) failf(&R->S, n->line, "too many arguments");
    for (size_t i = 0; i < n->n; i++) A->pos[A->n++] = eval(R, sc, n->list[i]);
    for (size_t i = 0; i < n->n2; i++) {
        A->kn[A->nk] = n->names[i];
        A->kv[A->nk++] = eval(R, sc, n->list2[i]);
    }
}

/* argument i by position or by name, else UNDEF */
static jval arg(const args *A, size_t i, const char *name)
{
    if (i < A->n) return A->pos[i];
    for (size_t k = 0; k < A->nk; k++)
        if (name && streq(A->kn[k], name)) return A->kv[k];
    return UNDEF;
}

static jstr *want_str(rt *R, int line, jval v, const char *what)
{
    if (v.t != V_STR) failf(&R->S, line, "%s expects a string, got %s", what, type_name(v));
    return v.u.s;
}

static int in_set(char c, const jstr *chars)
{
    if (!chars) return is_ws(c);
    return memchr(chars->s, c, chars->len) != NULL;
}

static jstr *strip(rt *R, const jstr *s, int left, int right, const jstr *chars)
{
    size_t b = 0, e = s->len;
    if (left) while (b < e && in_set(s->s[b], chars)) b++;
    if (right) while (e > b && in_set(s->s[e - 1], chars)) e--;
    return substr(R->S.ar, s, b, e - b);
}

static jstr *case_map(rt *R, const jstr *s, int mode) /* 0 lower, 1 upper, 2 title, 3 capitalize */
{
    jstr *r = mkstr(R->S.ar, s->s, s->len, s->mask);
    char *p = (char *)r->s;
    int start = 1;
    for (size_t i = 0; i < r->len; i++) {
        char c = p[i];
        int alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        int up = mode == 1 || ((mode == 2 || mode == 3) && start && alpha);
        if (mode == 3 && !start) up = 0;
        if (up && c >= 'a' && c <= 'z') p[i] = (char)(c - 32);
        if (!up && c >= 'A' && c <= 'Z' && mode != 1) p[i] = (char)(c + 32);
        if (mode == 2) start = !alpha;
        else if (mode == 3) start = 0;
    }
    return r;
}

static jval split(rt *R, const jstr *s, const jstr *sep, long long maxsplit)
{
    jval out = new_arr(R->S.ar);
    arena *a = R->S.ar;
    size_t i = 0;
    if (!sep) { /* runs of whitespace, no empty pieces */
        while (1) {
            while (i < s->len && is_ws(s->s[i])) i++;
            if (i >= s->len) break;
            if (maxsplit >= 0 && (long long)out.u.a->n == maxsplit) {
                size_t e = s->len;
                while (e > i && is_ws(s->s[e - 1])) e--;
                arr_push(a, out.u.a, vstr(substr(a, s, i, e - i)));
                break;
            }
            size_t j = i;
            while (j < s->len && !is_ws(s->s[j])) j++;
            arr_push(a, out.u.a, vstr(substr(a, s, i, j - i)));
            i = j;
        }
        return out;
    }
    if (!sep->len) failf(&R->S, 0, "split: empty separator");
    while (1) {
        const char *hit = NULL;
        if (maxsplit < 0 || (long long)out.u.a->n < maxsplit)
            for (size_t j = i; j + sep->len <= s->len; j++)
                if (!memcmp(s->s + j, sep->s, sep->len)) { hit = s->s + j; break; }
        if (!hit) {
            arr_push(a, out.u.a, vstr(substr(a, s, i, s->len - i)));
            break;
        }
        size_t j = (size_t)(hit - s->s);
        arr_push(a, out.u.a, vstr(substr(a, s, i, j - i)));
        i = j + sep->len;
    }
    return out;
}

static jstr *replace(rt *R, const jstr *s, const jstr *old, const jstr *nw, long long count)
{
    arena *a = R->S.ar;
    obuf b = { 0 };
    size_t i = 0;
    long long done = 0;
    if (!old->len) return mkstr(R->S.ar, s->s, s->len, s->mask);
    while (i < s->len) {
        if ((count < 0 || done < count) && i + old->len <= s->len && !memcmp(s->s + i, old->s, old->len)) {
            ob_putj(a, &b, nw);
            i += old->len;
            done++;
        } else {
            ob_put(a, &b, s->s + i, 1, s->mask ? s->mask + i : NULL, 0);
            i++;
        }
    }
    return ob_str(a, &b);
}

static int starts_with(const jstr *s, const jstr *p) { return p->len <= s->len && !memcmp(s->s, p->s, p->len); }
static int ends_with(const jstr *s, const jstr *p) { return p->len <= s->len && !memcmp(s->s + s->len - p->len, p->s, p->len); }

static long long idx_norm(long long i, size_t n) { return i < 0 ? i + (long long)n : i; }

static jval get_item(rt *R, jval o, jval k)
{
    if (o.t == V_OBJ) {
        if (k.t != V_STR) {
            jstr *ks = to_str(R, k);
            jval *v = obj_get(o.u.o, ks->s, ks->len);
            return v ? *v : UNDEF;
        }
        jval *v = obj_get(o.u.o, k.u.s->s, k.u.s->len);
        return v ? *v : UNDEF;
    }
    if ((o.t == V_ARR || o.t == V_STR) && (k.t == V_INT || k.t == V_BOOL)) {
        size_t n = o.t == V_ARR ? o.u.a->n : o.u.s->len;
        long long i = idx_norm(k.t == V_INT ? k.u.i : k.u.b, n);
        if (i < 0 || i >= (long long)n) return UNDEF;
        if (o.t == V_ARR) return o.u.a->v[i];
        return vstr(substr(R->S.ar, o.u.s, (size_t)i, 1));
    }
    return UNDEF;
}

static jval get_attr(rt *R, jval o, const jstr *name)
{
    if (o.t == V_OBJ) {
        jval *v = obj_get(o.u.o, name->s, name->len);
        return v ? *v : UNDEF;
    }
    (void)R;
    return UNDEF;
}

static jval slice(rt *R, int line, jval o, jval lo, jval hi, jval step)
{
    if (o.t != V_ARR && o.t != V_STR) failf(&R->S, line, "cannot slice a %s", type_name(o));
    long long n = (long long)(o.t == V_ARR ? o.u.a->n : o.u.s->len);
    long long stp = step.t == V_INT ? step.u.i : 1;
    if (stp == 0) failf(&R->S, line, "slice step cannot be zero");
    long long b, e;
    if (stp > 0) {
        b = lo.t == V_INT ? idx_norm(lo.u.i, (size_t)n) : 0;
        e = hi.t == V_INT ? idx_norm(hi.u.i, (size_t)n) : n;
        if (b < 0) b = 0;
        if (b > n) b = n;
        if (e < 0) e = 0;
        if (e > n) e = n;
    } else {
        b = lo.t == V_INT ? idx_norm(lo.u.i, (size_t)n) : n - 1;
        e = hi.t == V_INT ? idx_norm(hi.u.i, (size_t)n) : -1;
        if (b >= n) b = n - 1;
        if (b < -1) b = -1;
        if (e < -1) e = -1;
        if (e >= n) e = n - 1;
    }
    arena *a = R->S.ar;
    if (o.t == V_STR) {
        if (stp == 1) return vstr(substr(a, o.u.s, (size_t)b, e > b ? (size_t)(e - b) : 0));
        obuf ob = { 0 };
        for (long long i = b; stp > 0 ? i < e : i > e; i += stp)
            ob_put(a, &ob, o.u.s->s + i, 1, o.u.s->mask ? o.u.s->mask + i : NULL, 0);
        return vstr(ob_str(a, &ob));
    }
    jval r = new_arr(a);
    for (long long i = b; stp > 0 ? i < e : i > e; i += stp) arr_push(a, r.u.a, o.u.a->v[i]);
    return r;
}

/* items of an iterable as a list: list → itself, dict → keys, string → characters */
static jval iter_list(rt *R, int line, jval v)
{
    arena *a = R->S.ar;
    if (v.t == V_ARR) return v;
    jval r = new_arr(a);
    if (v.t == V_OBJ) {
        for (size_t i = 0; i < v.u.o->n; i++) arr_push(a, r.u.a, vstr(v.u.o->k[i]));
        return r;
    }
    if (v.t == V_STR) {
        for (size_t i = 0; i < v.u.s->len;) { /* whole UTF-8 characters */
            size_t k = 1;
            unsigned char c = (unsigned char)v.u.s->s[i];
            if (c >= 0xF0) k = 4;
            else if (c >= 0xE0) k = 3;
            else if (c >= 0xC0) k = 2;
            if (i + k > v.u.s->len) k = v.u.s->len - i;
            arr_push(a, r.u.a, vstr(substr(a, v.u.s, i, k)));
            i += k;
        }
        return r;
    }
    if (v.t == V_UNDEF || v.t == V_NONE) return r;
    failf(&R->S, line, "cannot iterate over a %s", type_name(v));
}

static jval items_of(rt *R, int line, jval v)
{
    arena *a = R->S.ar;
    if (v.t == V_UNDEF || v.t == V_NONE) return new_arr(a);
    if (v.t != V_OBJ) failf(&R->S, line, "items() of a %s", type_name(v));
    jval r = new_arr(a);
    for (size_t i = 0; i < v.u.o->n; i++) {
        jval p = new_arr(a);
        arr_push(a, p.u.a, vstr(v.u.o->k[i]));
        arr_push(a, p.u.a, v.u.o->v[i]);
        arr_push(a, r.u.a, p);
    }
    return r;
}

static int compare(rt *R, int line, jval x, jval y) /* <0, 0, >0 */
{
    if (is_num(x) && is_num(y)) {
        double a = num(x), b = num(y);
        return a < b ? -1 : a > b;
    }
    if (x.t == V_STR && y.t == V_STR) {
        size_t n = x.u.s->len < y.u.s->len ? x.u.s->len : y.u.s->len;
        int c = memcmp(x.u.s->s, y.u.s->s, n);
        if (c) return c;
        return x.u.s->len < y.u.s->len ? -1 : x.u.s->len > y.u.s->len;
    }
    failf(&R->S, line, "cannot compare a %s with a %s", type_name(x), type_name(y));
}

static int contains(rt *R, int line, jval hay, jval needle)
{
    if (hay.t == V_STR) {
        if (needle.t != V_STR) failf(&R->S, line, "'in <string>' needs a string, got %s", type_name(needle));
        const jstr *h = hay.u.s, *nd = needle.u.s;
        if (!nd->len) return 1;
        for (size_t i = 0; i + nd->len <= h->len; i++)
            if (!memcmp(h->s + i, nd->s, nd->len)) return 1;
        return 0;
    }
    if (hay.t == V_ARR) {
        for (size_t i = 0; i < hay.u.a->n; i++)
            if (equal(hay.u.a->v[i], needle)) return 1;
        return 0;
    }
    if (hay.t == V_OBJ) {
        if (needle.t != V_STR) return 0;
        return obj_get(hay.u.o, needle.u.s->s, needle.u.s->len) != NULL;
    }
    if (hay.t == V_UNDEF || hay.t == V_NONE) return 0;
    failf(&R->S, line, "'in' a %s", type_name(hay));
}

static jval binop(rt *R, int line, int op, jval x, jval y)
{
    arena *a = R->S.ar;
    switch (op) {
    case OP_CONCAT: return vstr(concat(a, to_str(R, x), to_str(R, y)));
    case OP_ADD:
        if (x.t == V_STR || y.t == V_STR) {
            if ((x.t == V_STR || is_num(x)) && (y.t == V_STR || is_num(y)))
                return vstr(concat(a, to_str(R, x), to_str(R, y)));
            break;
        }
        if (x.t == V_ARR && y.t == V_ARR) {
            jval r = new_arr(a);
            for (size_t i = 0; i < x.u.a->n; i++) arr_push(a, r.u.a, x.u.a->v[i]);
            for (size_t i = 0; i < y.u.a->n; i++) arr_push(a, r.u.a, y.u.a->v[i]);
            return r;
        }
        /* fall through */
    case OP_SUB: case OP_MUL: case OP_DIV: case OP_FLOORDIV: case OP_MOD: case OP_POW: {
        if (!is_num(x) || !is_num(y)) break;
        int ints = x.t != V_FLOAT && y.t != V_FLOAT;
        /* integers whose result does not fit 64 bits become floats (the reference's numbers are doubles) */
        long long xi = !ints ? 0 : x.t == V_INT ? x.u.i : (long long)num(x);
        long long yi = !ints ? 0 : y.t == V_INT ? y.u.i : (long long)num(y), ri;
        if (ints && (op == OP_FLOORDIV || op == OP_MOD) && xi == LLONG_MIN && yi == -1) ints = 0;
        double xf = num(x), yf = num(y);
        switch (op) {
        case OP_ADD: return ints && !__builtin_add_overflow(xi, yi, &ri) ? vint(ri) : vflt(xf + yf);
        case OP_SUB: return ints && !__builtin_sub_overflow(xi, yi, &ri) ? vint(ri) : vflt(xf - yf);
        case OP_MUL: return ints && !__builtin_mul_overflow(xi, yi, &ri) ? vint(ri) : vflt(xf * yf);
        case OP_DIV:
            if (yf == 0) failf(&R->S, line, "division by zero");
            return vflt(xf / yf);
        case OP_FLOORDIV:
            if (yf == 0) failf(&R->S, line, "division by zero");
            if (ints) {
                long long q = xi / yi;
                if ((xi % yi != 0) && ((xi < 0) != (yi < 0))) q--;
                return vint(q);
            }
            return vflt(floor(xf / yf));
        case OP_MOD:
            if (yf == 0) failf(&R->S, line, "modulo by zero");
            if (ints) {
                long long m = xi % yi;
                if (m != 0 && ((m < 0) != (yi < 0))) m += yi;
                return vint(m);
            }
            return vflt(xf - floor(xf / yf) * yf);
        case OP_POW:
            if (ints && yi >= 0) {
                long long r = 1;
                int over = 0;
                for (long long i = 0; i < yi && i < 64 && !over; i++) over = __builtin_mul_overflow(r, xi, &r);
                if (!over) return vint(r);
            }
            return vflt(pow(xf, yf));
        }
        break;
    }
    case OP_EQ: return vbool(equal(x, y));
    case OP_NE: return vbool(!equal(x, y));
    case OP_LT: return vbool(compare(R, line, x, y) < 0);
    case OP_LE: return vbool(compare(R, line, x, y) <= 0);
    case OP_GT: return vbool(compare(R, line, x, y) > 0);
    case OP_GE: return vbool(compare(R, line, x, y) >= 0);
    case OP_IN: return vbool(contains(R, line, y, x));
    case OP_NOTIN: return vbool(!contains(R, line, y, x));
    }
    static const char *const OPN[] = { "", "+", "-", "*", "/", "//", "%", "**", "~" };
    failf(&R->S, line, "unsupported operand types for %s: %s and %s", op <= OP_CONCAT ? OPN[op] : "?", type_name(x),
          type_name(y));
}

static int run_test(rt *R, int line, const jstr *name, jval v, const args *A);
static jval run_filter(rt *R, scope *sc, int line, const jstr *name, jval v, const args *A);

/* selectattr/rejectattr/select/reject: test named by args[first], its argument after */
static jval select_items(rt *R, int line, jval seq, const args *A, int by_attr, int keep)
{
    arena *a = R->S.ar;
    jval list = iter_list(R, line, seq);
    jval r = new_arr(a);
    size_t t0 = by_attr ? 1 : 0;
    jstr *attr = NULL;
    if (by_attr) attr = want_str(R, line, arg(A, 0, NULL), "selectattr");
    jval tname = arg(A, t0, NULL);
    args TA = { { { 0 } }, 0, { 0 }, { { 0 } }, 0 };
    for (size_t i = t0 + 1; i < A->n && TA.n < 8; i++) TA.pos[TA.n++] = A->pos[i];
    for (size_t i = 0; i < list.u.a->n; i++) {
        jval item = list.u.a->v[i];
        jval x = by_attr ? get_attr(R, item, attr) : item;
        int ok = tname.t == V_STR ? run_test(R, line, tname.u.s, x, &TA) : truthy(x);
        if (ok == keep) arr_push(a, r.u.a, item);
    }
    return r;
}

static int run_test(rt *R, int line, const jstr *name, jval v, const args *A)
{
    const char *n = name->s;
    jval x = arg(A, 0, NULL);
    if (!strcmp(n, "defined")) return v.t != V_UNDEF;
    if (!strcmp(n, "undefined")) return v.t == V_UNDEF;
    if (!strcmp(n, "none")) return v.t == V_NONE;
    if (!strcmp(n, "string")) return v.t == V_STR;
    if (!strcmp(n, "number")) return v.t == V_INT || v.t == V_FLOAT;
    if (!strcmp(n, "integer")) return v.t == V_INT;
    if (!strcmp(n, "float")) return v.t == V_FLOAT;
    if (!strcmp(n, "boolean")) return v.t == V_BOOL;
    if (!strcmp(n, "true")) return v.t == V_BOOL && v.u.b;
    if (!strcmp(n, "false")) return v.t == V_BOOL && !v.u.b;
    if (!strcmp(n, "mapping")) return v.t == V_OBJ;
    if (!strcmp(n, "iterable")) return v.t == V_ARR || v.t == V_OBJ || v.t == V_STR;
    if (!strcmp(n, "sequence")) return v.t == V_ARR || v.t == V_OBJ || v.t == V_STR;
    if (!strcmp(n, "callable")) return v.t == V_FUNC;
    if (!strcmp(n, "odd")) return v.t == V_INT && (v.u.i % 2 != 0);
    if (!strcmp(n, "even")) return v.t == V_INT && v.u.i % 2 == 0;
    if (!strcmp(n, "divisibleby")) return v.t == V_INT && x.t == V_INT && x.u.i && v.u.i % x.u.i == 0;
    if (!strcmp(n, "lower")) return v.t == V_STR && case_map(R, v.u.s, 0)->len == v.u.s->len && !memcmp(case_map(R, v.u.s, 0)->s, v.u.s->s, v.u.s->len);
    if (!strcmp(n, "upper")) return v.t == V_STR && !memcmp(case_map(R, v.u.s, 1)->s, v.u.s->s, v.u.s->len);
    if (!strcmp(n, "equalto") || !strcmp(n, "eq") || !strcmp(n, "==")) return equal(v, x);
    if (!strcmp(n, "ne") || !strcmp(n, "!=")) return !equal(v, x);
    if (!strcmp(n, "sameas")) return equal(v, x) && v.t == x.t;
    if (!strcmp(n, "lt") || !strcmp(n, "lessthan")) return compare(R, line, v, x) < 0;
    if (!strcmp(n, "le")) return compare(R, line, v, x) <= 0;
    if (!strcmp(n, "gt") || !strcmp(n, "greaterthan")) return compare(R, line, v, x) > 0;
    if (!strcmp(n, "ge")) return compare(R, line, v, x) >= 0;
    if (!strcmp(n, "in")) return contains(R, line, x, v);
    failf(&R->S, line, "unknown test '%s'", n);
}

static jstr *join(rt *R, int line, jval seq, const jstr *sep, const jstr *attr)
{
    arena *a = R->S.ar;
    jval list = iter_list(R, line, seq);
    obuf b = { 0 };
    for (size_t i = 0; i < list.u.a->n; i++) {
        if (i && sep) ob_putj(a, &b, sep);
        jval x = list.u.a->v[i];
        if (attr) x = get_attr(R, x, attr);
        ob_putj(a, &b, to_str(R, x));
    }
    return ob_str(a, &b);
}

static jval call_macro(rt *R, int line, const jfunc *f, const args *A);

static int cmp_sort(rt *R, jval x, jval y) { return compare(R, 0, x, y); }

static jval run_filter(rt *R, scope *sc, int line, const jstr *name, jval v, const args *A)
{
    arena *a = R->S.ar;
    const char *n = name->s;
    (void)sc;
    if (!strcmp(n, "trim")) {
        jval chars = arg(A, 0, "chars");
        return vstr(strip(R, want_str(R, line, v, "trim"), 1, 1, chars.t == V_STR ? chars.u.s : NULL));
    }
    if (!strcmp(n, "length") || !strcmp(n, "count")) {
        if (v.t == V_STR) { /* characters, not bytes */
            long long c = 0;
            for (size_t i = 0; i < v.u.s->len; i++) c += ((unsigned char)v.u.s->s[i] & 0xC0) != 0x80;
            return vint(c);
        }
        if (v.t == V_ARR) return vint((long long)v.u.a->n);
        if (v.t == V_OBJ) return vint((long long)v.u.o->n);
        if (v.t == V_UNDEF || v.t == V_NONE) return vint(0);
        failf(&R->S, line, "length of a %s", type_name(v));
    }
    if (!strcmp(n, "tojson")) {
        jval ind = arg(A, 0, "indent");
        obuf b = { 0 };
        to_json(&R->S, &b, v, ind.t == V_INT ? (int)ind.u.i : -1, 0, 1);
        return vstr(ob_str(a, &b));
    }
    if (!strcmp(n, "upper")) return vstr(case_map(R, want_str(R, line, v, "upper"), 1));
    if (!strcmp(n, "lower")) return vstr(case_map(R, want_str(R, line, v, "lower"), 0));
    if (!strcmp(n, "title")) return vstr(case_map(R, want_str(R, line, v, "title"), 2));
    if (!strcmp(n, "capitalize")) return vstr(case_map(R, want_str(R, line, v, "capitalize"), 3));
    if (!strcmp(n, "string")) return vstr(to_str(R, v));
    if (!strcmp(n, "safe")) return v;
    if (!strcmp(n, "join")) {
        jval sep = arg(A, 0, "d");
        jval attr = arg(A, 1, "attribute");
        return vstr(join(R, line, v, sep.t == V_STR ? sep.u.s : NULL, attr.t == V_STR ? attr.u.s : NULL));
    }
    if (!strcmp(n, "default") || !strcmp(n, "d")) {
        jval dv = arg(A, 0, "default_value");
        jval boolean = arg(A, 1, "boolean");
        if (v.t == V_UNDEF || (truthy(boolean) && !truthy(v))) return dv.t == V_UNDEF ? vstr(cstr(a, "")) : dv;
        return v;
    }
    if (!strcmp(n, "items")) return items_of(R, line, v);
    if (!strcmp(n, "list")) {
        jval l = iter_list(R, line, v);
        jval r = new_arr(a);
        for (size_t i = 0; i < l.u.a->n; i++) arr_push(a, r.u.a, l.u.a->v[i]);
        return r;
    }
    if (!strcmp(n, "first") || !strcmp(n, "last")) {
        jval l = iter_list(R, line, v);
        if (!l.u.a->n) return UNDEF;
        return l.u.a->v[n[0] == 'f' ? 0 : l.u.a->n - 1];
    }
    if (!strcmp(n, "reverse")) {
        if (v.t == V_STR) return slice(R, line, v, UNDEF, UNDEF, vint(-1));
        jval l = iter_list(R, line, v);
        return slice(R, line, l, UNDEF, UNDEF, vint(-1));
    }
    if (!strcmp(n, "replace")) {
        jval old = arg(A, 0, "old"), nw = arg(A, 1, "new"), cnt = arg(A, 2, "count");
        return vstr(replace(R, want_str(R, line, v, "replace"), want_str(R, line, old, "replace"),
                            want_str(R, line, nw, "replace"), cnt.t == V_INT ? cnt.u.i : -1));
    }
    if (!strcmp(n, "int")) {
        jval dflt = arg(A, 0, "default");
        if (v.t == V_INT) return v;
        if (v.t == V_FLOAT) return vint((long long)v.u.f);
        if (v.t == V_BOOL) return vint(v.u.b);
        if (v.t == V_STR) {
            char *end;
            double d = strtod(v.u.s->s, &end);
            if (end != v.u.s->s) return vint((long long)d);
        }
        return dflt.t == V_INT ? dflt : vint(0);
    }
    if (!strcmp(n, "float")) {
        if (is_num(v)) return vflt(num(v));
        if (v.t == V_STR) {
            char *end;
            double d = strtod(v.u.s->s, &end);
            if (end != v.u.s->s) return vflt(d);
        }
        return vflt(0);
    }
    if (!strcmp(n, "abs")) {
        if (v.t == V_INT) return vint(v.u.i < 0 ? -v.u.i : v.u.i);
        if (v.t == V_FLOAT) return vflt(fabs(v.u.f));
        failf(&R->S, line, "abs of a %s", type_name(v));
    }
    if (!strcmp(n, "round")) {
        jval prec = arg(A, 0, "precision");
        double p = pow(10, prec.t == V_INT ? (double)prec.u.i : 0);
        return vflt(round(num(v) * p) / p);
    }
    if (!strcmp(n, "selectattr")) return select_items(R, line, v, A, 1, 1);
    if (!strcmp(n, "rejectattr")) return select_items(R, line, v, A, 1, 0);
    if (!strcmp(n, "select")) return select_items(R, line, v, A, 0, 1);
    if (!strcmp(n, "reject")) return select_items(R, line, v, A, 0, 0);
    if (!strcmp(n, "map")) {
        jval l = iter_list(R, line, v);
        jval r = new_arr(a);
        jval attr = arg(A, (size_t)-1, "attribute");
        jval dflt = arg(A, (size_t)-1, "default");
        for (size_t i = 0; i < l.u.a->n; i++) {
            jval x = l.u.a->v[i];
            if (attr.t == V_STR) {
                x = get_attr(R, x, attr.u.s);
                if (x.t == V_UNDEF && dflt.t != V_UNDEF) x = dflt;
            } else if (A->n >= 1 && A->pos[0].t == V_STR) {
                args FA = { { { 0 } }, 0, { 0 }, { { 0 } }, 0 };
                for (size_t k = 1; k < A->n; k++) FA.pos[FA.n++] = A->pos[k];
                x = run_filter(R, sc, line, A->pos[0].u.s, x, &FA);
            } else {
                failf(&R->S, line, "map needs attribute= or a filter name");
            }
            arr_push(a, r.u.a, x);
        }
        return r;
    }
    if (!strcmp(n, "unique")) {
        jval l = iter_list(R, line, v);
        jval r = new_arr(a);
        for (size_t i = 0; i < l.u.a->n; i++) {
            int seen = 0;
            for (size_t k = 0; k < r.u.a->n && !seen; k++) seen = equal(r.u.a->v[k], l.u.a->v[i]);
            if (!seen) arr_push(a, r.u.a, l.u.a->v[i]);
        }
        return r;
    }
    if (!strcmp(n, "sort")) {
        jval l = iter_list(R, line, v);
        jval r = new_arr(a);
        jval rev = arg(A, 0, "reverse");
        jval attr = arg(A, 2, "attribute");
        for (size_t i = 0; i < l.u.a->n; i++) arr_push(a, r.u.a, l.u.a->v[i]);
        for (size_t i = 1; i < r.u.a->n; i++) { /* stable insertion sort */
            jval x = r.u.a->v[i];
            jval kx = attr.t == V_STR ? get_attr(R, x, attr.u.s) : x;
            size_t j = i;
            while (j > 0) {
                jval y = r.u.a->v[j - 1];
                jval ky = attr.t == V_STR ? get_attr(R, y, attr.u.s) : y;
                int c = cmp_sort(R, ky, kx);
                if (truthy(rev) ? c >= 0 : c <= 0) break;
                r.u.a->v[j] = y;
                j--;
            }
            r.u.a->v[j] = x;
        }
        return r;
    }
    if (!strcmp(n, "indent")) {
        jval w = arg(A, 0, "width"), first = arg(A, 1, "first"), blank = arg(A, 2, "blank");
        char pad[256];
        size_t pw = 4;
        if (w.t == V_INT) pw = w.u.i < 0 ? 0 : w.u.i > 255 ? 255 : (size_t)w.u.i;
        const jstr *ps = NULL;
        if (w.t == V_STR) ps = w.u.s;
        memset(pad, ' ', pw);
        jstr padj = { pw, pad, NULL };
        if (!ps) ps = &padj;
        const jstr *s = want_str(R, line, v, "indent");
        obuf b = { 0 };
        int at_line_start = 1;
        for (size_t i = 0; i < s->len; i++) {
            if (at_line_start) {
                int empty = s->s[i] == '\n';
                if ((i > 0 || truthy(first)) && (!empty || truthy(blank))) ob_putj(a, &b, ps);
                at_line_start = 0;
            }
            ob_put(a, &b, s->s + i, 1, s->mask ? s->mask + i : NULL, 0);
            if (s->s[i] == '\n') at_line_start = 1;
        }
        return vstr(ob_str(a, &b));
    }
    if (!strcmp(n, "dictsort")) {
        jval it = items_of(R, line, v);
        jarr *r = it.u.a;
        for (size_t i = 1; i < r->n; i++) {
            jval x = r->v[i];
            size_t j = i;
            while (j > 0 && compare(R, line, r->v[j - 1].u.a->v[0], x.u.a->v[0]) > 0) {
                r->v[j] = r->v[j - 1];
                j--;
            }
            r->v[j] = x;
        }
        return it;
    }
    failf(&R->S, line, "unknown filter '%s'", n);
}

/* x.method(args) for strings, dicts and lists; *handled = 0 when not a method */
static jval call_method(rt *R, int line, jval o, const jstr *m, const args *A, int *handled)
{
    arena *a = R->S.ar;
    *handled = 1;
    const char *n = m->s;
    jval x0 = arg(A, 0, NULL), x1 = arg(A, 1, NULL);
    if (o.t == V_STR) {
        const jstr *s = o.u.s;
        if (!strcmp(n, "strip") || !strcmp(n, "lstrip") || !strcmp(n, "rstrip")) {
            const jstr *chars = x0.t == V_STR ? x0.u.s : NULL;
            return vstr(strip(R, s, n[0] != 'r', n[0] != 'l', chars));
        }
        if (!strcmp(n, "split")) return split(R, s, x0.t == V_STR ? x0.u.s : NULL, x1.t == V_INT ? x1.u.i : -1);
        if (!strcmp(n, "startswith") || !strcmp(n, "endswith")) {
            int (*f)(const jstr *, const jstr *) = n[0] == 's' ? starts_with : ends_with;
            if (x0.t == V_STR) return vbool(f(s, x0.u.s));
            if (x0.t == V_ARR) {
                for (size_t i = 0; i < x0.u.a->n; i++)
                    if (x0.u.a->v[i].t == V_STR && f(s, x0.u.a->v[i].u.s)) return vbool(1);
                return vbool(0);
            }
            failf(&R->S, line, "%s expects a string", n);
        }
        if (!strcmp(n, "replace"))
            return vstr(replace(R, s, want_str(R, line, x0, "replace"), want_str(R, line, x1, "replace"),
                                arg(A, 2, NULL).t == V_INT ? arg(A, 2, NULL).u.i : -1));
        if (!strcmp(n, "upper")) return vstr(case_map(R, s, 1));
        if (!strcmp(n, "lower")) return vstr(case_map(R, s, 0));
        if (!strcmp(n, "title")) return vstr(case_map(R, s, 2));
        if (!strcmp(n, "capitalize")) return vstr(case_map(R, s, 3));
        if (!strcmp(n, "find") || !strcmp(n, "count")) {
            const jstr *nd = want_str(R, line, x0, n);
            long long cnt = 0;
            for (size_t i = 0; i + nd->len <= s->len; i++)
                if (!memcmp(s->s + i, nd->s, nd->len)) {
                    if (n[0] == 'f') return vint((long long)i);
                    cnt++;
                    if (nd->len) i += nd->len - 1;
                }
            return vint(n[0] == 'f' ? -1 : cnt);
        }
    } else if (o.t == V_OBJ) {
        if (!strcmp(n, "get")) {
            jval k = x0;
            if (k.t != V_STR) return x1.t == V_UNDEF ? NONE : x1;
            jval *v = obj_get(o.u.o, k.u.s->s, k.u.s->len);
            return v ? *v : x1.t == V_UNDEF ? NONE : x1;
        }
        if (!strcmp(n, "items")) return items_of(R, line, o);
        if (!strcmp(n, "keys")) return iter_list(R, line, o);
        if (!strcmp(n, "values")) {
            jval r = new_arr(a);
            for (size_t i = 0; i < o.u.o->n; i++) arr_push(a, r.u.a, o.u.o->v[i]);
            return r;
        }
    } else if (o.t == V_ARR) {
        if (!strcmp(n, "append")) {
            arr_push(a, o.u.a, x0);
            return NONE;
        }
    }
    *handled = 0;
    return UNDEF;
}

static void fmt_strftime(rt *R, int line, const jstr *fmt, obuf *b)
{
    time_t t = (time_t)R->now;
    struct tm tm;
    if (!gmtime_r(&t, &tm)) failf(&R->S, line, "strftime_now: bad clock");
    char buf[256];
    size_t n = strftime(buf, sizeof buf, fmt->s, &tm);
    ob_put(R->S.ar, b, buf, n, NULL, 0);
}

static jval call_builtin(rt *R, int line, int which, const args *A)
{
    arena *a = R->S.ar;
    switch (which) {
    case B_RANGE: {
        long long lo = 0, hi, stp = 1;
        if (A->n == 1) hi = num(A->pos[0]);
        else if (A->n >= 2) {
            lo = (long long)num(A->pos[0]);
            hi = (long long)num(A->pos[1]);
            if (A->n >= 3) stp = (long long)num(A->pos[2]);
        } else failf(&R->S, line, "range() needs an argument");
        if (stp == 0) failf(&R->S, line, "range() step is zero");
        jval r = new_arr(a);
        for (long long i = lo; stp > 0 ? i < hi : i > hi; i += stp) {
            if (r.u.a->n > 10000000) failf(&R->S, line, "range() too long");
            arr_push(a, r.u.a, vint(i));
        }
        return r;
    }
    case B_NAMESPACE: case B_DICT: {
        jval o = new_obj(a);
        if (A->n && A->pos[0].t == V_OBJ)
            for (size_t i = 0; i < A->pos[0].u.o->n; i++) obj_set(a, o.u.o, A->pos[0].u.o->k[i], A->pos[0].u.o->v[i]);
        for (size_t i = 0; i < A->nk; i++) obj_set(a, o.u.o, A->kn[i], A->kv[i]);
        return o;
    }
    case B_RAISE: {
        jstr *m = to_str(R, arg(A, 0, NULL));
        failf(&R->S, line, "raise_exception: %.*s", (int)(m->len > 300 ? 300 : m->len), m->s);
    }
    case B_STRFTIME: {
        obuf b = { 0 };
        fmt_strftime(R, line, want_str(R, line, arg(A, 0, NULL), "strftime_now"), &b);
        return vstr(ob_str(a, &b));
    }
    }
    failf(&R->S, line, "unknown function");
}

static jval call_macro(rt *R, int line, const jfunc *f, const args *A)
{
    const node *m = f->macro;
    if (++R->depth > MAX_DEPTH) longjmp(R->S.jb, 3);
    scope *sc = new_scope(R, f->closure);
    for (size_t i = 0; i < m->n_names; i++) {
        jval v = UNDEF;
        if (i < A->n) v = A->pos[i];
        else {
            int found = 0;
            for (size_t k = 0; k < A->nk; k++)
                if (A->kn[k]->len == m->names[i]->len && !memcmp(A->kn[k]->s, m->names[i]->s, m->names[i]->len)) {
                    v = A->kv[k];
                    found = 1;
                }
            if (!found && m->list2[i]) v = eval(R, sc, m->list2[i]);
        }
        obj_set(R->S.ar, &sc->vars, m->names[i], v);
    }
    (void)line;
    obuf out = { 0 };
    exec_body(R, sc, m->list, m->n, &out);
    R->depth--;
    R->loop_ctl = 0;
    return vstr(ob_str(R->S.ar, &out));
}

static jval eval(rt *R, scope *sc, const node *n)
{
    arena *a = R->S.ar;
    switch (n->k) {
    case E_LIT: return n->lit;
    case E_NAME: return lookup(R, sc, n->name);
    case E_ATTR: {
        jval o = eval(R, sc, n->a);
        return get_attr(R, o, n->name);
    }
    case E_INDEX: {
        jval o = eval(R, sc, n->a);
        return get_item(R, o, eval(R, sc, n->b));
    }
    case E_SLICE: {
        jval o = eval(R, sc, n->a);
        jval p[3];
        for (int i = 0; i < 3; i++) p[i] = n->list[i] ? eval(R, sc, n->list[i]) : UNDEF;
        return slice(R, n->line, o, p[0], p[1], p[2]);
    }
    case E_CALL: {
        args A;
        if (n->a->k == E_ATTR) {
            jval o = eval(R, sc, n->a->a);
            eval_args(R, sc, n, &A, 0);
            int handled;
            jval r = call_method(R, n->line, o, n->a->name, &A, &handled);
            if (handled) return r;
            jval f = get_attr(R, o, n->a->name);
            if (f.t != V_FUNC)
                failf(&R->S, n->line, "%s has no method '%s'", type_name(o), n->a->name->s);
            return f.u.fn->builtin ? call_builtin(R, n->line, f.u.fn->builtin, &A) : call_macro(R, n->line, f.u.fn, &A);
        }
        jval f = eval(R, sc, n->a);
        if (f.t != V_FUNC) {
            if (n->a->k == E_NAME) failf(&R->S, n->line, "'%s' is %s, not a function", n->a->name->s, type_name(f));
            failf(&R->S, n->line, "call of a %s", type_name(f));
        }
        eval_args(R, sc, n, &A, 0);
        return f.u.fn->builtin ? call_builtin(R, n->line, f.u.fn->builtin, &A) : call_macro(R, n->line, f.u.fn, &A);
    }
    case E_FILTER: {
        jval v = eval(R, sc, n->a);
        args A;
        eval_args(R, sc, n, &A, 0);
        return run_filter(R, sc, n->line, n->name, v, &A);
    }
    case E_TEST: {
        jval v = eval(R, sc, n->a);
        args A;
        eval_args(R, sc, n, &A, 0);
        int r = run_test(R, n->line, n->name, v, &A);
        return vbool(n->op ? !r : r);
    }
    case E_NEG: case E_POS: {
        jval v = eval(R, sc, n->a);
        if (v.t == V_INT) return vint(n->k == E_NEG ? -v.u.i : v.u.i);
        if (v.t == V_FLOAT) return vflt(n->k == E_NEG ? -v.u.f : v.u.f);
        failf(&R->S, n->line, "unary minus of a %s", type_name(v));
    }
    case E_BIN: {
        jval x = eval(R, sc, n->a);
        jval y = eval(R, sc, n->b);
        return binop(R, n->line, n->op, x, y);
    }
    case E_CMP: {
        jval x = eval(R, sc, n->list[0]);
        for (size_t i = 1; i < n->n; i++) {
            jval y = eval(R, sc, n->list[i]);
            if (!truthy(binop(R, n->line, n->ops[i - 1], x, y))) return vbool(0);
            x = y;
        }
        return vbool(1);
    }
    case E_AND: {
        jval x = eval(R, sc, n->a);
        return truthy(x) ? eval(R, sc, n->b) : x;
    }
    case E_OR: {
        jval x = eval(R, sc, n->a);
        return truthy(x) ? x : eval(R, sc, n->b);
    }
    case E_NOT: return vbool(!truthy(eval(R, sc, n->a)));
    case E_COND:
        if (truthy(eval(R, sc, n->b))) return eval(R, sc, n->a);
        return n->c ? eval(R, sc, n->c) : UNDEF;
    case E_LIST: {
        jval r = new_arr(a);
        for (size_t i = 0; i < n->n; i++) arr_push(a, r.u.a, eval(R, sc, n->list[i]));
        return r;
    }
    case E_DICT: {
        jval r = new_obj(a);
        for (size_t i = 0; i < n->n; i++) {
            jval k = eval(R, sc, n->list[i]);
            obj_set(a, r.u.o, to_str(R, k), eval(R, sc, n->list2[i]));
        }
        return r;
    }
    }
    failf(&R->S, n->line, "internal: not an expression");
}

static void assign(rt *R, scope *sc, const node *n, jstr *const *names, size_t nn, jval v)
{
    if (nn == 1) {
        obj_set(R->S.ar, &sc->vars, names[0], v);
        return;
    }
    jval l = iter_list(R, n->line, v);
    if (l.u.a->n != nn) failf(&R->S, n->line, "cannot unpack %zu values into %zu names", l.u.a->n, nn);
    for (size_t i = 0; i < nn; i++) obj_set(R->S.ar, &sc->vars, names[i], l.u.a->v[i]);
}

static void exec_node(rt *R, scope *sc, const node *n, obuf *out)
{
    arena *a = R->S.ar;
    switch (n->k) {
    case N_TEXT: ob_putj(a, out, n->lit.u.s); return;
    case N_OUT: ob_putj(a, out, to_str(R, eval(R, sc, n->a))); return;
    case N_IF:
        if (truthy(eval(R, sc, n->a))) exec_body(R, sc, n->list, n->n, out);
        else exec_body(R, sc, n->list2, n->n2, out);
        return;
    case N_FOR: {
        jval it = eval(R, sc, n->a);
        if (it.t == V_OBJ) it = iter_list(R, n->line, it);
        jval l = iter_list(R, n->line, it);
        /* the "if" filter decides which items the loop sees (loop.length counts those) */
        jval items = l;
        if (n->b) {
            items = new_arr(a);
            for (size_t i = 0; i < l.u.a->n; i++) {
                scope *ts = new_scope(R, sc);
                assign(R, ts, n, n->names, n->n_names, l.u.a->v[i]);
                if (truthy(eval(R, ts, n->b))) arr_push(a, items.u.a, l.u.a->v[i]);
            }
        }
        size_t cnt = items.u.a->n;
        if (!cnt) {
            exec_body(R, sc, n->list2, n->n2, out);
            return;
        }
        static const char *const LK[] = { "index", "index0", "revindex", "revindex0", "first", "last", "length", "previtem", "nextitem" };
        jstr *keys[9];
        for (int k = 0; k < 9; k++) keys[k] = cstr(a, LK[k]);
        jstr *loopname = cstr(a, "loop");
        for (size_t i = 0; i < cnt; i++) {
            scope *ls = new_scope(R, sc);
            jval lp = new_obj(a);
            obj_set(a, lp.u.o, keys[0], vint((long long)i + 1));
            obj_set(a, lp.u.o, keys[1], vint((long long)i));
            obj_set(a, lp.u.o, keys[2], vint((long long)(cnt - i)));
            obj_set(a, lp.u.o, keys[3], vint((long long)(cnt - i - 1)));
            obj_set(a, lp.u.o, keys[4], vbool(i == 0));
            obj_set(a, lp.u.o, keys[5], vbool(i == cnt - 1));
            obj_set(a, lp.u.o, keys[6], vint((long long)cnt));
            obj_set(a, lp.u.o, keys[7], i ? items.u.a->v[i - 1] : UNDEF);
            obj_set(a, lp.u.o, keys[8], i + 1 < cnt ? items.u.a->v[i + 1] : UNDEF);
            obj_set(a, &ls->vars, loopname, lp);
            assign(R, ls, n, n->names, n->n_names, items.u.a->v[i]);
            exec_body(R, ls, n->list, n->n, out);
            if (R->loop_ctl == 1) {
                R->loop_ctl = 0;
                break;
            }
            R->loop_ctl = 0;
        }
        return;
    }
    case N_SET: {
        jval v = eval(R, sc, n->b);
        if (n->name) {
            jval o = lookup(R, sc, n->names[0]);
            if (o.t != V_OBJ) failf(&R->S, n->line, "cannot set attribute '%s' of %s '%s'", n->name->s, type_name(o), n->names[0]->s);
            obj_set(a, o.u.o, n->name, v);
            return;
        }
        assign(R, sc, n, n->names, n->n_names, v);
        return;
    }
    case N_SETBLOCK: {
        obuf b = { 0 };
        exec_body(R, sc, n->list, n->n, &b);
        jval v = vstr(ob_str(a, &b));
        if (n->c) { /* filters applied to the block */
            const node *chain[32];
            int k = 0;
            for (const node *f = n->c; f && k < 32; f = f->a) chain[k++] = f;
            while (k--) {
                args A;
                eval_args(R, sc, chain[k], &A, 0);
                v = run_filter(R, sc, chain[k]->line, chain[k]->name, v, &A);
            }
        }
        obj_set(a, &sc->vars, n->names[0], v);
        return;
    }
    case N_MACRO: {
        jval f = { V_FUNC, { 0 } };
        f.u.fn = ar_alloc(a, sizeof *f.u.fn);
        f.u.fn->builtin = 0;
        f.u.fn->macro = n;
        f.u.fn->closure = sc;
        obj_set(a, &sc->vars, n->name, f);
        return;
    }
    case N_FILTERBLOCK: {
        obuf b = { 0 };
        exec_body(R, sc, n->list, n->n, &b);
        jval v = vstr(ob_str(a, &b));
        const node *chain[32];
        int k = 0;
        for (const node *f = n->c; f && k < 32; f = f->a) chain[k++] = f;
        while (k--) {
            args A;
            eval_args(R, sc, chain[k], &A, 0);
            v = run_filter(R, sc, chain[k]->line, chain[k]->name, v, &A);
        }
        ob_putj(a, out, to_str(R, v));
        return;
    }
    case N_BLOCK: exec_body(R, sc, n->list, n->n, out); return;
    case N_BREAK: R->loop_ctl = 1; return;
    case N_CONTINUE: R->loop_ctl = 2; return;
    }
    failf(&R->S, n->line, "internal: not a statement");
}

static void exec_body(rt *R, scope *sc, node *const *body, size_t n, obuf *out)
{
    for (size_t i = 0; i < n && !R->loop_ctl; i++) exec_node(R, sc, body[i], out);
}

int jinja_render(const jinja_template *t, const char *ctx_json, size_t ctx_len, int64_t now, char **out,
                 size_t *out_len, unsigned char **mask, kv_error *err)
{
    if (!t || !out || !out_len || (!ctx_json && ctx_len)) return kv_error_set(err, KV_ERR_INVALID, "jinja_render: NULL argument");
    *out = NULL;
    *out_len = 0;
    if (mask) *mask = NULL;
    rt R;
    memset(&R, 0, sizeof R);
    arena ar = { 0 };
    ar.oom = &R.S.jb;
    R.S.ar = &ar;
    R.now = now;
    int r = setjmp(R.S.jb);
    if (r) {
        ar_free(&ar);
        if (r == 2) return kv_error_set(err, KV_ERR_NOMEM, "chat template: out of memory rendering (over 256 MiB)");
        if (r == 3) return kv_error_set(err, KV_ERR_NOMEM, "chat template: macros nested too deep (over %d calls)", MAX_DEPTH);
        if (R.S.line) return kv_error_set(err, KV_ERR_FORMAT, "chat template line %d: %s", R.S.line, R.S.msg);
        return kv_error_set(err, KV_ERR_FORMAT, "chat template: %s", R.S.msg);
    }
    jsonp J = { &R.S, ctx_json ? ctx_json : "{}", ctx_json ? ctx_len : 2, 0, 0 };
    jval ctx = js_value(&J, 0);
    if (ctx.t != V_OBJ) failf(&R.S, 0, "context JSON is not an object");
    R.globals = new_scope(&R, NULL);
    R.globals->vars = *ctx.u.o;
    scope *top = new_scope(&R, R.globals);
    obuf o = { 0 };
    exec_body(&R, top, t->body, t->n, &o);
    char *s = malloc(o.len + 1);
    unsigned char *m = mask ? malloc(o.len ? o.len : 1) : NULL;
    if (!s || (mask && !m)) {
        free(s);
        free(m);
        ar_free(&ar);
        return kv_error_set(err, KV_ERR_NOMEM, "chat template: out of memory for a %zu-byte rendering", o.len);
    }
    if (o.len) memcpy(s, o.s, o.len);
    s[o.len] = 0;
    if (m) {
        if (o.len) memcpy(m, o.m, o.len);
        *mask = m;
    }
    *out = s;
    *out_len = o.len;
    ar_free(&ar);
    return KV_OK;
}

int jinja_render_chat(const jinja_template *t, const jinja_chat_msg *msgs, size_t n, int add_generation_prompt,
                      const char *bos_token, const char *eos_token, int64_t now, char **out, size_t *out_len,
                      unsigned char **mask, kv_error *err)
{
    if (!t || !out || !out_len || (n && !msgs)) return kv_error_set(err, KV_ERR_INVALID, "jinja_render_chat: NULL argument");
    *out = NULL;
    char *j = NULL;
    size_t jl = 0;
    int bad = 0;
#define LIT(s) do { size_t l_ = strlen(s); char *nj_ = realloc(j, jl + l_ + 1); if (!nj_) { bad = 1; break; } \
                    j = nj_; memcpy(j + jl, s, l_ + 1); jl += l_; } while (0)
    LIT("{\"messages\": [");
    for (size_t i = 0; i < n && !bad; i++) {
        LIT(i ? ", {\"role\": " : "{\"role\": ");
        const char *role = msgs[i].role ? msgs[i].role : "";
        if (!bad && jinja_json_append_str(&j, &jl, role, strlen(role))) bad = 1;
        LIT(", \"content\": ");
        if (!bad && jinja_json_append_str(&j, &jl, msgs[i].content ? msgs[i].content : "", msgs[i].content ? msgs[i].len : 0))
            bad = 1;
        LIT("}");
    }
    LIT("], \"add_generation_prompt\": ");
    LIT(add_generation_prompt ? "true" : "false");
    LIT(", \"bos_token\": ");
    if (!bad && jinja_json_append_str(&j, &jl, bos_token ? bos_token : "", bos_token ? strlen(bos_token) : 0)) bad = 1;
    LIT(", \"eos_token\": ");
    if (!bad && jinja_json_append_str(&j, &jl, eos_token ? eos_token : "", eos_token ? strlen(eos_token) : 0)) bad = 1;
    LIT("}");
#undef LIT
    if (bad) {
        free(j);
        return kv_error_set(err, KV_ERR_NOMEM, "chat template: out of memory for %zu messages", n);
    }
    int rc = jinja_render(t, j, jl, now, out, out_len, mask, err);
    free(j);
    return rc;
}
