/* pane: the chat pane — messages, their wrap caches, reasoning blocks folded, scrollback anchored on a message, drawing only the visible lines, and its scrolling keys (pane_key). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ui_internal.h"

/* Content width of a pane w cells wide (one cell of margin on each side). */
static int content_width(int w) { return w > 3 ? w - 2 : 1; }

/* Where the answer starts in m->text: after a reasoning block, else 0. */
static size_t answer_at(const ui_msg *m) { return m->rs.found ? m->rs.answer : 0; }

/* A Markdown reply's rendering, brought up to date with its text (the answer: the reasoning
 * block is shown apart). */
/* Shown as rendered Markdown: a Markdown reply, unless its heat-map is on (shown as it is). */
static int md_shown(const ui_msg *m) { return m->md_on && !m->heat_raw; }

static void ensure_rendered(ui_msg *m)
{
    if (!m->md_on || !m->md_dirty) return;
    size_t a = answer_at(m);
    ui_md_render(m->text ? m->text + a : "", m->len - a, m->code_base, &m->md);
    m->md_dirty = 0;
}

/* The text shown and its length (a Markdown reply's rendering, or the text as it is; after the
 * reasoning block, if any). */
static const char *shown_text(const ui_msg *m, size_t *len)
{
    if (md_shown(m) && m->md.text) {
        *len = m->md.len;
        return m->md.text;
    }
    size_t a = answer_at(m);
    *len = m->len - a;
    return m->text ? m->text + a : "";
}

/* Lines the reasoning block takes: none (no block, or an empty one), one folded, or a header and
 * its wrapped text when unfolded (F4). */
static int think_lines(ui *u, ui_msg *m, int cw)
{
    if (!m->rs.found || (m->rs.closed && m->rs.body_end == m->rs.body)) return 0;
    if (!u->think_unfold) return 1;
    if (m->think_wrap != cw) {
        m->think_lines.n = 0;
        if (ui_wrap(m->text + m->rs.body, m->rs.body_end - m->rs.body, 0, cw, UI_WRAP_WORD, &m->think_lines) == 0)
            m->think_wrap = cw;
        else m->think_wrap = 0, m->think_lines.n = 0;
    }
    return 1 + (int)m->think_lines.n;
}

/* After the text changed: where its reasoning block is, how many words it has. */
static void update_reasoning(ui_msg *m)
{
    if (m->role != UI_ROLE_ASSISTANT) return;
    ui_reasoning_split(m->text ? m->text : "", m->len, &m->rs);
    m->think_wrap = 0;
    m->think_words = 0;
    for (size_t i = m->rs.body, in = 0; m->rs.found && i < m->rs.body_end; i++) {
        int sp = m->text[i] == ' ' || m->text[i] == '\n' || m->text[i] == '\t';
        if (!sp && !in) m->think_words++;
        in = !sp;
    }
}

static void ensure_wrapped(ui_msg *m, int cw)
{
    if (md_shown(m) && m->md_dirty) {
        ensure_rendered(m);
        m->wrap_width = 0;
    }
    if (m->wrap_width == cw) return;
    m->lines.n = 0;
    size_t len;
    const char *t = shown_text(m, &len);
    if (ui_wrap(t, len, 0, cw, UI_WRAP_WORD, &m->lines) == 0) m->wrap_width = cw;
    else m->wrap_width = 0, m->lines.n = 0;
}

/* The attribute of Markdown style st over the message's base attribute. */
static attr_t md_attr(ui *u, unsigned char st, attr_t base)
{
    attr_t a = base;
    if (st & UI_MD_CODE) a = u->attr[UI_EL_HELP_KEY];
    if (st & UI_MD_HEADING) a = u->attr[UI_EL_TITLE];
    if (st & (UI_MD_QUOTE | UI_MD_LABEL)) a = u->attr[UI_EL_BORDER];
    if (st & UI_MD_BOLD) a |= A_BOLD;
    if (st & UI_MD_ITALIC) a |= A_ITALIC;
    if (st & UI_MD_LINK) a |= A_UNDERLINE;
    if (st & UI_MD_STRIKE) a |= A_DIM;
    return a;
}

