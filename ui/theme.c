/* theme: the colour theme model, its INI file format, the theme search path and the built-in defaults (no curses). */
#include "theme.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <ini.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#ifndef KVCHAT_DATADIR
#define KVCHAT_DATADIR "/usr/local/share/kvchat"
#endif

static const char *const elem_names[UI_EL_COUNT] = {
    [UI_EL_TEXT] = "text",
    [UI_EL_STATUS] = "status",
    [UI_EL_STATUS_ACCENT] = "status_accent",
    [UI_EL_BORDER] = "border",
    [UI_EL_TITLE] = "title",
    [UI_EL_USER] = "user",
    [UI_EL_USER_TEXT] = "user_text",
    [UI_EL_ASSISTANT] = "assistant",
    [UI_EL_ASSISTANT_TEXT] = "assistant_text",
    [UI_EL_NOTICE] = "notice",
    [UI_EL_ERROR] = "error",
    [UI_EL_STOPPED] = "stopped",
    [UI_EL_SPINNER] = "spinner",
    [UI_EL_SLIDER] = "slider",
    [UI_EL_SLIDER_TRACK] = "slider_track",
    [UI_EL_SLIDER_FOCUS] = "slider_focus",
    [UI_EL_GAUGE_LOW] = "gauge_low",
    [UI_EL_GAUGE_MID] = "gauge_mid",
    [UI_EL_GAUGE_HIGH] = "gauge_high",
    [UI_EL_GAUGE_TRACK] = "gauge_track",
    [UI_EL_STATS] = "stats",
    [UI_EL_INPUT] = "input",
    [UI_EL_PROMPT] = "prompt",
    [UI_EL_HELP] = "help",
    [UI_EL_HELP_KEY] = "help_key",
    [UI_EL_HEAT_HIGH] = "heat_high",
    [UI_EL_HEAT_MID] = "heat_mid",
    [UI_EL_HEAT_LOW] = "heat_low",
};

const char *ui_theme_elem_name(int elem)
{
    return elem >= 0 && elem < UI_EL_COUNT ? elem_names[elem] : NULL;
}

/* The built-in default: the same as themes/default.theme. */
static const char *const builtin_default[UI_EL_COUNT] = {
    [UI_EL_TEXT] = "default",
    [UI_EL_STATUS] = "white on blue",
    [UI_EL_STATUS_ACCENT] = "bold yellow on blue",
    [UI_EL_BORDER] = "bright-blue",
    [UI_EL_TITLE] = "bold cyan",
    [UI_EL_USER] = "bold green",
    [UI_EL_USER_TEXT] = "default",
    [UI_EL_ASSISTANT] = "bold cyan",
    [UI_EL_ASSISTANT_TEXT] = "default",
    [UI_EL_NOTICE] = "bright-black",
    [UI_EL_ERROR] = "bold red",
    [UI_EL_STOPPED] = "yellow",
    [UI_EL_SPINNER] = "bold magenta",
    [UI_EL_SLIDER] = "cyan",
    [UI_EL_SLIDER_TRACK] = "bright-black",
    [UI_EL_SLIDER_FOCUS] = "bold black on cyan",
    [UI_EL_GAUGE_LOW] = "green",
    [UI_EL_GAUGE_MID] = "yellow",
    [UI_EL_GAUGE_HIGH] = "red",
    [UI_EL_GAUGE_TRACK] = "bright-black",
    [UI_EL_STATS] = "default",
    [UI_EL_INPUT] = "default",
    [UI_EL_PROMPT] = "bold green",
    [UI_EL_HELP] = "white on black",
    [UI_EL_HELP_KEY] = "bold yellow on black",
    [UI_EL_HEAT_HIGH] = "green",
    [UI_EL_HEAT_MID] = "yellow",
    [UI_EL_HEAT_LOW] = "bold red",
};

