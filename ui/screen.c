/* screen: the ui object — curses setup and teardown, colours from the theme, the layout, key dispatch and the frame loop. */
#include <ctype.h>
#include <sys/wait.h>
#include <errno.h>
#include <fcntl.h>
#include <langinfo.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <readline/readline.h>

#include "ui_internal.h"

#define FRAME_MS 16   /* streamed text redraws at most this often */
#define SPINNER_MS 100
#define MIN_COLS 40
#define MIN_ROWS 10

static volatile sig_atomic_t g_curses_active;
static SCREEN *g_screen;

double ui_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

void ui_mark_dirty(ui *u) { u->dirty = 1; }

const char *ui_glyph(const ui *u, const char *unicode, const char *ascii) { return u->unicode ? unicode : ascii; }

/* ---- drawing helpers ------------------------------------------------------------------------ */

int ui_put(ui *u, int y, int x, int w, const char *s, size_t len, attr_t a)
{
    if (w <= 0 || y < 0 || y >= LINES || x < 0 || x >= COLS) return 0;
    if (x + w > COLS) w = COLS - x;
    wchar_t buf[1024];
    int n = 0, col = 0, have_base = 0;
    for (size_t i = 0; i < len && n < 1020;) {
        uint32_t cp;
        i += ui_utf8_decode(s + i, len - i, &cp);
        if (cp == '\n') break;
        int cw = ui_cp_width(cp);
        /* the same mapping as ui_sanitize, one cell per control character */
        uint32_t shown = ui_control_picture(cp);
        if (shown == cp && cp >= 0x80 && wcwidth((wchar_t)cp) < 0) shown = 0xFFFD;
        cp = shown == '\t' ? ' ' : shown;
        if (cw == 0 && !have_base) { /* a mark with nothing to sit on: give it a space */
            if (col + 1 > w) break;
            buf[n++] = L' ';
            col++;
        }
        if (col + cw > w) break;
        buf[n++] = (wchar_t)cp;
        col += cw;
        have_base = have_base || cw > 0;
    }
    if (!n) return 0;
    attrset(a);
    mvaddnwstr(y, x, buf, n);
    attrset(A_NORMAL);
    return col;
}

int ui_puts(ui *u, int y, int x, int w, const char *s, attr_t a) { return ui_put(u, y, x, w, s, strlen(s), a); }

void ui_box(ui *u, int y0, int x0, int bh, int bw, attr_t a)
{
    for (int y = 0; y < bh; y++) ui_fill(u, y0 + y, x0, bw, " ", a);
    ui_fill(u, y0, x0, bw, ui_glyph(u, "─", "-"), a);
    ui_fill(u, y0 + bh - 1, x0, bw, ui_glyph(u, "─", "-"), a);
    for (int y = 1; y < bh - 1; y++) {
        ui_puts(u, y0 + y, x0, 1, ui_glyph(u, "│", "|"), a);
        ui_puts(u, y0 + y, x0 + bw - 1, 1, ui_glyph(u, "│", "|"), a);
    }
    ui_puts(u, y0, x0, 1, ui_glyph(u, "┌", "+"), a);
    ui_puts(u, y0, x0 + bw - 1, 1, ui_glyph(u, "┐", "+"), a);
    ui_puts(u, y0 + bh - 1, x0, 1, ui_glyph(u, "└", "+"), a);
    ui_puts(u, y0 + bh - 1, x0 + bw - 1, 1, ui_glyph(u, "┘", "+"), a);
}

void ui_fill(ui *u, int y, int x, int n, const char *ch, attr_t a)
{
    if (n <= 0 || y < 0 || y >= LINES) return;
    uint32_t cp;
    ui_utf8_decode(ch, strlen(ch), &cp);
    wchar_t buf[512];
    if (x + n > COLS) n = COLS - x;
    if (n > 511) n = 511;
    if (n <= 0) return;
    for (int i = 0; i < n; i++) buf[i] = (wchar_t)cp;
    attrset(a);
    mvaddnwstr(y, x, buf, n);
    attrset(A_NORMAL);
}

/* ---- colours -------------------------------------------------------------------------------- */

