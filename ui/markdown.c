/* markdown: a reply's Markdown (CommonMark + GitHub tables, parsed by md4c) as display text with a style per byte — headings, emphasis, code, lists, quotes, links, tables, numbered code blocks. */
#include "markdown.h"

#include <md4c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 16

typedef struct md_state {
    ui_md *out;
    const char *src;           /* the source (code lines are copied from it) */
    size_t src_len;
    char pend[64];             /* a code line's indentation as md4c gave it, held back */
    size_t n_pend;
    int code_base;
    unsigned char span;        /* styles of the open spans */
    int heading, code_block;   /* inside a heading / a code block */
    int quote;                 /* block quote depth */
    int list_depth;
    int ol[MAX_DEPTH];         /* per open list: the next number (0: a bullet list) */
    int at_line_start;
    int pending_nl;            /* newlines owed before the next text (block separators) */
    int cells;                 /* cells written in the current table row */
    int err;
} md_state;

/* md4c gives a code line's indentation as text of its own (tabs expanded to spaces), not as the
 * source bytes. Code stays exact: for indentation of n columns before a chunk at src + off, the
 * source bytes that make its last n columns (tab stops every 4, as CommonMark counts). Writes
 * them to out (cap >= 4 * n + 4); returns their length, or -1 when the source has no tab there
 * (the spaces given are exact then). */
static int raw_indent(const char *src, size_t off, size_t n, char *out, size_t cap)
{
    size_t ls = off;
    while (ls > 0 && src[ls - 1] != '\n') ls--;
    if (!memchr(src + ls, '\t', off - ls)) return -1;
    size_t total = 0, col[256];
    size_t m = off - ls < 255 ? off - ls : 255;
    for (size_t i = 0; i < m; i++) {
        col[i] = total;
        total = src[ls + i] == '\t' ? (total / 4 + 1) * 4 : total + 1;
    }
    if (n > total) return -1;
    size_t from = total - n, o = 0, i = 0;
    while (i < m && col[i] + (src[ls + i] == '\t' ? (col[i] / 4 + 1) * 4 - col[i] : 1) <= from) i++;
    if (i < m && col[i] < from) { /* the cut falls inside a tab: the rest of it as spaces */
        size_t end = (col[i] / 4 + 1) * 4;
        for (size_t k = from; k < end && o < cap; k++) out[o++] = ' ';
        i++;
    }
    for (; i < m && o < cap; i++) out[o++] = src[ls + i];
    return (int)o;
}

static void put(md_state *s, const char *t, size_t n, unsigned char style)
{
    ui_md *o = s->out;
    if (o->len + n + 1 > o->cap) {
        size_t nc = o->cap ? o->cap : 256;
        while (nc < o->len + n + 1) nc *= 2;
        char *nt = realloc(o->text, nc);
        if (nt) o->text = nt;
        unsigned char *ns = realloc(o->style, nc);
        if (ns) o->style = ns;
        if (!nt || !ns) {
            s->err = 1;
            return;
        }
        o->cap = nc;
    }
    memcpy(o->text + o->len, t, n);
    memset(o->style + o->len, style, n);
    o->len += n;
    o->text[o->len] = 0;
}

/* A line's start: the block quote bars. */
static void line_start(md_state *s)
{
    for (int i = 0; i < s->quote; i++) put(s, "│ ", strlen("│ "), UI_MD_QUOTE);
    s->at_line_start = 0;
}

static void flush_nl(md_state *s)
{
    if (!s->out->len) s->pending_nl = 0;
    for (; s->pending_nl > 0; s->pending_nl--) {
        put(s, "\n", 1, UI_MD_PLAIN);
        s->at_line_start = 1;
    }
}

/* Text in the current style; newlines start quoted lines. */
static void text(md_state *s, const char *t, size_t n, unsigned char style)
{
    flush_nl(s);
    while (n > 0) {
        if (s->at_line_start) line_start(s);
        const char *nl = memchr(t, '\n', n);
        size_t k = nl ? (size_t)(nl - t) + 1 : n;
        put(s, t, k, style);
        if (nl) s->at_line_start = 1;
        t += k;
        n -= k;
    }
}

static void block_end(md_state *s, int newlines)
{
    if (s->pending_nl < newlines) s->pending_nl = newlines;
}

static unsigned char cur_style(const md_state *s)
{
    return (unsigned char)(s->span | (s->heading ? UI_MD_HEADING | UI_MD_BOLD : 0) | (s->code_block ? UI_MD_CODE : 0));
}

