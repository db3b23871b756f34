/* ui_internal: what the widgets of ui/ share — the ui object, the pane and slider models, drawing helpers. Not for use outside ui/. */
#ifndef UI_INTERNAL_H
#define UI_INTERNAL_H

#ifndef NCURSES_WIDECHAR
#define NCURSES_WIDECHAR 1
#endif
#include <curses.h>
#include <stdint.h>

#include "text.h"
#include "theme.h"
#include "ui.h"
#include "markdown.h"
#include "reasoning.h"

/* ---- chat pane ------------------------------------------------------------------------ */

struct ui_msg {
    int role;
    char label[160];
    char *text;        /* sanitized display text */
    size_t len, cap;
    int state;         /* enum ui_msg_state */
    char note[160];    /* marker line, "" for none */
    int note_error;
    int wrap_width;    /* lines are valid for this width (0: not wrapped) */
    ui_lines lines;    /* of the shown text: md.text when md_on, else text */
    int md_on;         /* a reply shown as rendered Markdown (ui/markdown.c) */
    int md_dirty;      /* md is older than text */
    int code_base;     /* code blocks of the messages above it (their numbers go on) */
    ui_md md;
    ui_reasoning rs;   /* a reply's reasoning block (ui/reasoning.h): shown dimmed, folded to one line */
    ui_lines think_lines; /* the reasoning wrapped, when unfolded */
    int think_wrap;    /* think_lines are valid for this width (0: not wrapped) */
    int think_words;   /* words of reasoning */
    /* the reply's token probabilities (ui_msg_set_heat): text[heat_start[i], heat_end[i]) came
     * from a token of probability heat_p[i] (display offsets, ascending); shown as colours, on
     * the text as it is (not its Markdown rendering), while u->heat_on (F6, /show probs) */
    uint32_t *heat_start, *heat_end;
    float *heat_p;
    size_t n_heat;
    int heat_raw;      /* the heat-map is on and this message has one: its text drawn as it is */
};

typedef struct pane {
    ui_msg **msgs;
    size_t n, cap;
    int follow;        /* pinned to the newest line */
    size_t top_msg;    /* when not following: first visible line is line top_line of msgs[top_msg] */
    int top_line;
    int new_below;     /* text arrived while scrolled up */
} pane;

/* Lines message m takes at content width w (label + text + note + blank separator). */
int pane_msg_lines(ui *u, ui_msg *m, int w);
/* Draw the pane in the rectangle; cost proportional to h, not to the number of messages. */
void pane_draw(ui *u, int y, int x, int h, int w);
/* Scroll by delta lines (negative: up) for a pane of height h and width w. */
void pane_scroll(ui *u, int delta, int h, int w);
void pane_home(ui *u);
void pane_end(ui *u);
void pane_free(pane *p);

/* ---- controls panel --------------------------------------------------------------------- */

typedef struct slider {
    const char *label;
    double min, max, step, value;
    int decimals;          /* 0: an integer */
    double off_value;      /* value shown as off_label */
    const char *off_label; /* "off", "∞" or NULL */
    int log;               /* logarithmic from min to max, off_value past the right end */
} slider;

void controls_init(ui *u, const ui_slider_spec *spec, int n_ctx);
/* Rows the panel wants; draws it in the rectangle. */
void controls_draw(ui *u, int y, int x, int h, int w);
/* Move the selected slider by `steps` (or to min/max with to_end = -1/+1); notifies. */
void controls_adjust(ui *u, int steps, int to_end);

/* Keys of our own (define_key in screen.c): Alt-Enter, bracketed paste, Ctrl-arrows. */
enum {
    KEYX_ALT_ENTER = KEY_MAX + 1,
    KEYX_PASTE_BEGIN,
    KEYX_PASTE_END,
    KEYX_CTRL_LEFT,
    KEYX_CTRL_RIGHT,
};

/* ---- each widget owns its keys (htop's Panel: the screen only dispatches) ----------------- */
/* A key for a widget: is_key 1 for a curses KEY_* code, 0 for a character. Returns 1 when the
 * widget used it (or swallows it), 0 to leave it to the screen. */
typedef int (*ui_key_fn)(ui *u, int is_key, wint_t c);
int controls_key(ui *u, int is_key, wint_t c); /* the slider panel (FOCUS_PANEL) */
int pane_key(ui *u, int is_key, wint_t c);     /* the chat pane's scrolling (FOCUS_PANE) */
int help_key(ui *u, int is_key, wint_t c);     /* the F1 overlay, while it is shown */
void controls_format(const slider *s, char *buf, size_t cap);

/* ---- input (readline bridge; readline is process-global, so is this) ------------------ */