static attr_t style_attrs(uint16_t f)
{
    attr_t a = 0;
    if (f & UI_ATTR_BOLD) a |= A_BOLD;
    if (f & UI_ATTR_DIM) a |= A_DIM;
    if (f & UI_ATTR_REVERSE) a |= A_REVERSE;
    if (f & UI_ATTR_UNDERLINE) a |= A_UNDERLINE;
#ifdef A_ITALIC
    if (f & UI_ATTR_ITALIC) a |= A_ITALIC;
#endif
    return a;
}

/* Emphasis that stands in for colour when there is none (NO_COLOR, a mono terminal). */
static attr_t mono_extra(int el)
{
    switch (el) {
    case UI_EL_STATUS: return A_REVERSE;
    case UI_EL_STATUS_ACCENT: return A_REVERSE | A_BOLD;
    case UI_EL_SLIDER_FOCUS: return A_REVERSE;
    case UI_EL_USER: case UI_EL_ASSISTANT: case UI_EL_TITLE: case UI_EL_HELP_KEY: case UI_EL_PROMPT: return A_BOLD;
    case UI_EL_ERROR: case UI_EL_GAUGE_HIGH: return A_BOLD;
    case UI_EL_NOTICE: case UI_EL_SLIDER_TRACK: case UI_EL_GAUGE_TRACK: return A_DIM;
    default: return 0;
    }
}

static int utf8_locale(void)
{
    const char *cs = nl_langinfo(CODESET);
    return cs && (!strcmp(cs, "UTF-8") || !strcmp(cs, "utf8"));
}

static void apply_theme(ui *u)
{
    const ui_theme *t = &u->theme;
    const char *nc = getenv("NO_COLOR");
    u->mono = (nc && *nc) || !has_colors();
    u->colors = 0;
    if (!u->mono) {
        start_color();
        use_default_colors();
        u->colors = COLORS;
    }
    int n = u->colors >= 256 ? 256 : u->colors >= 16 ? 16 : 8;
    for (int i = 0; i < UI_EL_COUNT; i++) {
        ui_style st = t->el[i];
        attr_t a = style_attrs(st.attrs);
        if (u->mono) {
            a |= mono_extra(i);
        } else {
            int fg = st.fg, bg = st.bg;
            if (fg < 0 && i != UI_EL_TEXT) fg = t->el[UI_EL_TEXT].fg;
            if (bg < 0 && i != UI_EL_TEXT) bg = t->el[UI_EL_TEXT].bg;
            if (n < 256) {
                if (n == 8 && fg >= 8 && fg < 16) a |= A_BOLD; /* bright = bold on 8 colours */
                fg = ui_theme_nearest_basic(fg, n);
                bg = ui_theme_nearest_basic(bg, n);
            }
            init_pair((short)(i + 1), (short)fg, (short)bg);
            a |= COLOR_PAIR(i + 1);
        }
        u->attr[i] = a;
    }
    u->unicode = utf8_locale() && !t->border_ascii;
    bkgdset(' ' | u->attr[UI_EL_TEXT]);
    u->dirty = 1;
}

void ui_set_theme(ui *u, const ui_theme *t)
{
    u->theme = *t;
    apply_theme(u);
    clearok(curscr, TRUE);
}

int ui_mono(const ui *u) { return u->mono; }

void ui_set_info(ui *u, const ui_info *i)
{
    snprintf(u->model_name, sizeof u->model_name, "%s", i->model_name ? i->model_name : "?");
    snprintf(u->arch, sizeof u->arch, "%s", i->arch ? i->arch : "?");
    snprintf(u->weight_type, sizeof u->weight_type, "%s", i->weight_type ? i->weight_type : "?");
    snprintf(u->params, sizeof u->params, "%s", i->params ? i->params : "");
    snprintf(u->mode, sizeof u->mode, "%s", i->mode ? i->mode : "");
    u->n_ctx = i->n_ctx;
    u->n_threads = i->n_threads;
    snprintf(u->remote, sizeof u->remote, "%s", i->remote ? i->remote : "");
    u->dirty = 1;
}

/* ---- open / close ----------------------------------------------------------------------------- */