static int content_lines(const ui_msg *m)
{
    if (m->state == UI_MSG_WAITING && m->len == 0) return 0;
    return (int)m->lines.n;
}

int pane_msg_lines(ui *u, ui_msg *m, int w)
{
    ensure_wrapped(m, content_width(w));
    return (m->label[0] ? 1 : 0) + think_lines(u, m, content_width(w)) + content_lines(m) + (m->note[0] ? 1 : 0) + 1;
}

static attr_t text_attr(ui *u, const ui_msg *m)
{
    switch (m->role) {
    case UI_ROLE_USER: return u->attr[UI_EL_USER_TEXT];
    case UI_ROLE_ASSISTANT: return u->attr[UI_EL_ASSISTANT_TEXT];
    case UI_ROLE_ERROR: return u->attr[UI_EL_ERROR];
    default: return u->attr[UI_EL_NOTICE];
    }
}

/* The colour of m->text[o] under the heat-map and *until, where that colour's run ends (the
 * token's span, or the next span's start in a gap). */
static attr_t heat_attr(ui *u, const ui_msg *m, size_t o, size_t *until)
{
    size_t lo = 0, hi = m->n_heat; /* first span ending after o */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (m->heat_end[mid] <= o) lo = mid + 1;
        else hi = mid;
    }
    if (lo == m->n_heat) {
        *until = m->len;
        return text_attr(u, m);
    }
    if (m->heat_start[lo] > o) {
        *until = m->heat_start[lo];
        return text_attr(u, m);
    }
    *until = m->heat_end[lo];
    float p = m->heat_p[lo];
    return u->attr[p >= UI_HEAT_HIGH ? UI_EL_HEAT_HIGH : p >= UI_HEAT_MID ? UI_EL_HEAT_MID : UI_EL_HEAT_LOW];
}