int input_init(ui *u, const ui_config *cfg, char *why, size_t why_cap);
void input_shutdown(void);
/* Feed bytes to readline one at a time (keys, UTF-8 characters, ESC-prefixed meta keys). */
void input_feed(const char *bytes, size_t n);
/* Insert text literally at the cursor (pasted text, Alt-Enter's newline). */
void input_insert(const char *text);
/* Run a readline command (rl_backward_char …) as if its key was pressed. */
void input_command(int (*fn)(int, int));
int input_empty(void);
int input_starts_with_slash(void);
/* Clear a typed draft but keep it: in the kill ring (Ctrl-Y yanks it) and in the history (Up).
 * Returns 1 if there was one. */
int input_kill_draft(void);
void input_clear(void);
/* The line being edited (not NUL-terminated): *len bytes. */
const char *input_text(size_t *len);
/* Replace the line with text[0..len), cursor at the end; prompt NULL: "> ". */
void input_set(const char *text, size_t len, const char *prompt);
/* Rows the input wants at width w (prompt included), at most max_h. */
int input_rows(int w, int max_h);
/* Draw the prompt and the line; the cursor position goes to cy, cx. */
void input_draw(ui *u, int y, int x, int h, int w, int *cy, int *cx);
/* Called after a key was fed: restores a line the controller did not take. */
void input_after_keys(void);
void input_resize(int rows, int cols);

/* ---- sessions view (sessions.c) ---------------------------------------------------------- */

typedef struct sessions_view {
    int visible;
    ui_session_row *rows;  /* strings owned */
    size_t n, sel, top;
    int mode;              /* list, search, rename, confirm delete */
    char query[256];
    char edit[256];
    char status[200];
} sessions_view;

/* A key while the view is shown (is_key: c is a KEY_* code). */
void sessions_key(ui *u, int is_key, wint_t c);
void sessions_draw(ui *u);
void sessions_free(ui *u);

/* ---- the ui object ---------------------------------------------------------------------- */

enum ui_focus { FOCUS_INPUT = 0, FOCUS_PANEL, FOCUS_PANE };

struct ui {
    ui_callbacks cb;
    ui_theme theme;
    int mono;                 /* colours off */
    int colors;               /* COLORS the terminal has (0 if mono) */
    attr_t attr[UI_EL_COUNT]; /* curses attribute + colour pair per element */
    int unicode;              /* UTF-8 box drawing (locale is UTF-8 and the theme says unicode) */
    int mouse;

    char model_name[64], arch[32], weight_type[16], mode[32], params[48];
    int n_ctx, n_threads;
    char remote[96];          /* the server's URL ("" local) */

    pane pane;
    slider sliders[UI_SL_COUNT];
    int sel_slider;
    int panel_visible;
    int focus;
    int busy;
    int help_visible, help_scroll;
    char *help_text;
    sessions_view sess;

    int have_stats;
    int prefill_done, prefill_total; /* prefill progress (ui_set_prefill) */
    int stopping;                    /* Esc / Ctrl-C asked the running request to stop */
    gen_stats stats;
    int phase;
    char finish[48];
    int have_kv;
    kv_cache_stats kv;

    char flash[200];
    double flash_until;
    double ctrl_c_at;         /* first Ctrl-C on an empty input (ms), 0 if none */
    int markdown;                    /* replies are rendered as Markdown (ui_set_markdown) */
    int think_unfold;                /* reasoning blocks shown whole (F4), else one line each */
    int heat_on;                     /* replies coloured by their tokens' probabilities (F6) */
    int ctrl_x;                      /* Ctrl-X was the last key (Ctrl-X Ctrl-E: the editor) */
    int paste;                /* inside a bracketed paste */
    int editing;              /* the input holds a message being edited (ui_input_edit) */
    char *edit_text;          /* what ui_input_edit put there (Up / Down step while unchanged) */
    size_t edit_len;

    int dirty;                /* redraw at the next ui_render */
    int dirty_stream;         /* redraw soon (throttled) */
    double last_frame;
    int spinner;
    double spinner_at;
    int too_small;

    /* layout of the last frame */
    int pane_y, pane_x, pane_h, pane_w;
};

double ui_now_ms(void);
/* Draw UTF-8 text at (y, x) clipped to w cells with attribute a; returns cells drawn. Text
 * is sanitized on the way (so raw model text is safe here too). */
int ui_put(ui *u, int y, int x, int w, const char *s, size_t len, attr_t a);
int ui_puts(ui *u, int y, int x, int w, const char *s, attr_t a);
/* Fill n cells with character ch (a UTF-8 string of one character). */
void ui_fill(ui *u, int y, int x, int n, const char *ch, attr_t a);
/* A blank h x w box at (y, x) with a one-cell frame (box drawing, or +-| without Unicode). */
void ui_box(ui *u, int y, int x, int h, int w, attr_t a);
const char *ui_glyph(const ui *u, const char *unicode, const char *ascii);
void ui_mark_dirty(ui *u);

/* Help overlay. */
void help_draw(ui *u);

#endif