ui *ui_open(const ui_config *cfg, const ui_callbacks *cb, const ui_theme *theme, char *why, size_t why_cap)
{
    if (!isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO)) {
        snprintf(why, why_cap, "the chat screen needs a terminal on standard input and output");
        return NULL;
    }
    ui *u = calloc(1, sizeof *u);
    if (!u) {
        snprintf(why, why_cap, "out of memory");
        return NULL;
    }
    u->cb = *cb;
    u->theme = *theme;
    u->pane.follow = 1;
    u->panel_visible = 1;
    u->mouse = cfg->mouse;
    if (cfg->help_text) u->help_text = strdup(cfg->help_text);
    controls_init(u, cfg->sliders, cfg->n_ctx);
    g_screen = newterm(NULL, stdout, stdin);
    if (!g_screen) {
        const char *term = getenv("TERM");
        snprintf(why, why_cap, "cannot use the terminal type '%s' (set TERM, e.g. TERM=xterm-256color)",
                 term ? term : "(unset)");
        free(u->help_text);
        free(u);
        return NULL;
    }
    set_term(g_screen);
    g_curses_active = 1;
    raw();
    noecho();
    nonl();
    keypad(stdscr, TRUE);
    nodelay(stdscr, TRUE);
    meta(stdscr, TRUE);
    /* a lone Esc (stop) waits this long for the rest of a key's sequence, which comes in the same
     * write from a terminal (or over SSH in one packet): 10 ms of the 100 ms a stop may take */
    set_escdelay(10);
    define_key("\033\r", KEYX_ALT_ENTER);
    define_key("\033\n", KEYX_ALT_ENTER);
    define_key("\033[200~", KEYX_PASTE_BEGIN);
    define_key("\033[201~", KEYX_PASTE_END);
    define_key("\033[1;5D", KEYX_CTRL_LEFT);
    define_key("\033[1;5C", KEYX_CTRL_RIGHT);
    if (u->mouse) {
        mousemask(BUTTON4_PRESSED | BUTTON5_PRESSED, NULL);
        mouseinterval(0);
    }
    apply_theme(u);
    fputs("\033[?2004h", stdout); /* bracketed paste */
    fflush(stdout);
    if (input_init(u, cfg, why, why_cap)) {
        ui_close(u);
        return NULL;
    }
    input_resize(LINES, COLS);
    u->dirty = 1;
    return u;
}

void ui_close(ui *u)
{
    if (!u) return;
    input_shutdown();
    if (g_curses_active) {
        if (u->mouse) mousemask(0, NULL);
        endwin();
        fputs("\033[?2004l", stdout);
        fflush(stdout);
        g_curses_active = 0;
    }
    if (g_screen) {
        delscreen(g_screen);
        g_screen = NULL;
    }
    pane_free(&u->pane);
    sessions_free(u);
    free(u->help_text);
    free(u->edit_text);
    free(u);
}

int ui_clipboard_set(ui *u, const char *text, size_t len, char *why, size_t why_cap)
{
    /* terminals known to drop OSC 52 silently: say so instead of pretending */
    static const char *const no_osc52[] = {"linux", "dumb", "vt100", "vt220", "cons25", NULL};
    const char *term = getenv("TERM");
    for (int i = 0; term && no_osc52[i]; i++)
        if (!strcmp(term, no_osc52[i])) {
            snprintf(why, why_cap, "this terminal (TERM=%s) has no clipboard escape (OSC 52); select the text with "
                     "the mouse%s", term, u->mouse ? " (Shift + drag)" : "");
            return -1;
        }
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t n = 4 * ((len + 2) / 3);
    char *enc = malloc(n + 1);
    if (!enc) {
        snprintf(why, why_cap, "out of memory");
        return -1;
    }
    size_t o = 0;
    for (size_t i = 0; i < len; i += 3) { /* RFC 4648 base64 */
        uint32_t v = (uint32_t)(unsigned char)text[i] << 16;
        if (i + 1 < len) v |= (uint32_t)(unsigned char)text[i + 1] << 8;
        if (i + 2 < len) v |= (unsigned char)text[i + 2];
        enc[o++] = b64[(v >> 18) & 63];
        enc[o++] = b64[(v >> 12) & 63];
        enc[o++] = i + 1 < len ? b64[(v >> 6) & 63] : '=';
        enc[o++] = i + 2 < len ? b64[v & 63] : '=';
    }
    enc[o] = 0;
    /* OSC 52 ; c (the clipboard) ; base64 ST — xterm's "Manipulate Selection Data" */
    fputs("\033]52;c;", stdout);
    fputs(enc, stdout);
    fputs("\033\\", stdout);
    fflush(stdout);
    free(enc);
    return 0;
}