static void draw_line(ui *u, ui_msg *m, int k, int y, int x, int w)
{
    int cw = content_width(w);
    if (m->label[0]) {
        if (k == 0) {
            attr_t a = u->attr[m->role == UI_ROLE_USER ? UI_EL_USER : UI_EL_ASSISTANT];
            int n = ui_puts(u, y, x + 1, cw, m->label, a);
            if (m->state == UI_MSG_WAITING && n + 3 < cw) {
                static const char *const uni[] = {"⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"};
                static const char *const asc[] = {"|", "/", "-", "\\"};
                const char *g = u->unicode ? uni[u->spinner % 10] : asc[u->spinner % 4];
                ui_puts(u, y, x + 2 + n, 2, g, u->attr[UI_EL_SPINNER]);
                ui_puts(u, y, x + 4 + n, cw - n - 3, "thinking…", u->attr[UI_EL_NOTICE]);
            }
            return;
        }
        k--;
    }
    int nt = think_lines(u, m, cw);
    if (k < nt) { /* the reasoning: dimmed, one line folded */
        attr_t a = text_attr(u, m) | A_DIM;
        if (k == 0) {
            char head[160];
            snprintf(head, sizeof head, "%s %s (%d word%s) · F4 %s", ui_glyph(u, u->think_unfold ? "▾" : "▸",
                     u->think_unfold ? "v" : ">"), m->rs.closed ? "reasoning" : ui_glyph(u, "thinking…", "thinking..."),
                     m->think_words, m->think_words == 1 ? "" : "s", u->think_unfold ? "folds it" : "shows it");
            int n = ui_puts(u, y, x + 1, cw, head, a);
            if (!u->think_unfold && n + 4 < cw && m->rs.body_end > m->rs.body) { /* its start, as far as it fits */
                ui_puts(u, y, x + 1 + n, 3, ": ", a);
                size_t bl = m->rs.body_end - m->rs.body;
                const char *b = m->text + m->rs.body;
                while (bl && (*b == ' ' || *b == '\t')) b++, bl--;
                size_t nl = 0;
                while (nl < bl && b[nl] != '\n') nl++;
                int room = cw - n - 3, used = ui_put(u, y, x + 3 + n, room - 1, b, nl, a);
                if (nl < bl || used >= room - 1) ui_puts(u, y, x + 3 + n + used, 1, ui_glyph(u, "…", "."), a);
            }
        } else {
            const ui_line *l = &m->think_lines.v[k - 1];
            ui_put(u, y, x + 1, cw, m->text + m->rs.body + l->start, l->end - l->start, a);
        }
        return;
    }
    k -= nt;
    int nc = content_lines(m);
    if (k < nc) {
        const ui_line *l = &m->lines.v[k];
        size_t tl;
        const char *t = shown_text(m, &tl);
        int n = 0;
        if (m->heat_raw) { /* runs of one token's probability (ui_msg_set_heat) */
            size_t base = (size_t)(t - m->text), a = l->start;
            while (a < l->end && n < cw) {
                size_t b;
                attr_t at = heat_attr(u, m, base + a, &b);
                b = b - base < l->end ? b - base : l->end;
                if (b <= a) b = a + 1;
                n += ui_put(u, y, x + 1 + n, cw - n, t + a, b - a, at);
                a = b;
            }
        } else if (md_shown(m) && m->md.style) { /* runs of one style */
            size_t a = l->start;
            while (a < l->end && n < cw) {
                size_t b = a + 1;
                while (b < l->end && m->md.style[b] == m->md.style[a]) b++;
                n += ui_put(u, y, x + 1 + n, cw - n, t + a, b - a, md_attr(u, m->md.style[a], text_attr(u, m)));
                a = b;
            }
        } else {
            n = ui_put(u, y, x + 1, cw, t + l->start, l->end - l->start, text_attr(u, m));
        }
        if (m->state == UI_MSG_STREAMING && k == nc - 1 && n < cw)
            ui_puts(u, y, x + 1 + n, 1, ui_glyph(u, "▌", "_"), u->attr[UI_EL_SPINNER]);
        return;
    }
    k -= nc;
    if (m->note[0] && k == 0)
        ui_puts(u, y, x + 1, cw, m->note, u->attr[m->note_error ? UI_EL_ERROR : UI_EL_STOPPED]);
}

/* First visible (message, line) when pinned to the bottom of an h-line pane. */
static void bottom_anchor(ui *u, int h, int w, size_t *mi, int *li)
{
    pane *p = &u->pane;
    int total = 0;
    for (size_t i = p->n; i-- > 0;) {
        int nl = pane_msg_lines(u, p->msgs[i], w);
        if (total + nl >= h) {
            *mi = i;
            *li = total + nl - h;
            return;
        }
        total += nl;
    }
    *mi = 0;
    *li = 0;
}

/* 1 if the lines from (mi, li) to the end fit in h rows. */
static int fits_from(ui *u, size_t mi, int li, int h, int w)
{
    pane *p = &u->pane;
    int total = -li;
    for (size_t i = mi; i < p->n; i++) {
        total += pane_msg_lines(u, p->msgs[i], w);
        if (total > h) return 0;
    }
    return 1;
}

void pane_draw(ui *u, int y, int x, int h, int w)
{
    pane *p = &u->pane;
    size_t mi;
    int li;
    if (p->follow) bottom_anchor(u, h, w, &mi, &li);
    else {
        mi = p->top_msg < p->n ? p->top_msg : (p->n ? p->n - 1 : 0);
        li = p->top_line;
    }
    int row = 0;
    for (size_t i = mi; i < p->n && row < h; i++) {
        ui_msg *m = p->msgs[i];
        int nl = pane_msg_lines(u, m, w);
        if (li >= nl) li = nl - 1;
        for (int k = li; k < nl && row < h; k++, row++) draw_line(u, m, k, y + row, x, w);
        li = 0;
    }
}

