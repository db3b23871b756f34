/* sessions: the F3 / /sessions overlay — the saved conversations (title, model, date, message and branch counts) with live search, open, rename, delete and new; the rows come from the controller (the UI knows nothing of storage). */
#include <stdlib.h>
#include <string.h>

#include "ui_internal.h"

enum { SV_LIST = 0, SV_SEARCH, SV_RENAME, SV_CONFIRM };

static void rows_free(sessions_view *v)
{
    for (size_t i = 0; i < v->n; i++) {
        free((char *)v->rows[i].title);
        free((char *)v->rows[i].model);
        free((char *)v->rows[i].date);
        free((char *)v->rows[i].snippet);
    }
    free(v->rows);
    v->rows = NULL;
    v->n = 0;
}

void sessions_free(ui *u) { rows_free(&u->sess); }

static char *dup_or_empty(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    char *d = malloc(n + 1);
    if (d) {
        if (n) memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

void ui_sessions_show(ui *u, const ui_session_row *rows, size_t n, const char *status)
{
    sessions_view *v = &u->sess;
    long long keep = v->sel < v->n ? v->rows[v->sel].id : -1;
    int was_visible = v->visible;
    rows_free(v);
    v->rows = calloc(n ? n : 1, sizeof *v->rows);
    if (v->rows) {
        for (size_t i = 0; i < n; i++) {
            v->rows[i] = rows[i];
            v->rows[i].title = dup_or_empty(rows[i].title);
            v->rows[i].model = dup_or_empty(rows[i].model);
            v->rows[i].date = dup_or_empty(rows[i].date);
            v->rows[i].snippet = rows[i].snippet ? dup_or_empty(rows[i].snippet) : NULL;
            for (char *p = (char *)v->rows[i].snippet; p && *p; p++) /* one line */
                if (*p == '\n' || *p == '\r' || *p == '\t') *p = ' ';
        }
        v->n = n;
    }
    v->sel = 0;
    for (size_t i = 0; i < v->n; i++)
        if (was_visible ? v->rows[i].id == keep : v->rows[i].current) v->sel = i;
    if (!was_visible) {
        v->mode = SV_LIST;
        v->query[0] = 0;
        v->top = 0;
    }
    snprintf(v->status, sizeof v->status, "%s", status ? status : "");
    v->visible = 1;
    u->dirty = 1;
}

void ui_sessions_hide(ui *u)
{
    u->sess.visible = 0;
    u->sess.mode = SV_LIST;
    u->dirty = 1;
}

int ui_sessions_visible(const ui *u) { return u->sess.visible; }

static void notify(ui *u, int action, long long id, const char *text)
{
    if (u->cb.sessions) u->cb.sessions(u->cb.ud, action, id, text);
}

/* Remove the last UTF-8 character of s. */
static void pop_char(char *s)
{
    size_t n = strlen(s);
    while (n > 0) {
        n--;
        if (((unsigned char)s[n] & 0xC0) != 0x80) break;
    }
    s[n] = 0;
}

static void push_char(char *s, size_t cap, wint_t c)
{
    char b[5];
    size_t k = ui_utf8_encode((uint32_t)c, b), n = strlen(s);
    if (n + k + 1 > cap) return;
    memcpy(s + n, b, k);
    s[n + k] = 0;
}

/* Rows of the list area (the frame, search line, header and footer take 5). */
static int list_rows(void) { return (LINES - 2 > 8 ? LINES - 2 : 8) - 6; }

static void move_sel(sessions_view *v, long d)
{
    if (!v->n) return;
    long s = (long)v->sel + d;
    if (s < 0) s = 0;
    if (s >= (long)v->n) s = (long)v->n - 1;
    v->sel = (size_t)s;
}

void sessions_key(ui *u, int is_key, wint_t c)
{
    sessions_view *v = &u->sess;
    u->dirty = 1;
    if (v->mode == SV_SEARCH || v->mode == SV_RENAME) {
        char *buf = v->mode == SV_SEARCH ? v->query : v->edit;
        size_t cap = v->mode == SV_SEARCH ? sizeof v->query : sizeof v->edit;
        if (is_key ? c == KEY_BACKSPACE : (c == 127 || c == 8)) {
            pop_char(buf);
            if (v->mode == SV_SEARCH) notify(u, UI_SESS_SEARCH, 0, v->query);
        } else if (is_key ? c == KEY_ENTER : (c == '\r' || c == '\n')) {
            if (v->mode == SV_RENAME && v->sel < v->n) notify(u, UI_SESS_RENAME, v->rows[v->sel].id, v->edit);
            v->mode = SV_LIST;
        } else if (!is_key && c == 27) {
            if (v->mode == SV_SEARCH && v->query[0]) {
                v->query[0] = 0;
                notify(u, UI_SESS_SEARCH, 0, "");
            }
            v->mode = SV_LIST;
        } else if (!is_key && c == 21) { /* Ctrl-U */
            buf[0] = 0;
            if (v->mode == SV_SEARCH) notify(u, UI_SESS_SEARCH, 0, "");
        } else if (!is_key && c >= 0x20 && c != 0x7f) {
            push_char(buf, cap, c);
            if (v->mode == SV_SEARCH) notify(u, UI_SESS_SEARCH, 0, v->query);
        } else if (is_key && (c == KEY_UP || c == KEY_DOWN)) {
            if (v->mode == SV_SEARCH) v->mode = SV_LIST;
            move_sel(v, c == KEY_UP ? -1 : 1);
        }
        return;
    }
    if (v->mode == SV_CONFIRM) {
        if (!is_key && (c == 'y' || c == 'Y') && v->sel < v->n) {
            v->mode = SV_LIST;
            notify(u, UI_SESS_DELETE, v->rows[v->sel].id, NULL);
        } else {
            v->mode = SV_LIST;
        }
        return;
    }
    if (is_key) {
        switch (c) {
        case KEY_UP: move_sel(v, -1); break;
        case KEY_DOWN: move_sel(v, 1); break;
        case KEY_PPAGE: move_sel(v, -list_rows()); break;
        case KEY_NPAGE: move_sel(v, list_rows()); break;
        case KEY_HOME: v->sel = 0; break;
        case KEY_END: if (v->n) v->sel = v->n - 1; break;
        case KEY_ENTER: if (v->sel < v->n) notify(u, UI_SESS_OPEN, v->rows[v->sel].id, NULL); break;
        case KEY_DC: if (v->n) v->mode = SV_CONFIRM; break;
        case KEY_F(3): ui_sessions_hide(u); break;
        default: break;
        }
        return;
    }
    switch (c) {
    case 27:
        if (v->query[0]) { /* Esc first clears the search, then closes */
            v->query[0] = 0;
            notify(u, UI_SESS_SEARCH, 0, "");
        } else {
            ui_sessions_hide(u);
        }
        break;
    case 'q': case 7: ui_sessions_hide(u); break;
    case '\r': case '\n': if (v->sel < v->n) notify(u, UI_SESS_OPEN, v->rows[v->sel].id, NULL); break;
    case '/': case 6: /* Ctrl-F */ v->mode = SV_SEARCH; break;
    case 'r':
        if (v->sel < v->n) {
            snprintf(v->edit, sizeof v->edit, "%s", v->rows[v->sel].title);
            v->mode = SV_RENAME;
        }
        break;
    case 'd': if (v->n) v->mode = SV_CONFIRM; break;
    case 'n': notify(u, UI_SESS_NEW, 0, NULL); break;
    case 'k': move_sel(v, -1); break;
    case 'j': move_sel(v, 1); break;
    default: break;
    }
}

/* A search snippet on one line from x, at most w cells: the text between UI_HL_ON and UI_HL_OFF
 * in the highlight attribute hl, the rest in a (ui_put counts display cells and keeps UTF-8
 * whole). */
static void draw_snippet(ui *u, int y, int x, int w, const char *s, attr_t a, attr_t hl)
{
    int on = 0;
    while (*s && w > 0) {
        size_t n = strcspn(s, "\x02\x03");
        if (n) {
            int used = ui_put(u, y, x, w, s, n, on ? hl : a);
            if (used <= 0) break;
            x += used;
            w -= used;
        }
        s += n;
        if (*s) on = *s++ == UI_HL_ON;
    }
}

void sessions_draw(ui *u)
{
    sessions_view *v = &u->sess;
    int W = COLS, H = LINES;
    int bw = W - 2 < 110 ? W - 2 : 110, bh = H - 2;
    if (bw < 30 || bh < 8) return;
    int x0 = (W - bw) / 2, y0 = 1;
    attr_t a = u->attr[UI_EL_HELP], k = u->attr[UI_EL_HELP_KEY];
    ui_box(u, y0, x0, bh, bw, a);
    char t[96];
    snprintf(t, sizeof t, " conversations (%zu) ", v->n);
    ui_puts(u, y0, x0 + 2, bw - 4, t, k);
    int x = x0 + 2, w = bw - 4, y = y0 + 1;
    /* search / rename / confirm line */
    char line[600];
    if (v->mode == SV_RENAME) snprintf(line, sizeof line, "rename to: %s_", v->edit);
    else if (v->mode == SV_CONFIRM && v->sel < v->n)
        snprintf(line, sizeof line, "delete conversation %lld \"%.60s\" and all its messages? y/n", v->rows[v->sel].id,
                 v->rows[v->sel].title);
    else if (v->mode == SV_SEARCH) snprintf(line, sizeof line, "search: %s_", v->query);
    else if (v->query[0]) snprintf(line, sizeof line, "search: %s  (/ to change, Esc clears)", v->query);
    else snprintf(line, sizeof line, "%s", v->status[0] ? v->status : "/ search");
    ui_puts(u, y++, x, w, line, v->mode == SV_CONFIRM ? u->attr[UI_EL_ERROR] : k);
    snprintf(line, sizeof line, "  %5s  %-16s  %-16s %5s %4s  %s", "ID", "updated", "model", "msgs", "br", "title");
    ui_puts(u, y++, x, w, line, k);
    /* a search shows each match's snippet on the line below its row */
    int per = 1;
    for (size_t i = 0; i < v->n && per == 1; i++)
        if (v->rows[i].snippet) per = 2;
    int rows = (bh - 5) / per;
    if (rows < 1) rows = 1;
    if (v->sel < v->top) v->top = v->sel;
    if (v->sel >= v->top + (size_t)rows) v->top = v->sel - (size_t)rows + 1;
    if (!v->n) ui_puts(u, y, x, w, v->query[0] ? "  no conversation matches" : "  no saved conversations yet", a);
    for (int r = 0; r < rows && v->top + (size_t)r < v->n; r++) {
        const ui_session_row *row = &v->rows[v->top + (size_t)r];
        int sel = v->top + (size_t)r == v->sel;
        snprintf(line, sizeof line, "%s %5lld  %-16.16s  %-16.16s %5d %4d  %s", row->current ? "*" : " ", row->id,
                 row->date, row->model, row->n_messages, row->n_branches, row->title[0] ? row->title : "(untitled)");
        int ry = y + r * per;
        if (sel) ui_fill(u, ry, x, w, " ", u->attr[UI_EL_SLIDER_FOCUS]);
        ui_puts(u, ry, x, w, line, sel ? u->attr[UI_EL_SLIDER_FOCUS] : a);
        if (row->snippet) draw_snippet(u, ry + 1, x + 9, w - 9, row->snippet, a, k | A_REVERSE);
    }
    const char *foot = u->unicode ? " Enter open · / search · r rename · d delete · n new · Esc close "
                                  : " Enter open - / search - r rename - d delete - n new - Esc close ";
    int fw = ui_text_width(foot, strlen(foot));
    ui_puts(u, y0 + bh - 1, x0 + bw - 2 - fw > x0 + 1 ? x0 + bw - 2 - fw : x0 + 1, bw - 3, foot, a);
}