void ui_emergency_restore(void)
{
    if (!g_curses_active) return;
    g_curses_active = 0;
    endwin();
    static const char off[] = "\033[?2004l\033[?1000l\033[?1002l\033[?1006l\033[?25h";
    ssize_t r = write(STDOUT_FILENO, off, sizeof off - 1);
    (void)r;
}

int ui_input_fd(const ui *u)
{
    (void)u;
    return STDIN_FILENO;
}

/* ---- state setters ------------------------------------------------------------------------------ */

void ui_set_stats(ui *u, const gen_stats *st, int phase, const char *finish_name)
{
    u->have_stats = st != NULL;
    if (st) u->stats = *st;
    u->phase = phase;
    snprintf(u->finish, sizeof u->finish, "%s", finish_name ? finish_name : "");
    u->dirty_stream = 1;
}

void ui_set_kv(ui *u, const kv_cache_stats *kv)
{
    u->have_kv = 1;
    u->kv = *kv;
    u->dirty_stream = 1;
}

void ui_set_busy(ui *u, int busy)
{
    u->busy = busy;
    u->stopping = 0;
    if (!busy) u->prefill_done = u->prefill_total = 0;
    u->dirty = 1;
}

void ui_set_prefill(ui *u, int done, int total)
{
    u->prefill_done = done;
    u->prefill_total = total;
    u->dirty_stream = 1;
}

void ui_show_help(ui *u, int on)
{
    u->help_visible = on;
    u->help_scroll = 0;
    u->dirty = 1;
}

void ui_flash(ui *u, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(u->flash, sizeof u->flash, fmt, ap);
    va_end(ap);
    u->flash_until = ui_now_ms() + 4000;
    u->dirty = 1;
}

/* ---- keys --------------------------------------------------------------------------------------- */

static int panel_shown(const ui *u) { return u->panel_visible && COLS >= 60; }

static void cycle_focus(ui *u, int dir)
{
    int order[3] = {FOCUS_INPUT, FOCUS_PANEL, FOCUS_PANE};
    int i = 0;
    while (order[i] != u->focus) i++;
    for (int k = 0; k < 3; k++) {
        i = (i + (dir > 0 ? 1 : 2)) % 3;
        if (order[i] == FOCUS_PANEL && !panel_shown(u)) continue;
        break;
    }
    u->focus = order[i];
    u->dirty = 1;
}

static void feed_wchar(wint_t wc)
{
    char b[4];
    size_t n = ui_utf8_encode((uint32_t)wc, b);
    input_feed(b, n);
}

static void on_interrupt(ui *u)
{
    if (u->help_visible) {
        ui_show_help(u, 0);
        return;
    }
    if (u->busy) {
        u->stopping = 1;
        if (u->cb.stop) u->cb.stop(u->cb.ud);
        return;
    }
    if (u->editing) { /* leave the edit: the message stays as it was */
        u->editing = 0;
        input_set("", 0, NULL);
        if (u->cb.edit_cancel) u->cb.edit_cancel(u->cb.ud);
        return;
    }
    if (input_kill_draft()) {
        ui_flash(u, "draft cleared — Ctrl-Y puts it back (Up finds it in the history too)");
        return;
    }
    double now = ui_now_ms();
    if (u->ctrl_c_at > 0 && now - u->ctrl_c_at < 3000) {
        if (u->cb.quit) u->cb.quit(u->cb.ud);
        return;
    }
    u->ctrl_c_at = now;
    ui_flash(u, "Press Ctrl-C again to quit (or Ctrl-D)");
}

static void page(ui *u, int dir)
{
    int h = u->pane_h > 2 ? u->pane_h - 2 : 1;
    pane_scroll(u, dir * h, u->pane_h, u->pane_w);
    u->dirty = 1;
}

static int input_key(ui *u, int is_key, wint_t c);

/* The widget that has the focus, and its key handler. */
static const ui_key_fn focus_keys[] = {[FOCUS_INPUT] = input_key, [FOCUS_PANEL] = controls_key, [FOCUS_PANE] = pane_key};

/* A key from the function-key range (KEY_*): the overlay shown, then the screen's own keys
 * (focus, function keys, scrolling by page, mouse, paste), then the focused widget's. */