void pane_scroll(ui *u, int delta, int h, int w)
{
    pane *p = &u->pane;
    if (!p->n || h <= 0) return;
    size_t mi;
    int li;
    if (p->follow) {
        if (delta > 0) return;
        bottom_anchor(u, h, w, &mi, &li);
    } else {
        mi = p->top_msg < p->n ? p->top_msg : p->n - 1;
        li = p->top_line;
    }
    if (delta < 0) {
        li += delta;
        while (li < 0 && mi > 0) {
            mi--;
            li += pane_msg_lines(u, p->msgs[mi], w);
        }
        if (li < 0) li = 0;
    } else {
        li += delta;
        while (mi < p->n && li >= pane_msg_lines(u, p->msgs[mi], w)) {
            li -= pane_msg_lines(u, p->msgs[mi], w);
            mi++;
        }
        if (mi >= p->n) {
            pane_end(u);
            return;
        }
    }
    if (fits_from(u, mi, li, h, w)) {
        pane_end(u);
        return;
    }
    p->follow = 0;
    p->top_msg = mi;
    p->top_line = li;
}

void pane_home(ui *u)
{
    pane *p = &u->pane;
    if (!p->n) return;
    p->follow = 0;
    p->top_msg = 0;
    p->top_line = 0;
    if (fits_from(u, 0, 0, u->pane_h, u->pane_w)) pane_end(u);
}

void pane_end(ui *u)
{
    u->pane.follow = 1;
    u->pane.new_below = 0;
}

static void msg_free(ui_msg *m)
{
    if (!m) return;
    free(m->text);
    ui_md_free(&m->md);
    ui_lines_free(&m->lines);
    ui_lines_free(&m->think_lines);
    free(m->heat_start);
    free(m->heat_end);
    free(m->heat_p);
    free(m);
}

void pane_free(pane *p)
{
    for (size_t i = 0; i < p->n; i++) msg_free(p->msgs[i]);
    free(p->msgs);
    memset(p, 0, sizeof *p);
}

/* ---- public API ------------------------------------------------------------------------- */

static int msg_reserve(ui_msg *m, size_t extra)
{
    if (m->len + extra <= m->cap) return 0;
    size_t nc = m->cap ? m->cap : 64;
    while (nc < m->len + extra) nc *= 2;
    char *nt = realloc(m->text, nc);
    if (!nt) return -1;
    m->text = nt;
    m->cap = nc;
    return 0;
}

/* Append sanitized text; re-wraps only the last line (the lines before it cannot change). */
static void msg_append(ui_msg *m, const char *text, size_t len)
{
    if (!len) return;
    if (msg_reserve(m, 3 * len + 4)) return;
    /* a CR LF split between two tokens: the CR, shown as ␍ at the end of the last piece, goes */
    if (text[0] == '\n' && m->len >= 3 && !memcmp(m->text + m->len - 3, "\xe2\x90\x8d", 3)) m->len -= 3;
    m->len += ui_sanitize(text, len, m->text + m->len, m->cap - m->len);
    int had_block = m->rs.found;
    update_reasoning(m);
    if (m->rs.found || had_block) { /* the block moves the answer's start: wrapped again */
        m->md_dirty = 1;
        m->wrap_width = 0;
    } else if (m->md_on) { /* rendered again, wrapped again (ensure_wrapped) */
        m->md_dirty = 1;
        m->wrap_width = 0;
    } else if (m->wrap_width > 0 && m->lines.n > 0) {
        size_t from = m->lines.v[m->lines.n - 1].start;
        m->lines.n--;
        if (ui_wrap(m->text, m->len, from, m->wrap_width, UI_WRAP_WORD, &m->lines)) m->wrap_width = 0;
    } else {
        m->wrap_width = 0;
    }
}

