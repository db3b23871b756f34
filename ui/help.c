/* help: the F1 overlay — a centred, scrollable box listing every key binding and slash command — and its keys (help_key). */
#include <string.h>

#include "ui_internal.h"

void help_draw(ui *u)
{
    const char *text = u->help_text ? u->help_text : "";
    int n_lines = 1;
    for (const char *p = text; *p; p++) n_lines += *p == '\n';
    int W = COLS, H = LINES;
    int bw = W - 4 < 78 ? W - 4 : 78;
    int bh = H - 2 < n_lines + 2 ? H - 2 : n_lines + 2;
    if (bw < 20 || bh < 4) return;
    int x0 = (W - bw) / 2, y0 = (H - bh) / 2;
    attr_t a = u->attr[UI_EL_HELP], k = u->attr[UI_EL_HELP_KEY];
    ui_box(u, y0, x0, bh, bw, a);
    ui_puts(u, y0, x0 + 2, bw - 4, " kvchat help ", k);
    const char *foot = u->unicode ? " ↑↓ PgUp PgDn scroll · any other key closes " : " Up/Down scroll - any other key closes ";
    int fw = ui_text_width(foot, strlen(foot));
    ui_puts(u, y0 + bh - 1, x0 + bw - 2 - fw > x0 + 1 ? x0 + bw - 2 - fw : x0 + 1, bw - 3, foot, a);
    int rows = bh - 2;
    int max_scroll = n_lines - rows > 0 ? n_lines - rows : 0;
    if (u->help_scroll > max_scroll) u->help_scroll = max_scroll;
    const char *p = text;
    for (int i = 0; i < u->help_scroll && p; i++) {
        p = strchr(p, '\n');
        if (p) p++;
    }
    for (int r = 0; r < rows && p && *p; r++) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        const char *tab = memchr(p, '\t', len);
        int y = y0 + 1 + r, x = x0 + 2, w = bw - 4;
        if (tab) {
            ui_put(u, y, x, w, p, (size_t)(tab - p), k);
            int kw = 22 < w ? 22 : w;
            ui_put(u, y, x + kw, w - kw, tab + 1, len - (size_t)(tab - p) - 1, a);
        } else {
            ui_put(u, y, x, w, p, len, len && p[0] != ' ' ? k : a);
        }
        p = e ? e + 1 : NULL;
    }
}

int help_key(ui *u, int is_key, wint_t c)
{
    if (!u->help_visible) return 0;
    if (!is_key) { /* any character (Ctrl-C too) closes it */
        ui_show_help(u, 0);
        return 1;
    }
    if (c == KEY_UP || c == KEY_PPAGE) u->help_scroll -= c == KEY_UP ? 1 : 10;
    else if (c == KEY_DOWN || c == KEY_NPAGE) u->help_scroll += c == KEY_DOWN ? 1 : 10;
    else if (c != KEY_RESIZE && c != KEY_MOUSE) u->help_visible = 0;
    if (u->help_scroll < 0) u->help_scroll = 0;
    u->dirty = 1;
    return c != KEY_RESIZE; /* a resize goes on to the screen */
}