static void on_key(ui *u, int k)
{
    if (help_key(u, 1, (wint_t)k)) return;
    switch (k) {
    case KEY_RESIZE:
        input_resize(LINES, COLS);
        if (u->focus == FOCUS_PANEL && !panel_shown(u)) u->focus = FOCUS_INPUT;
        clearok(curscr, TRUE);
        u->dirty = 1;
        return;
    case KEY_F(1): ui_show_help(u, !u->help_visible); return;
    case KEY_F(4):
        ui_toggle_reasoning(u);
        ui_flash(u, "reasoning %s (F4)", u->think_unfold ? "shown whole" : "folded to one line");
        return;
    case KEY_F(6):
        if (!ui_set_heat(u, !u->heat_on) && u->heat_on) ui_flash(u, "no token probabilities yet: a reply of the local engine has them (F6)");
        else ui_flash(u, "token probabilities %s (F6)", u->heat_on ? "shown: green >= 0.8, yellow >= 0.3, red below" : "hidden");
        return;
    case KEY_F(3):
        if (u->cb.sessions) u->cb.sessions(u->cb.ud, UI_SESS_SHOW, 0, NULL);
        return;
    case KEY_F(2):
        u->panel_visible = !u->panel_visible;
        if (u->panel_visible && panel_shown(u)) u->focus = FOCUS_PANEL;
        else if (u->focus == FOCUS_PANEL) u->focus = FOCUS_INPUT;
        if (u->panel_visible && !panel_shown(u)) ui_flash(u, "the controls need a terminal 60 columns wide");
        u->dirty = 1;
        return;
    case KEY_BTAB: cycle_focus(u, -1); return;
    case KEY_PPAGE: page(u, -1); return;
    case KEY_NPAGE: page(u, +1); return;
    case KEY_MOUSE: {
        MEVENT ev;
        if (getmouse(&ev) == OK) {
            if (ev.bstate & BUTTON4_PRESSED) pane_scroll(u, -3, u->pane_h, u->pane_w);
#ifdef BUTTON5_PRESSED
            else if (ev.bstate & BUTTON5_PRESSED) pane_scroll(u, 3, u->pane_h, u->pane_w);
#endif
            u->dirty = 1;
        }
        return;
    }
    case KEYX_PASTE_BEGIN:
        u->paste = 1;
        u->focus = FOCUS_INPUT;
        return;
    case KEYX_PASTE_END: u->paste = 0; return;
    case KEYX_ALT_ENTER:
        u->focus = FOCUS_INPUT;
        input_insert("\n");
        return;
    default: break;
    }
    focus_keys[u->focus](u, 1, (wint_t)k);
}

/* The input line's keys (readline's, and Up / Down stepping through your messages to edit). */
static int input_key(ui *u, int is_key, wint_t c)
{
    if (!is_key) return 0;
    int k = (int)c;
    switch (k) {
    case KEY_HOME:
        if (input_empty()) pane_home(u);
        else input_command(rl_beg_of_line);
        break;
    case KEY_END:
        if (input_empty()) pane_end(u);
        else input_command(rl_end_of_line);
        break;
    case KEY_LEFT: input_command(rl_backward_char); break;
    case KEY_RIGHT: input_command(rl_forward_char); break;
    case KEYX_CTRL_LEFT: input_command(rl_backward_word); break;
    case KEYX_CTRL_RIGHT: input_command(rl_forward_word); break;
    case KEY_UP:
    case KEY_DOWN: {
        int dir = k == KEY_UP ? -1 : 1;
        if (!u->busy && u->cb.edit_step) {
            size_t len;
            const char *t = input_text(&len);
            int unchanged = u->editing && len == u->edit_len && !memcmp(t, u->edit_text, len);
            if (((!u->editing && dir < 0 && input_empty()) || unchanged) && u->cb.edit_step(u->cb.ud, dir)) break;
            if (u->editing && !unchanged) { /* keep the edit: history would replace it */
                ui_flash(u, "Enter sends the edited message · Esc cancels the edit");
                break;
            }
        }
        input_command(dir < 0 ? rl_get_previous_history : rl_get_next_history);
        break;
    }
    case KEY_DC: input_command(rl_delete); break;
    case KEY_BACKSPACE: input_feed("\177", 1); break;
    case KEY_ENTER: input_feed("\r", 1); break;
    default: break;
    }
    u->dirty = 1;
    return 1;
}

/* Ctrl-X Ctrl-E: the input in $VISUAL / $EDITOR (else vi), as bash does; the text the editor
 * leaves becomes the input (one final newline dropped). The screen is left while it runs. */