/* The label, sanitized, cut to whole characters that fit. */
static void set_label(ui_msg *m, const char *label)
{
    char tmp[sizeof m->label * 3];
    size_t n = ui_sanitize(label, strnlen(label, sizeof m->label - 1), tmp, sizeof tmp);
    size_t k = 0;
    while (k < n) {
        uint32_t cp;
        size_t c = ui_utf8_decode(tmp + k, n - k, &cp);
        if (k + c >= sizeof m->label) break;
        k += c;
    }
    memcpy(m->label, tmp, k);
    m->label[k] = 0;
}

ui_msg *ui_msg_add(ui *u, int role, const char *label, const char *text, size_t len)
{
    pane *p = &u->pane;
    if (p->n == p->cap) {
        size_t nc = p->cap ? p->cap * 2 : 64;
        ui_msg **nm = realloc(p->msgs, nc * sizeof *nm);
        if (!nm) return NULL;
        p->msgs = nm;
        p->cap = nc;
    }
    ui_msg *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->role = role;
    if (label) set_label(m, label);
    if (role == UI_ROLE_ASSISTANT && u->markdown) {
        m->md_on = m->md_dirty = 1;
        for (size_t i = p->n; i-- > 0;) /* code blocks are numbered through the pane: on from the reply above */
            if (p->msgs[i]->md_on) {
                ensure_rendered(p->msgs[i]);
                m->code_base = p->msgs[i]->code_base + p->msgs[i]->md.n_code;
                break;
            }
    }
    if (text && len) msg_append(m, text, len);
    p->msgs[p->n++] = m;
    if (!p->follow) p->new_below = 1;
    ui_mark_dirty(u);
    return m;
}

void ui_msg_append(ui *u, ui_msg *m, const char *text, size_t len)
{
    if (!m || !len) return;
    msg_append(m, text, len);
    if (!u->pane.follow) u->pane.new_below = 1;
    u->dirty_stream = 1;
}

void ui_msg_set_state(ui *u, ui_msg *m, int state)
{
    if (!m) return;
    m->state = state;
    ui_mark_dirty(u);
}

void ui_msg_set_label(ui *u, ui_msg *m, const char *label)
{
    if (!m || !label || !*label || !m->label[0]) return; /* a label line is kept, never added */
    set_label(m, label);
    ui_mark_dirty(u);
}

void ui_msg_set_note(ui *u, ui_msg *m, const char *note, int error)
{
    if (!m) return;
    char tmp[sizeof m->note * 3];
    size_t n = note ? ui_sanitize(note, strnlen(note, sizeof m->note / 2), tmp, sizeof tmp) : 0;
    if (n >= sizeof m->note) { /* cut at a character boundary */
        n = sizeof m->note - 1;
        while (n > 0 && ((unsigned char)tmp[n] & 0xC0) == 0x80) n--;
    }
    memcpy(m->note, tmp, n);
    m->note[n] = 0;
    m->note_error = error;
    ui_mark_dirty(u);
}

void ui_msg_remove(ui *u, ui_msg *m)
{
    pane *p = &u->pane;
    for (size_t i = p->n; i-- > 0;) {
        if (p->msgs[i] != m) continue;
        memmove(p->msgs + i, p->msgs + i + 1, (p->n - i - 1) * sizeof *p->msgs);
        p->n--;
        if (!p->follow) {
            if (i < p->top_msg) p->top_msg--;
            else if (i == p->top_msg) p->top_line = 0;
            if (p->top_msg >= p->n) pane_end(u);
        }
        msg_free(m);
        ui_mark_dirty(u);
        return;
    }
}