static int enter_block(MD_BLOCKTYPE type, void *detail, void *ud)
{
    md_state *s = ud;
    char b[160];
    switch (type) {
    case MD_BLOCK_H: s->heading = 1; break;
    case MD_BLOCK_QUOTE: s->quote++; break;
    case MD_BLOCK_UL:
    case MD_BLOCK_OL:
        if (s->list_depth < MAX_DEPTH)
            s->ol[s->list_depth] = type == MD_BLOCK_OL ? (int)((MD_BLOCK_OL_DETAIL *)detail)->start : 0;
        s->list_depth++;
        block_end(s, 1);
        break;
    case MD_BLOCK_LI: {
        block_end(s, 1);
        int d = s->list_depth - 1;
        int indent = 2 * (d > 0 ? d : 0);
        if (d >= 0 && d < MAX_DEPTH && s->ol[d]) snprintf(b, sizeof b, "%*s%d. ", indent, "", s->ol[d]++);
        else snprintf(b, sizeof b, "%*s• ", indent, "");
        text(s, b, strlen(b), UI_MD_PLAIN);
        break;
    }
    case MD_BLOCK_CODE: {
        const MD_BLOCK_CODE_DETAIL *cd = detail;
        s->out->n_code++;
        block_end(s, 1);
        if (cd->lang.size) snprintf(b, sizeof b, "┌─ code %d · %.*s", s->code_base + s->out->n_code, (int)cd->lang.size, cd->lang.text);
        else snprintf(b, sizeof b, "┌─ code %d", s->code_base + s->out->n_code);
        text(s, b, strlen(b), UI_MD_LABEL);
        text(s, "\n", 1, UI_MD_LABEL);
        s->code_block = 1;
        break;
    }
    case MD_BLOCK_HR: block_end(s, 1); text(s, "────────", strlen("────────"), UI_MD_LABEL); block_end(s, 2); break;
    case MD_BLOCK_TR: block_end(s, 1); s->cells = 0; break;
    case MD_BLOCK_TH:
    case MD_BLOCK_TD:
        if (s->cells++) text(s, " │ ", strlen(" │ "), UI_MD_LABEL);
        if (type == MD_BLOCK_TH) s->span |= UI_MD_BOLD;
        break;
    default: break;
    }
    return 0;
}

static int leave_block(MD_BLOCKTYPE type, void *detail, void *ud)
{
    (void)detail;
    md_state *s = ud;
    switch (type) {
    case MD_BLOCK_P: block_end(s, 2); break;
    case MD_BLOCK_H: s->heading = 0; block_end(s, 2); break;
    case MD_BLOCK_QUOTE: s->quote--; block_end(s, 2); break;
    case MD_BLOCK_UL:
    case MD_BLOCK_OL: s->list_depth--; block_end(s, 2); break;
    case MD_BLOCK_CODE:
        s->code_block = 0;
        if (!s->at_line_start) text(s, "\n", 1, UI_MD_PLAIN);
        text(s, "└─", strlen("└─"), UI_MD_LABEL);
        block_end(s, 2);
        break;
    case MD_BLOCK_TH: s->span &= (unsigned char)~UI_MD_BOLD; break;
    case MD_BLOCK_TABLE: block_end(s, 2); break;
    default: break;
    }
    return 0;
}

static int enter_span(MD_SPANTYPE type, void *detail, void *ud)
{
    (void)detail;
    md_state *s = ud;
    switch (type) {
    case MD_SPAN_EM: s->span |= UI_MD_ITALIC; break;
    case MD_SPAN_STRONG: s->span |= UI_MD_BOLD; break;
    case MD_SPAN_CODE: s->span |= UI_MD_CODE; break;
    case MD_SPAN_A: s->span |= UI_MD_LINK; break;
    case MD_SPAN_DEL: s->span |= UI_MD_STRIKE; break;
    default: break;
    }
    return 0;
}

static int leave_span(MD_SPANTYPE type, void *detail, void *ud)
{
    md_state *s = ud;
    switch (type) {
    case MD_SPAN_EM: s->span &= (unsigned char)~UI_MD_ITALIC; break;
    case MD_SPAN_STRONG: s->span &= (unsigned char)~UI_MD_BOLD; break;
    case MD_SPAN_CODE: s->span &= (unsigned char)~UI_MD_CODE; break;
    case MD_SPAN_DEL: s->span &= (unsigned char)~UI_MD_STRIKE; break;
    case MD_SPAN_A: {
        s->span &= (unsigned char)~UI_MD_LINK;
        const MD_SPAN_A_DETAIL *a = detail;
        if (a && a->href.size) {
            text(s, " <", 2, UI_MD_PLAIN);
            text(s, a->href.text, a->href.size, UI_MD_LINK);
            text(s, ">", 1, UI_MD_PLAIN);
        }
        break;
    }
    default: break;
    }
    return 0;
}

/* Code text: indentation chunks (not in the source) are held until the chunk after them, then
 * written as the source's bytes (raw_indent). 0 when t was taken here. */
static int code_chunk(md_state *s, const char *t, size_t n, void (*emit)(md_state *, const char *, size_t))
{
    int in_src = t >= s->src && t < s->src + s->src_len;
    size_t sp = 0;
    while (sp < n && t[sp] == ' ') sp++;
    if (!in_src && n && n < sizeof s->pend && sp == n && s->n_pend == 0) {
        memcpy(s->pend, t, n);
        s->n_pend = n;
        return 0;
    }
    if (s->n_pend) {
        char raw[300];
        int k = in_src ? raw_indent(s->src, (size_t)(t - s->src), s->n_pend, raw, sizeof raw) : -1;
        if (k >= 0) emit(s, raw, (size_t)k);
        else emit(s, s->pend, s->n_pend);
        s->n_pend = 0;
    }
    emit(s, t, n);
    return 0;
}