static void edit_in_editor(ui *u)
{
    size_t len;
    const char *text = input_text(&len);
    const char *tmpdir = getenv("TMPDIR");
    char path[600];
    snprintf(path, sizeof path, "%s/kvchat-edit-XXXXXX", tmpdir && *tmpdir == '/' ? tmpdir : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0) {
        ui_flash(u, "Ctrl-X Ctrl-E: cannot create a file in %s: %s", tmpdir ? tmpdir : "/tmp", strerror(errno));
        return;
    }
    int ok = write(fd, text, len) == (ssize_t)len;
    close(fd);
    const char *ed = getenv("VISUAL");
    if (!ed || !*ed) ed = getenv("EDITOR");
    if (!ed || !*ed) ed = "vi";
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "%s '%s'", ed, path); /* the editor may carry arguments; the path has no quote */
    fputs("\033[?2004l", stdout); /* no bracketed paste for the editor */
    fflush(stdout);
    def_prog_mode();
    endwin();
    int st = ok ? system(cmd) : -1;
    reset_prog_mode();
    fputs("\033[?2004h", stdout);
    fflush(stdout);
    clearok(curscr, TRUE);
    u->dirty = 1;
    if (st != 0) {
        ui_flash(u, "%s exited with status %d: the input is unchanged", ed, st < 0 ? st : WEXITSTATUS(st));
        unlink(path);
        return;
    }
    FILE *f = fopen(path, "rb");
    char *buf = malloc(1 << 20);
    size_t n = f && buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    if (f) fclose(f);
    unlink(path);
    if (!buf) return;
    if (n && buf[n - 1] == '\n') n--;
    input_set(buf, n, NULL);
    free(buf);
    ui_flash(u, "the input came back from %s (Enter sends it)", ed);
}

/* An ordinary character (or control byte). */
static void on_char(ui *u, wint_t c)
{
    if (u->ctrl_x && !u->paste) { /* the key after Ctrl-X */
        u->ctrl_x = 0;
        if (c == 5) {
            edit_in_editor(u);
            return;
        }
        input_feed("\030", 1); /* readline's own Ctrl-X prefix */
    } else if (c == 24 && !u->paste && !u->help_visible && u->focus == FOCUS_INPUT) {
        u->ctrl_x = 1;
        return;
    }
    if (u->paste) { /* pasted text goes in as it is, newlines included */
        char b[5];
        if (c == '\r') c = '\n';
        b[ui_utf8_encode((uint32_t)c, b)] = 0;
        input_insert(b);
        return;
    }
    if (help_key(u, 0, c)) return;
    if (c == 3) { /* Ctrl-C */
        on_interrupt(u);
        return;
    }
    if (c != 3) u->ctrl_c_at = 0;
    if (c == 27) { /* Esc alone: stop a reply, close the help, go back to the input */
        if (u->busy && u->cb.stop) {
            u->stopping = 1;
            u->cb.stop(u->cb.ud);
        } else if (u->focus != FOCUS_INPUT) u->focus = FOCUS_INPUT;
        else if (u->editing) on_interrupt(u); /* leaves the edit */
        u->dirty = 1;
        return;
    }
    if (c == '\t') {
        if (u->focus == FOCUS_INPUT && input_starts_with_slash()) input_feed("\t", 1);
        else cycle_focus(u, +1);
        return;
    }
    if (c == 12) { /* Ctrl-L */
        clearok(curscr, TRUE);
        u->dirty = 1;
        return;
    }
    if (c == 26) { /* Ctrl-Z: curses' own SIGTSTP handler leaves and restores the screen */
        fputs("\033[?2004l", stdout);
        fflush(stdout);
        raise(SIGTSTP);
        fputs("\033[?2004h", stdout);
        fflush(stdout);
        clearok(curscr, TRUE);
        u->dirty = 1;
        return;
    }
    if (u->focus != FOCUS_INPUT && focus_keys[u->focus](u, 0, c)) return;
    if (c == '\r' || c == '\n') {
        if (u->focus != FOCUS_INPUT) {
            u->focus = FOCUS_INPUT;
            u->dirty = 1;
            return;
        }
    } else if (u->focus != FOCUS_INPUT && c >= 0x20) {
        u->focus = FOCUS_INPUT; /* typing goes to the input wherever the focus was */
    } else if (u->focus != FOCUS_INPUT) {
        return;
    }
    if (c == 4 && input_empty()) { /* Ctrl-D */
        if (u->cb.quit) u->cb.quit(u->cb.ud);
        return;
    }
    feed_wchar(c);
    u->dirty = 1;
}

