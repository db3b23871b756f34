/* theme: the colour theme model, its INI file format, the theme search path and the built-in defaults (no curses). */
#ifndef UI_THEME_H
#define UI_THEME_H

#include <stddef.h>
#include <stdint.h>

/*
 * A theme file (themes/NAME.theme, INI read with inih):
 *
 *   [theme]
 *   border = unicode          ; unicode | ascii
 *   gauge_mid = 60            ; KV gauge turns "mid" at this % full …
 *   gauge_high = 85           ; … and "high" at this one
 *   [colors]
 *   ELEMENT = [bold] [dim] [reverse] [underline] [italic] FG [on BG]
 *
 * Colours: default, black, red, green, yellow, blue, magenta, cyan, white, bright-black …
 * bright-white (also gray/grey), 0-255 (the xterm palette) or #rrggbb (the nearest xterm
 * colour). Elements: see ui_theme_elem_name(). A line that cannot be used gives a warning
 * "FILE:LINE: what is wrong" and that key keeps its default; the rest of the file applies.
 */

enum ui_elem {
    UI_EL_TEXT = 0,       /* the screen: text and background */
    UI_EL_STATUS,         /* status bar */
    UI_EL_STATUS_ACCENT,  /* the model name / state in the status bar */
    UI_EL_BORDER,
    UI_EL_TITLE,          /* panel titles */
    UI_EL_USER,           /* "you" label */
    UI_EL_USER_TEXT,
    UI_EL_ASSISTANT,      /* the model's label */
    UI_EL_ASSISTANT_TEXT,
    UI_EL_NOTICE,         /* kvchat's own messages (command output) */
    UI_EL_ERROR,
    UI_EL_STOPPED,        /* "[stopped]" after a cancelled reply */
    UI_EL_SPINNER,
    UI_EL_SLIDER,         /* slider bar, filled part */
    UI_EL_SLIDER_TRACK,   /* slider bar, empty part */
    UI_EL_SLIDER_FOCUS,   /* the selected slider while the panel has focus */
    UI_EL_GAUGE_LOW,
    UI_EL_GAUGE_MID,
    UI_EL_GAUGE_HIGH,
    UI_EL_GAUGE_TRACK,
    UI_EL_STATS,
    UI_EL_INPUT,
    UI_EL_PROMPT,
    UI_EL_HELP,
    UI_EL_HELP_KEY,
    UI_EL_HEAT_HIGH,      /* the heat-map (F6): text of a token of probability >= 0.8 */
    UI_EL_HEAT_MID,       /* ... >= 0.3 */
    UI_EL_HEAT_LOW,       /* ... below 0.3 */
    UI_EL_COUNT
};

enum ui_attr {
    UI_ATTR_BOLD = 1,
    UI_ATTR_DIM = 2,
    UI_ATTR_REVERSE = 4,
    UI_ATTR_UNDERLINE = 8,
    UI_ATTR_ITALIC = 16,
};

#define UI_COLOR_DEFAULT (-1)

typedef struct ui_style {
    int16_t fg, bg;  /* UI_COLOR_DEFAULT or an xterm palette index 0-255 */
    uint16_t attrs;  /* enum ui_attr bits */
} ui_style;

typedef struct ui_theme {
    char name[64];
    char path[512];      /* file it came from, "" for the built-in one */
    int border_ascii;    /* 1: + - | borders and # bars */
    int gauge_mid_pct;   /* 0..100 */
    int gauge_high_pct;
    ui_style el[UI_EL_COUNT];
} ui_theme;

/* Name of an element as written in theme files ("user_text"), or NULL out of range. */
const char *ui_theme_elem_name(int elem);

/* The built-in default theme (dark; what default.theme also says). */
void ui_theme_builtin_default(ui_theme *t);

/* Parse one colour spec ("bold white on blue", "#268bd2", "244 on 234"). Returns 0 and fills
 * *st, or -1 with a reason in why (why_cap bytes). */
int ui_theme_parse_style(const char *spec, ui_style *st, char *why, size_t why_cap);

/* Nearest xterm-256 palette index (16-255) of an RGB colour. */
int ui_theme_rgb_to_xterm(int r, int g, int b);

/* RGB of an xterm-256 palette index (the standard xterm values). */
void ui_theme_xterm_rgb(int idx, int *r, int *g, int *b);

/* Nearest of the first n_basic (8 or 16) palette colours for index idx. */
int ui_theme_nearest_basic(int idx, int n_basic);

typedef void (*ui_theme_warn_fn)(void *ud, const char *msg);

/* Load a theme file over the built-in defaults. Warnings ("FILE:LINE: …") go to warn (may be
 * NULL). Returns 0, or -1 when the file cannot be opened (why says so). */
int ui_theme_load_file(const char *path, ui_theme *t, ui_theme_warn_fn warn, void *ud, char *why, size_t why_cap);

/* Theme directories, in search order: $XDG_CONFIG_HOME/kvchat/themes (default
 * ~/.config/kvchat/themes), KVCHAT_DATADIR/themes (the install dir, PREFIX/share/kvchat),
 * then themes/ next to the running binary. Fills up to max paths (each dir_cap bytes) and
 * returns how many. */
int ui_theme_dirs(char (*dirs)[512], int max);

/* Find and load theme `name`: a name containing '/' is a file path; otherwise NAME.theme in
 * ui_theme_dirs() order. "default" and "mono" exist even when no file is found (built in).
 * Returns 0, or -1 with why ("no theme 'x' (looked in …)"). */
int ui_theme_load(const char *name, ui_theme *t, ui_theme_warn_fn warn, void *ud, char *why, size_t why_cap);

/* Names of the themes found in the search path (deduplicated, sorted, plus the built-ins),
 * as one comma-separated string in buf. Returns the number of names. */
int ui_theme_list(char *buf, size_t cap);

/* Fill names[] (up to max, each malloc'd; caller frees) with the names ui_theme_list shows. */
int ui_theme_names(char **names, int max);

#endif