static void emit_code(md_state *s, const char *t, size_t n) { text(s, t, n, cur_style(s)); }

static int on_text(MD_TEXTTYPE type, const MD_CHAR *t, MD_SIZE n, void *ud)
{
    md_state *s = ud;
    if (s->code_block && type == MD_TEXT_CODE) return code_chunk(s, t, n, emit_code);
    static const struct { const char *ent, *ch; } ents[] = {
        {"&amp;", "&"}, {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&#39;", "'"}, {"&nbsp;", " "},
    };
    switch (type) {
    case MD_TEXT_SOFTBR:
    case MD_TEXT_BR: text(s, "\n", 1, UI_MD_PLAIN); break;
    case MD_TEXT_NULLCHAR: text(s, "\xEF\xBF\xBD", 3, cur_style(s)); break;
    case MD_TEXT_ENTITY:
        for (size_t i = 0; i < sizeof ents / sizeof ents[0]; i++)
            if (strlen(ents[i].ent) == n && !memcmp(ents[i].ent, t, n)) {
                text(s, ents[i].ch, strlen(ents[i].ch), cur_style(s));
                return 0;
            }
        text(s, t, n, cur_style(s));
        break;
    default: text(s, t, n, cur_style(s)); break;
    }
    return 0;
}

int ui_md_render(const char *src, size_t len, int code_base, ui_md *out)
{
    out->len = 0;
    out->n_code = 0;
    md_state s = {.out = out, .code_base = code_base, .at_line_start = 1, .src = src, .src_len = len};
    MD_PARSER p = {
        .abi_version = 0, .flags = MD_DIALECT_GITHUB | MD_FLAG_NOHTML,
        .enter_block = enter_block, .leave_block = leave_block, .enter_span = enter_span,
        .leave_span = leave_span, .text = on_text,
    };
    int rc = md_parse(src, (MD_SIZE)len, &p, &s);
    if (rc || s.err) { /* as it is */
        out->len = 0;
        out->n_code = 0;
        md_state plain = {.out = out};
        put(&plain, src, len, UI_MD_PLAIN);
        return -1;
    }
    if (!out->text) put(&s, "", 0, UI_MD_PLAIN);
    return 0;
}

void ui_md_free(ui_md *m)
{
    free(m->text);
    free(m->style);
    memset(m, 0, sizeof *m);
}

/* ---- code blocks alone (for /copy N) ------------------------------------------------------------ */

typedef struct cb_state {
    int want, count, in_code;
    md_state w; /* writes the wanted block's text to buf */
    ui_md buf;
    int err;
} cb_state;

static void emit_raw(md_state *w, const char *t, size_t n) { put(w, t, n, 0); }

static int cb_enter(MD_BLOCKTYPE type, void *detail, void *ud)
{
    (void)detail;
    cb_state *s = ud;
    if (type == MD_BLOCK_CODE) s->in_code = ++s->count == s->want;
    return 0;
}

static int cb_leave(MD_BLOCKTYPE type, void *detail, void *ud)
{
    (void)detail;
    cb_state *s = ud;
    if (type == MD_BLOCK_CODE) s->in_code = 0;
    return 0;
}

static int cb_span(MD_SPANTYPE type, void *detail, void *ud)
{
    (void)type, (void)detail, (void)ud;
    return 0;
}

static int cb_text(MD_TEXTTYPE type, const MD_CHAR *t, MD_SIZE n, void *ud)
{
    cb_state *s = ud;
    if (!s->in_code) return 0;
    if (type == MD_TEXT_NULLCHAR) put(&s->w, "\0", 1, 0);
    else code_chunk(&s->w, t, n, emit_raw);
    if (s->w.err) s->err = 1;
    return 0;
}

int ui_md_code_block(const char *src, size_t len, int want, char **out, size_t *out_len)
{
    cb_state s = {.want = want};
    s.w = (md_state){.out = &s.buf, .src = src, .src_len = len};
    MD_PARSER p = {
        .flags = MD_DIALECT_GITHUB | MD_FLAG_NOHTML, .enter_block = cb_enter, .leave_block = cb_leave,
        .enter_span = cb_span, .leave_span = cb_span, .text = cb_text,
    };
    if (md_parse(src, (MD_SIZE)len, &p, &s) || s.err) {
        ui_md_free(&s.buf);
        return -1;
    }
    if (out && want >= 1 && want <= s.count) {
        size_t n = s.buf.len;
        if (n && s.buf.text[n - 1] == '\n') n--; /* the block's last line ends the block */
        *out = s.buf.text ? s.buf.text : strdup("");
        *out_len = n;
        s.buf.text = NULL;
    }
    ui_md_free(&s.buf);
    return s.count;
}