void ui_theme_builtin_default(ui_theme *t)
{
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "default");
    t->gauge_mid_pct = 60;
    t->gauge_high_pct = 85;
    for (int i = 0; i < UI_EL_COUNT; i++) ui_theme_parse_style(builtin_default[i], &t->el[i], NULL, 0);
}

/* --- colours -------------------------------------------------------------------------- */

static const unsigned char basic_rgb[16][3] = {
    {0, 0, 0},       {205, 0, 0},     {0, 205, 0},     {205, 205, 0},   {0, 0, 238},     {205, 0, 205},
    {0, 205, 205},   {229, 229, 229}, {127, 127, 127}, {255, 0, 0},     {0, 255, 0},     {255, 255, 0},
    {92, 92, 255},   {255, 0, 255},   {0, 255, 255},   {255, 255, 255},
};

void ui_theme_xterm_rgb(int idx, int *r, int *g, int *b)
{
    static const int lvl[6] = {0, 95, 135, 175, 215, 255};
    if (idx < 0) idx = 0;
    if (idx > 255) idx = 255;
    if (idx < 16) {
        *r = basic_rgb[idx][0], *g = basic_rgb[idx][1], *b = basic_rgb[idx][2];
    } else if (idx < 232) {
        int i = idx - 16;
        *r = lvl[i / 36], *g = lvl[i / 6 % 6], *b = lvl[i % 6];
    } else {
        *r = *g = *b = 8 + 10 * (idx - 232);
    }
}

static long dist2(int r1, int g1, int b1, int r2, int g2, int b2)
{
    long dr = r1 - r2, dg = g1 - g2, db = b1 - b2;
    return dr * dr + dg * dg + db * db;
}

int ui_theme_rgb_to_xterm(int r, int g, int b)
{
    int best = 16;
    long bd = -1;
    for (int i = 16; i < 256; i++) {
        int R, G, B;
        ui_theme_xterm_rgb(i, &R, &G, &B);
        long d = dist2(r, g, b, R, G, B);
        if (bd < 0 || d < bd) bd = d, best = i;
    }
    return best;
}

int ui_theme_nearest_basic(int idx, int n_basic)
{
    if (idx < 0) return idx;
    if (idx < n_basic) return idx;
    if (idx < 16 && n_basic == 8) return idx - 8;
    int r, g, b;
    ui_theme_xterm_rgb(idx, &r, &g, &b);
    int best = 0;
    long bd = -1;
    for (int i = 0; i < n_basic; i++) {
        long d = dist2(r, g, b, basic_rgb[i][0], basic_rgb[i][1], basic_rgb[i][2]);
        if (bd < 0 || d < bd) bd = d, best = i;
    }
    return best;
}

static const char *const color_names[8] = {"black", "red", "green", "yellow", "blue", "magenta", "cyan", "white"};

/* One colour word → palette index, UI_COLOR_DEFAULT, or -2 if not a colour. */
static int parse_color(const char *w)
{
    if (!strcasecmp(w, "default") || !strcasecmp(w, "none")) return UI_COLOR_DEFAULT;
    if (!strcasecmp(w, "gray") || !strcasecmp(w, "grey")) return 8;
    for (int i = 0; i < 8; i++) {
        if (!strcasecmp(w, color_names[i])) return i;
        if (!strncasecmp(w, "bright-", 7) && !strcasecmp(w + 7, color_names[i])) return 8 + i;
        if (!strncasecmp(w, "bright", 6) && !strcasecmp(w + 6, color_names[i])) return 8 + i;
    }
    if (w[0] == '#' && strlen(w) == 7) {
        unsigned v = 0;
        for (int i = 1; i < 7; i++) {
            if (!isxdigit((unsigned char)w[i])) return -2;
            v = v * 16 + (unsigned)(isdigit((unsigned char)w[i]) ? w[i] - '0' : tolower((unsigned char)w[i]) - 'a' + 10);
        }
        return ui_theme_rgb_to_xterm(v >> 16 & 255, v >> 8 & 255, v & 255);
    }
    if (isdigit((unsigned char)w[0])) {
        char *end;
        long v = strtol(w, &end, 10);
        if (*end == 0 && v >= 0 && v <= 255) return (int)v;
    }
    return -2;
}