void ui_input_edit(ui *u, const char *text, size_t len, const char *prompt)
{
    char *copy = malloc(len ? len : 1);
    if (!copy) return;
    if (len) memcpy(copy, text, len);
    free(u->edit_text);
    u->edit_text = copy;
    u->edit_len = len;
    u->focus = FOCUS_INPUT;
    u->editing = 1;
    input_set(text, len, prompt);
    u->dirty = 1;
}

void ui_input_edit_end(ui *u)
{
    u->editing = 0;
    input_set("", 0, NULL);
    u->dirty = 1;
}

void ui_handle_input(ui *u)
{
    for (int guard = 0; guard < 4096; guard++) {
        wint_t wc;
        int r = get_wch(&wc);
        if (r == ERR) break;
        if (u->sess.visible && !u->help_visible && !(r == KEY_CODE_YES && (wc == KEY_RESIZE || wc == KEY_F(1)))) {
            if (r == OK && wc == 27) { /* Esc, and a key typed right after it: both count */
                wint_t w2;
                int r2 = get_wch(&w2);
                sessions_key(u, 0, 27);
                if (r2 == ERR) continue;
                if (u->sess.visible) sessions_key(u, r2 == KEY_CODE_YES, w2);
                else if (r2 == KEY_CODE_YES) on_key(u, (int)w2);
                else on_char(u, w2);
                continue;
            }
            sessions_key(u, r == KEY_CODE_YES, wc);
            continue;
        }
        if (r == KEY_CODE_YES) {
            on_key(u, (int)wc);
            continue;
        }
        if (wc == 27 && !u->paste) {
            /* Esc alone, or Esc + a key = Meta/Alt-key (readline's M- bindings) */
            wint_t w2;
            int r2 = get_wch(&w2);
            /* Alt-Enter, and Alt + a letter / Backspace / . < > (readline's word moves, yank-last-
             * arg …) when no reply runs; anything else after Esc (a burst over a slow link, "Esc
             * /set …") is Esc and then that key */
            int alt = r2 == OK && (w2 == '\r' || w2 == '\n' ||
                                   (!u->busy && ((w2 < 128 && isalpha((int)w2)) || w2 == 127 || w2 == 8 ||
                                                 w2 == '.' || w2 == '<' || w2 == '>' || w2 == '_')));
            if (alt && !u->help_visible) {
                if (u->focus != FOCUS_INPUT) u->focus = FOCUS_INPUT;
                char b[5] = {27};
                size_t n = ui_utf8_encode((uint32_t)w2, b + 1);
                input_feed(b, n + 1);
                u->dirty = 1;
                continue;
            }
            on_char(u, 27);
            if (r2 == KEY_CODE_YES) on_key(u, (int)w2);
            else if (r2 == OK) on_char(u, w2);
            continue;
        }
        on_char(u, wc);
    }
}

/* ---- frame ------------------------------------------------------------------------------------- */

void draw_status(ui *u, int y, int w);
void draw_gauge(ui *u, int y, int w);
void draw_stats(ui *u, int y, int w);

static void draw_border_row(ui *u, int y, int w)
{
    attr_t b = u->attr[UI_EL_BORDER];
    ui_fill(u, y, 0, w, ui_glyph(u, "─", "-"), b);
    if (panel_shown(u) && u->pane_w < w) ui_puts(u, y, u->pane_w, 1, ui_glyph(u, "┴", "+"), b);
    char t[160] = "";
    if (u->focus == FOCUS_PANE)
        snprintf(t, sizeof t, " %s ", u->unicode ? "chat: ↑↓ PgUp PgDn Home End · Tab: next · Esc: input"
                                                 : "chat: Up Down PgUp PgDn Home End - Tab: next - Esc: input");
    else if (!u->pane.follow)
        snprintf(t, sizeof t, " %s ", u->pane.new_below ? (u->unicode ? "↓ new text below · End: latest" : "new text below - End: latest")
                                                        : (u->unicode ? "↑ scrolled back · End: latest" : "scrolled back - End: latest"));
    if (t[0]) ui_puts(u, y, 2, w - 4, t, u->attr[UI_EL_TITLE]);
}

