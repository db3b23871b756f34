/* text: UTF-8 decoding, terminal display width, safe display text and word wrapping by cells (no curses). */
#include "text.h"

#include <stdlib.h>
#include <string.h>
#include <wchar.h>

#define REPLACEMENT 0xFFFDu

size_t ui_utf8_decode(const char *str, size_t len, uint32_t *cp)
{
    const unsigned char *s = (const unsigned char *)str;
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t n;
    uint32_t v, min;
    if (c >= 0xC2 && c <= 0xDF) n = 2, v = c & 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) n = 3, v = c & 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) n = 4, v = c & 0x07, min = 0x10000;
    else {
        *cp = REPLACEMENT;
        return 1;
    }
    if (len < n) {
        *cp = REPLACEMENT;
        return 1;
    }
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *cp = REPLACEMENT;
            return 1;
        }
        v = v << 6 | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
        *cp = REPLACEMENT;
        return 1;
    }
    *cp = v;
    return n;
}

size_t ui_utf8_encode(uint32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = REPLACEMENT;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | cp >> 6);
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | cp >> 12);
        o[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | cp >> 18);
    o[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

int ui_cp_width(uint32_t cp)
{
    if (cp == '\n') return 0;
    if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp < 0xA0)) return 1; /* shown as a picture / U+FFFD */
    int w = wcwidth((wchar_t)cp);
    if (w < 0) return 1;                                                  /* shown as U+FFFD */
    return w > 2 ? 2 : w;
}

int ui_text_width(const char *s, size_t len)
{
    int w = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        i += ui_utf8_decode(s + i, len - i, &cp);
        w += ui_cp_width(cp);
    }
    return w;
}

uint32_t ui_control_picture(uint32_t cp)
{
    if (cp == '\t' || cp == '\n') return cp;
    if (cp < 0x20) return 0x2400 + cp;                /* ␀ … ␟: ␛ for ESC, ␍ for CR, ␇ for BEL */
    if (cp == 0x7F) return 0x2421;                    /* ␡ */
    if (cp >= 0x80 && cp < 0xA0) return REPLACEMENT;  /* C1 controls: U+009B is the 8-bit CSI */
    return cp;
}

/* The walk behind ui_neutralize (screen = 0) and ui_sanitize (screen = 1: tabs → four spaces,
 * code points wcwidth() cannot print → U+FFFD). */
static size_t neutralize(const char *s, size_t len, char *out, size_t cap, int screen)
{
    size_t o = 0;
    char tmp[4];
#define PUT(p, n)                                        \
    do {                                                 \
        if (o + (n) <= cap) memcpy(out + o, (p), (n));   \
        o += (n);                                        \
    } while (0)
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t n = ui_utf8_decode(s + i, len - i, &cp);
        i += n;
        if (cp == '\r' && i < len && s[i] == '\n') continue; /* CR LF: one line break */
        if (cp == '\t' && screen) {
            PUT("    ", 4);
            continue;
        }
        uint32_t show = ui_control_picture(cp);
        if (screen && show == cp && cp >= 0x80 && wcwidth((wchar_t)cp) < 0) show = REPLACEMENT;
        if (show < 0x80) {
            tmp[0] = (char)show;
            PUT(tmp, 1);
        } else { /* re-encoded, so an invalid byte becomes the 3 bytes of U+FFFD */
            size_t k = ui_utf8_encode(show, tmp);
            PUT(tmp, k);
        }
    }
#undef PUT
    return o;
}

size_t ui_neutralize(const char *s, size_t len, char *out, size_t cap) { return neutralize(s, len, out, cap, 0); }

size_t ui_sanitize(const char *s, size_t len, char *out, size_t cap) { return neutralize(s, len, out, cap, 1); }

static int push_line(ui_lines *out, size_t start, size_t end)
{
    if (out->n == out->cap) {
        size_t nc = out->cap ? out->cap * 2 : 16;
        ui_line *nv = realloc(out->v, nc * sizeof *nv);
        if (!nv) return -1;
        out->v = nv;
        out->cap = nc;
    }
    out->v[out->n].start = (uint32_t)start;
    out->v[out->n].end = (uint32_t)end;
    out->n++;
    return 0;
}

int ui_wrap(const char *s, size_t len, size_t from, int width, int mode, ui_lines *out)
{
    if (width < 1) width = 1;
    size_t pos = from;
    int word = mode == UI_WRAP_WORD;
    /* A line starts here; an empty line is emitted at the end only for the empty text or
     * text ending in '\n' (never after a soft break that consumed the trailing spaces). */
    int empty_line_at_end = 1;
    for (;;) {
        size_t start = pos;
        int col = 0, have_base = 0, in_space = 0;
        size_t brk_end = 0, brk_next = 0, run_start = 0;
        int have_brk = 0;
        for (;;) {
            if (pos >= len) {
                if (pos > start || empty_line_at_end) return push_line(out, start, pos);
                return 0;
            }
            uint32_t cp;
            size_t n = ui_utf8_decode(s + pos, len - pos, &cp);
            if (cp == '\n') {
                if (push_line(out, start, pos)) return -1;
                pos += n;
                empty_line_at_end = 1;
                break;
            }
            int w = ui_cp_width(cp);
            if (w == 0 && !have_base) w = 1; /* a mark with nothing to sit on gets a cell of its own */
            if (col + w > width && col > 0) {
                if (word && cp == ' ') { /* overflowing spaces hang: end the line, skip them */
                    if (push_line(out, start, in_space ? run_start : pos)) return -1;
                    while (pos < len && s[pos] == ' ') pos++;
                    empty_line_at_end = 0;
                    break;
                }
                if (word && have_brk) {
                    if (push_line(out, start, brk_end)) return -1;
                    pos = brk_next;
                    empty_line_at_end = 0;
                    break;
                }
                if (push_line(out, start, pos)) return -1; /* hard break: a word longer than the line */
                empty_line_at_end = 0;
                break;
            }
            if (word && cp == ' ') {
                if (!in_space) run_start = pos;
                in_space = 1;
                if (run_start > start) {
                    have_brk = 1;
                    brk_end = run_start;
                    brk_next = pos + n;
                }
            } else {
                in_space = 0;
            }
            col += w;
            if (w > 0) have_base = 1;
            pos += n;
            if (word && w == 2) { /* ideographs may break after any character */
                have_brk = 1;
                brk_end = brk_next = pos;
            }
        }
    }
}

void ui_lines_free(ui_lines *l)
{
    free(l->v);
    l->v = NULL;
    l->n = l->cap = 0;
}