static void set_why(char *why, size_t cap, const char *fmt, ...)
{
    if (!why || !cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, cap, fmt, ap);
    va_end(ap);
}

int ui_theme_parse_style(const char *spec, ui_style *st, char *why, size_t why_cap)
{
    ui_style s = {UI_COLOR_DEFAULT, UI_COLOR_DEFAULT, 0};
    char buf[256];
    if (strlen(spec) >= sizeof buf) {
        set_why(why, why_cap, "value too long");
        return -1;
    }
    snprintf(buf, sizeof buf, "%s", spec);
    int n_fg = 0, want_bg = 0, n_bg = 0;
    for (char *save = NULL, *w = strtok_r(buf, " \t", &save); w; w = strtok_r(NULL, " \t", &save)) {
        if (!strcasecmp(w, "bold")) s.attrs |= UI_ATTR_BOLD;
        else if (!strcasecmp(w, "dim")) s.attrs |= UI_ATTR_DIM;
        else if (!strcasecmp(w, "reverse")) s.attrs |= UI_ATTR_REVERSE;
        else if (!strcasecmp(w, "underline")) s.attrs |= UI_ATTR_UNDERLINE;
        else if (!strcasecmp(w, "italic")) s.attrs |= UI_ATTR_ITALIC;
        else if (!strcasecmp(w, "on")) {
            if (want_bg) {
                set_why(why, why_cap, "'on' twice");
                return -1;
            }
            want_bg = 1;
        } else {
            int c = parse_color(w);
            if (c == -2) {
                set_why(why, why_cap, "unknown colour or attribute '%s'", w);
                return -1;
            }
            if (want_bg) {
                if (n_bg++) {
                    set_why(why, why_cap, "two background colours");
                    return -1;
                }
                s.bg = (int16_t)c;
            } else {
                if (n_fg++) {
                    set_why(why, why_cap, "two colours without 'on' between them");
                    return -1;
                }
                s.fg = (int16_t)c;
            }
        }
    }
    if (want_bg && !n_bg) {
        set_why(why, why_cap, "'on' without a background colour");
        return -1;
    }
    *st = s;
    return 0;
}

/* --- files ---------------------------------------------------------------------------- */

typedef struct load_ctx {
    ui_theme *t;
    const char *path;
    FILE *f;
    int line;
    int expect_pair, got_pair; /* the line read last is a name = value line / was handled */
    ui_theme_warn_fn warn;
    void *ud;
} load_ctx;