void ui_set_markdown(ui *u, int on)
{
    u->markdown = on != 0;
    int base = 0;
    for (size_t i = 0; i < u->pane.n; i++) {
        ui_msg *m = u->pane.msgs[i];
        if (m->role != UI_ROLE_ASSISTANT) continue;
        m->md_on = u->markdown;
        m->md_dirty = 1;
        m->code_base = base;
        m->wrap_width = 0;
        ensure_rendered(m);
        if (m->md_on) base += m->md.n_code;
    }
    ui_mark_dirty(u);
}

void ui_msg_set_heat(ui *u, ui_msg *m, const char *raw, size_t raw_len, const uint32_t *start, const uint32_t *end,
                     const float *p, size_t n)
{
    if (!m) return;
    free(m->heat_start);
    free(m->heat_end);
    free(m->heat_p);
    m->heat_start = m->heat_end = NULL;
    m->heat_p = NULL;
    m->n_heat = 0;
    if (n) {
        m->heat_start = malloc(n * sizeof *m->heat_start);
        m->heat_end = malloc(n * sizeof *m->heat_end);
        m->heat_p = malloc(n * sizeof *m->heat_p);
        char *tmp = malloc(3 * raw_len + 8);
        if (m->heat_start && m->heat_end && m->heat_p && tmp) {
            /* raw offsets to shown ones: the sanitized length of the text before each boundary
             * (pieces end on whole characters: a token's text is complete UTF-8) */
            size_t at = 0, shown = 0, k = 0;
            for (size_t i = 0; i < n; i++) {
                if (start[i] < at || end[i] < start[i] || end[i] > raw_len) break;
                shown += ui_sanitize(raw + at, start[i] - at, tmp, 3 * raw_len + 8);
                m->heat_start[k] = (uint32_t)shown;
                shown += ui_sanitize(raw + start[i], end[i] - start[i], tmp, 3 * raw_len + 8);
                m->heat_end[k] = (uint32_t)shown;
                m->heat_p[k++] = p[i];
                at = end[i];
            }
            m->n_heat = k;
        }
        free(tmp);
    }
    m->heat_raw = u->heat_on && m->n_heat;
    m->wrap_width = 0;
    ui_mark_dirty(u);
}

size_t ui_set_heat(ui *u, int on)
{
    u->heat_on = on != 0;
    size_t n = 0;
    for (size_t i = 0; i < u->pane.n; i++) {
        ui_msg *m = u->pane.msgs[i];
        n += m->n_heat > 0;
        int raw = u->heat_on && m->n_heat;
        if (raw != m->heat_raw) m->wrap_width = 0; /* the text as it is, or its rendering again */
        m->heat_raw = raw;
    }
    ui_mark_dirty(u);
    return n;
}

int ui_heat_on(const ui *u) { return u->heat_on; }

void ui_toggle_reasoning(ui *u)
{
    u->think_unfold = !u->think_unfold;
    for (size_t i = 0; i < u->pane.n; i++) u->pane.msgs[i]->think_wrap = 0;
    ui_mark_dirty(u);
}

void ui_pane_clear(ui *u)
{
    pane_free(&u->pane);
    u->pane.follow = 1;
    ui_mark_dirty(u);
}

size_t ui_pane_count(const ui *u) { return u->pane.n; }

void ui_notice(ui *u, int role, const char *fmt, ...)
{
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof buf) n = sizeof buf - 1;
    ui_msg_add(u, role, NULL, buf, (size_t)n);
    pane_end(u);
}

int pane_key(ui *u, int is_key, wint_t c)
{
    if (!is_key) return 0;
    switch (c) {
    case KEY_UP: pane_scroll(u, -1, u->pane_h, u->pane_w); break;
    case KEY_DOWN: pane_scroll(u, 1, u->pane_h, u->pane_w); break;
    case KEY_HOME: pane_home(u); break;
    case KEY_END: pane_end(u); break;
    case KEY_ENTER: u->focus = FOCUS_INPUT; break;
    default: break;
    }
    u->dirty = 1;
    return 1;
}