static void draw_frame(ui *u)
{
    int H = LINES, W = COLS;
    erase();
    if (W < MIN_COLS || H < MIN_ROWS) {
        u->too_small = 1;
        char a[64], b[64];
        snprintf(a, sizeof a, "terminal too small");
        snprintf(b, sizeof b, "%dx%d, need %dx%d", W, H, MIN_COLS, MIN_ROWS);
        int y = H / 2 - 1 < 0 ? 0 : H / 2 - 1;
        int la = (int)strlen(a), lb = (int)strlen(b);
        ui_puts(u, y, W > la ? (W - la) / 2 : 0, W, a, u->attr[UI_EL_ERROR]);
        if (y + 1 < H) ui_puts(u, y + 1, W > lb ? (W - lb) / 2 : 0, W, b, u->attr[UI_EL_TEXT]);
        curs_set(0);
        wnoutrefresh(stdscr);
        doupdate();
        return;
    }
    u->too_small = 0;
    int max_in = H / 4 > 1 ? H / 4 : 1;
    int in_h = input_rows(W, max_in);
    int y_in = H - in_h, y_stats = y_in - 1, y_gauge = y_stats - 1, y_border = y_gauge - 1;
    u->pane_y = 1;
    u->pane_h = y_border - 1;
    u->pane_x = 0;
    u->pane_w = W;
    if (panel_shown(u)) {
        int pw = W >= 100 ? 30 : 26;
        u->pane_w = W - pw - 1;
        attr_t b = u->attr[UI_EL_BORDER];
        for (int y = 1; y < y_border; y++) ui_puts(u, y, u->pane_w, 1, ui_glyph(u, "│", "|"), b);
        controls_draw(u, 1, u->pane_w + 1, u->pane_h, pw);
    }
    draw_status(u, 0, W);
    pane_draw(u, u->pane_y, u->pane_x, u->pane_h, u->pane_w);
    draw_border_row(u, y_border, W);
    draw_gauge(u, y_gauge, W);
    draw_stats(u, y_stats, W);
    int cy = y_in, cx = 0;
    input_draw(u, y_in, 0, in_h, W, &cy, &cx);
    if (u->sess.visible) sessions_draw(u);
    if (u->help_visible) help_draw(u);
    if (u->focus == FOCUS_INPUT && !u->help_visible && !u->sess.visible) {
        curs_set(1);
        move(cy, cx);
    } else {
        curs_set(0);
    }
    wnoutrefresh(stdscr);
    doupdate();
}

static int any_waiting(const ui *u)
{
    return u->busy && u->pane.n && u->pane.msgs[u->pane.n - 1]->state == UI_MSG_WAITING;
}

int ui_timeout_ms(ui *u)
{
    double now = ui_now_ms();
    double t = -1;
#define AT(when)                                          \
    do {                                                  \
        double d_ = (when) - now;                         \
        if (d_ < 0) d_ = 0;                               \
        if (t < 0 || d_ < t) t = d_;                      \
    } while (0)
    if (u->dirty) AT(now);
    if (u->dirty_stream) AT(u->last_frame + FRAME_MS);
    if (any_waiting(u) || (u->busy && u->phase == UI_PHASE_PREFILL)) AT(u->spinner_at + SPINNER_MS);
    if (u->flash[0]) AT(u->flash_until);
    if (u->ctrl_c_at > 0) AT(u->ctrl_c_at + 3000);
#undef AT
    return t < 0 ? -1 : (int)ceil(t);
}

void ui_render(ui *u)
{
    double now = ui_now_ms();
    if ((any_waiting(u) || (u->busy && u->phase == UI_PHASE_PREFILL)) && now - u->spinner_at >= SPINNER_MS) {
        u->spinner++;
        u->spinner_at = now;
        u->dirty = 1;
    }
    if (u->flash[0] && now >= u->flash_until) {
        u->flash[0] = 0;
        u->dirty = 1;
    }
    if (u->ctrl_c_at > 0 && now - u->ctrl_c_at >= 3000) u->ctrl_c_at = 0;
    if (!u->dirty && !(u->dirty_stream && now - u->last_frame >= FRAME_MS)) return;
    draw_frame(u);
    u->dirty = u->dirty_stream = 0;
    u->last_frame = now;
}