static void warnf(load_ctx *c, const char *fmt, ...)
{
    if (!c->warn) return;
    char msg[600];
    int n = snprintf(msg, sizeof msg, "%s:%d: ", c->path, c->line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
    va_end(ap);
    c->warn(c->ud, msg);
}

/* inih reads through this, so the handler knows the line number and lines inih rejects
 * (no '=', no ']') are reported too. */
static char *reader(char *str, int num, void *stream)
{
    load_ctx *c = stream;
    if (c->expect_pair && !c->got_pair) warnf(c, "expected 'name = value', '[section]' or a comment; line ignored");
    c->expect_pair = c->got_pair = 0;
    if (!fgets(str, num, c->f)) return NULL;
    c->line++;
    const char *p = str;
    if (c->line == 1 && (unsigned char)p[0] == 0xEF && (unsigned char)p[1] == 0xBB && (unsigned char)p[2] == 0xBF) p += 3;
    while (*p == ' ' || *p == '\t') p++;
    if (*p == 0 || *p == '\n' || *p == '\r' || *p == ';' || *p == '#') return str;
    if (*p == '[') {
        if (!strchr(p, ']')) warnf(c, "section header without ']'; line ignored");
        return str;
    }
    c->expect_pair = 1;
    return str;
}

static int parse_pct(const char *v, int *out)
{
    char *end;
    long x = strtol(v, &end, 10);
    while (*end == ' ' || *end == '%') end++;
    if (end == v || *end || x < 0 || x > 100) return -1;
    *out = (int)x;
    return 0;
}

static int handler(void *user, const char *section, const char *name, const char *value)
{
    load_ctx *c = user;
    c->got_pair = 1;
    ui_theme *t = c->t;
    if (!strcasecmp(section, "theme")) {
        if (!strcasecmp(name, "border")) {
            if (!strcasecmp(value, "unicode")) t->border_ascii = 0;
            else if (!strcasecmp(value, "ascii")) t->border_ascii = 1;
            else warnf(c, "border must be unicode or ascii, not '%s'; using unicode", value);
        } else if (!strcasecmp(name, "gauge_mid") || !strcasecmp(name, "gauge_high")) {
            int *dst = !strcasecmp(name, "gauge_mid") ? &t->gauge_mid_pct : &t->gauge_high_pct;
            int v;
            if (parse_pct(value, &v)) warnf(c, "%s must be a percentage 0-100, not '%s'; using %d", name, value, *dst);
            else *dst = v;
        } else if (!strcasecmp(name, "name")) {
            snprintf(t->name, sizeof t->name, "%s", value);
        } else {
            warnf(c, "unknown key '%s' in [theme] (border, gauge_mid, gauge_high, name)", name);
        }
        return 1;
    }
    if (!strcasecmp(section, "colors") || !strcasecmp(section, "colours")) {
        for (int i = 0; i < UI_EL_COUNT; i++) {
            if (strcasecmp(name, elem_names[i])) continue;
            char why[200];
            if (ui_theme_parse_style(value, &t->el[i], why, sizeof why))
                warnf(c, "%s: %s; using the default for '%s'", name, why, name);
            return 1;
        }
        warnf(c, "unknown element '%s' in [colors]", name);
        return 1;
    }
    warnf(c, "unknown section '[%s]' (theme, colors)", section);
    return 1;
}

int ui_theme_load_file(const char *path, ui_theme *t, ui_theme_warn_fn warn, void *ud, char *why, size_t why_cap)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        set_why(why, why_cap, "%s: %s", path, strerror(errno));
        return -1;
    }
    ui_theme_builtin_default(t);
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    snprintf(t->name, sizeof t->name, "%.*s", (int)(strcspn(base, ".") ? strcspn(base, ".") : strlen(base)), base);
    snprintf(t->path, sizeof t->path, "%s", path);
    load_ctx c = {.t = t, .path = path, .f = f, .warn = warn, .ud = ud};
    /* A line starting with whitespace is not the continuation of the previous value here. */
    bool old_multiline = ini_allow_multiline;
    ini_allow_multiline = false;
    ini_parse_stream(reader, &c, handler, &c);
    ini_allow_multiline = old_multiline;
    if (c.expect_pair && !c.got_pair) warnf(&c, "expected 'name = value', '[section]' or a comment; line ignored");
    if (t->gauge_high_pct < t->gauge_mid_pct) {
        c.line = 0;
        if (warn) {
            char msg[600];
            snprintf(msg, sizeof msg, "%s: gauge_high (%d) is below gauge_mid (%d); using 60 and 85", path,
                     t->gauge_high_pct, t->gauge_mid_pct);
            warn(ud, msg);
        }
        t->gauge_mid_pct = 60;
        t->gauge_high_pct = 85;
    }
    fclose(f);
    return 0;
}

/* Directory of the running binary (for themes/ next to it), or "" if unknown. */
static void exe_dir(char *out, size_t cap)
{
    char p[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", p, sizeof p - 1);
    out[0] = 0;
    if (n <= 0) return;
    p[n] = 0;
    char *s = strrchr(p, '/');
    if (!s) return;
    *s = 0;
    snprintf(out, cap, "%s", p);
}

int ui_theme_dirs(char (*dirs)[512], int max)
{
    int n = 0;
    const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
    if (n < max && xdg && *xdg == '/') snprintf(dirs[n++], 512, "%s/kvchat/themes", xdg);
    else if (n < max && home && *home) snprintf(dirs[n++], 512, "%s/.config/kvchat/themes", home);
    if (n < max) snprintf(dirs[n++], 512, "%s/themes", KVCHAT_DATADIR);
    char ed[PATH_MAX];
    exe_dir(ed, sizeof ed);
    if (n < max && *ed) snprintf(dirs[n++], 512, "%.500s/themes", ed);
    return n;
}

static int valid_name(const char *name)
{
    if (!*name || strlen(name) > 60) return 0;
    for (const char *p = name; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '-' && *p != '_' && *p != '.') return 0;
    return name[0] != '.';
}

int ui_theme_load(const char *name, ui_theme *t, ui_theme_warn_fn warn, void *ud, char *why, size_t why_cap)
{
    if (strchr(name, '/')) return ui_theme_load_file(name, t, warn, ud, why, why_cap);
    if (!valid_name(name)) {
        set_why(why, why_cap, "'%s' is not a theme name (letters, digits, '-', '_')", name);
        return -1;
    }
    char dirs[4][512];
    int nd = ui_theme_dirs(dirs, 4);
    for (int i = 0; i < nd; i++) {
        char path[600];
        snprintf(path, sizeof path, "%.500s/%.60s.theme", dirs[i], name);
        if (access(path, R_OK) == 0) return ui_theme_load_file(path, t, warn, ud, why, why_cap);
    }
    if (!strcmp(name, "default") || !strcmp(name, "mono")) {
        ui_theme_builtin_default(t);
        if (!strcmp(name, "mono")) {
            snprintf(t->name, sizeof t->name, "mono");
            for (int i = 0; i < UI_EL_COUNT; i++) t->el[i].fg = t->el[i].bg = UI_COLOR_DEFAULT;
        }
        return 0;
    }
    char names[1024];
    ui_theme_list(names, sizeof names);
    set_why(why, why_cap, "no theme '%s' (available: %s)", name, names);
    return -1;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int ui_theme_names(char **names, int max)
{
    int n = 0;
    const char *builtin[2] = {"default", "mono"};
    for (int i = 0; i < 2 && n < max; i++) names[n++] = strdup(builtin[i]);
    char dirs[4][512];
    int nd = ui_theme_dirs(dirs, 4);
    for (int i = 0; i < nd; i++) {
        DIR *d = opendir(dirs[i]);
        if (!d) continue;
        struct dirent *de;
        while ((de = readdir(d)) && n < max) {
            size_t l = strlen(de->d_name);
            if (l <= 6 || strcmp(de->d_name + l - 6, ".theme")) continue;
            char nm[256];
            snprintf(nm, sizeof nm, "%.*s", (int)(l - 6), de->d_name);
            if (!valid_name(nm)) continue;
            int dup = 0;
            for (int k = 0; k < n; k++) dup |= names[k] && !strcmp(names[k], nm);
            if (!dup) names[n++] = strdup(nm);
        }
        closedir(d);
    }
    int m = 0;
    for (int i = 0; i < n; i++)
        if (names[i]) names[m++] = names[i];
    qsort(names, (size_t)m, sizeof *names, cmp_str);
    return m;
}

int ui_theme_list(char *buf, size_t cap)
{
    char *names[128];
    int n = ui_theme_names(names, 128);
    size_t o = 0;
    if (cap) buf[0] = 0;
    for (int i = 0; i < n; i++) {
        if (cap > o) o += (size_t)snprintf(buf + o, cap - o, "%s%s", i ? ", " : "", names[i]);
        free(names[i]);
    }
    return n;
}
