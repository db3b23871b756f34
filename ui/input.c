/* input: the message editor — GNU readline driven through its callback interface, drawn into the input rows, with persistent history and slash-command completion. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <readline/history.h>
#include <readline/readline.h>

#include "ui_internal.h"

#define HISTORY_KEEP 1000 /* entries kept in the history file */

/* Readline is one global state machine, so its bridge is too. */
static struct {
    ui *u;
    unsigned char q[64]; /* bytes readline reads next (one key) */
    int qn, qpos;
    char *restore;       /* a line the controller did not take, put back after readline resets */
    int feeding;         /* inside input_feed: readline resets the line after a submit */
    char *pending;       /* input_set's text while feeding: applied after the keys */
    const char *pending_prompt;
    const ui_command *commands;
    size_t n_commands;
    const char **names; /* the command names, NULL-terminated */
    char history_path[1024];
    FILE *null_out;
    char *themes[64];
    int n_themes;
} in;

static int in_getc(FILE *f)
{
    (void)f;
    if (in.qpos < in.qn) return in.q[in.qpos++];
    return 0; /* never reached in callback mode: readline reads one byte per call */
}

static int in_available(void) { return in.qpos < in.qn; }
static void in_redisplay(void) { if (in.u) ui_mark_dirty(in.u); }
static void prep_noop(int meta) { (void)meta; }
static void deprep_noop(void) {}

/* ---- history file: one entry per line, '\\' and '\n' escaped ------------------------- */

static void write_escaped(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\') fputs("\\\\", f);
        else if (*s == '\n') fputs("\\n", f);
        else fputc(*s, f);
    }
    fputc('\n', f);
}

static void unescape(char *s)
{
    char *o = s;
    for (char *p = s; *p; p++) {
        if (*p == '\\' && p[1] == 'n') *o++ = '\n', p++;
        else if (*p == '\\' && p[1] == '\\') *o++ = '\\', p++;
        else *o++ = *p;
    }
    *o = 0;
}

static int mkdirs(const char *path)
{
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0700) && errno != EEXIST) return -1;
        *p = '/';
    }
    return 0;
}

static void history_load(void)
{
    FILE *f = fopen(in.history_path, "r");
    if (!f) return;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int count = 0;
    while ((n = getline(&line, &cap, f)) > 0) {
        if (line[n - 1] == '\n') line[n - 1] = 0;
        unescape(line);
        if (*line) add_history(line), count++;
    }
    free(line);
    fclose(f);
    if (count > 2 * HISTORY_KEEP) { /* rewrite with the newest entries only */
        char tmp[1100];
        snprintf(tmp, sizeof tmp, "%s.tmp", in.history_path);
        FILE *o = fopen(tmp, "w");
        if (!o) return;
        for (int i = history_length - HISTORY_KEEP; i < history_length; i++) {
            HIST_ENTRY *h = history_get(history_base + i);
            if (h) write_escaped(o, h->line);
        }
        if (fclose(o) == 0) rename(tmp, in.history_path);
    }
}

static void history_append(const char *line)
{
    HIST_ENTRY *last = history_length ? history_get(history_base + history_length - 1) : NULL;
    if (last && !strcmp(last->line, line)) return;
    add_history(line);
    if (!in.history_path[0]) return;
    FILE *f = fopen(in.history_path, "a");
    if (!f) return;
    write_escaped(f, line);
    fclose(f);
}

/* ---- completion of /commands, /set names, /theme names --------------------------------- */

static const char *const *gen_list;

static char *gen_next(const char *text, int state)
{
    static int idx;
    static size_t len;
    if (!state) idx = 0, len = strlen(text);
    while (gen_list && gen_list[idx]) {
        const char *c = gen_list[idx++];
        if (!strncmp(c, text, len)) return strdup(c);
    }
    return NULL;
}

static char **complete(const char *text, int start, int end)
{
    (void)end;
    rl_attempted_completion_over = 1;
    if (rl_line_buffer[0] != '/') return NULL;
    if (start == 0) gen_list = (const char *const *)in.names;
    else {
        char first[32];
        size_t fl = strcspn(rl_line_buffer, " ");
        snprintf(first, sizeof first, "%.*s", (int)(fl < 31 ? fl : 31), rl_line_buffer);
        /* only the second word */
        const char *p = rl_line_buffer + fl;
        while (*p == ' ') p++;
        if ((size_t)(p - rl_line_buffer) != (size_t)start) return NULL;
        const ui_command *cmd = NULL;
        for (size_t i = 0; i < in.n_commands && !cmd; i++)
            if (!strcmp(first, in.commands[i].name)) cmd = &in.commands[i];
        if (!cmd) return NULL;
        if (cmd->themes) {
            for (int i = 0; i < in.n_themes; i++) free(in.themes[i]);
            in.n_themes = ui_theme_names(in.themes, 63);
            in.themes[in.n_themes] = NULL;
            gen_list = (const char *const *)in.themes;
        } else if (cmd->args) gen_list = cmd->args;
        else return NULL;
    }
    return rl_completion_matches(text, gen_next);
}

static void show_matches(char **matches, int num, int max_len)
{
    (void)max_len;
    char buf[200];
    size_t o = 0;
    for (int i = 1; i <= num && o < sizeof buf - 1; i++)
        o += (size_t)snprintf(buf + o, sizeof buf - o, "%s%s", i > 1 ? "  " : "", matches[i]);
    if (in.u) ui_flash(in.u, "%s", buf);
}

/* ---- line handler ------------------------------------------------------------------------ */

static void on_line(char *line)
{
    ui *u = in.u;
    if (!line) { /* Ctrl-D on an empty line */
        if (u && u->cb.quit) u->cb.quit(u->cb.ud);
        return;
    }
    if (u && u->editing) { /* the edited line is sent: the prompt goes back */
        u->editing = 0;
        rl_set_prompt("> ");
    }
    int taken = u && u->cb.submit ? u->cb.submit(u->cb.ud, line) : 1;
    if (taken) {
        if (*line) history_append(line);
        free(line);
    } else {
        free(in.restore);
        in.restore = line;
    }
    if (u) ui_mark_dirty(u);
}

int input_init(ui *u, const ui_config *cfg, char *why, size_t why_cap)
{
    in.u = u;
    in.commands = cfg->commands;
    in.n_commands = cfg->n_commands;
    free(in.names);
    in.names = calloc(cfg->n_commands + 1, sizeof *in.names);
    for (size_t i = 0; in.names && i < cfg->n_commands; i++) in.names[i] = cfg->commands[i].name;
    in.null_out = fopen("/dev/null", "w");
    if (!in.null_out) {
        snprintf(why, why_cap, "/dev/null: %s", strerror(errno));
        return -1;
    }
    rl_readline_name = "kvchat";
    rl_catch_signals = 0;
    rl_catch_sigwinch = 0;
    rl_change_environment = 0;
    rl_prep_term_function = prep_noop;
    rl_deprep_term_function = deprep_noop;
    rl_getc_function = in_getc;
    rl_input_available_hook = in_available;
    rl_redisplay_function = in_redisplay;
    rl_instream = stdin;
    rl_outstream = in.null_out;
    rl_attempted_completion_function = complete;
    rl_completion_display_matches_hook = show_matches;
    using_history();
    in.history_path[0] = 0;
    if (cfg->history_path && *cfg->history_path) {
        snprintf(in.history_path, sizeof in.history_path, "%s", cfg->history_path);
        mkdirs(in.history_path);
        history_load();
    }
    rl_callback_handler_install("> ", on_line);
    rl_variable_bind("bell-style", "none");
    rl_variable_bind("show-all-if-ambiguous", "on");
    rl_variable_bind("enable-bracketed-paste", "off");
    rl_variable_bind("horizontal-scroll-mode", "off");
    return 0;
}

void input_shutdown(void)
{
    rl_callback_handler_remove();
    clear_history();
    free(in.restore);
    in.restore = NULL;
    free(in.pending);
    in.pending = NULL;
    for (int i = 0; i < in.n_themes; i++) free(in.themes[i]);
    in.n_themes = 0;
    free(in.names);
    in.names = NULL;
    if (in.null_out) fclose(in.null_out);
    in.null_out = NULL;
    rl_outstream = NULL;
    in.u = NULL;
}

void input_after_keys(void)
{
    if (in.pending) { /* set by the controller while readline was handling the line */
        rl_set_prompt(in.pending_prompt ? in.pending_prompt : "> ");
        rl_replace_line(in.pending, 0);
        rl_point = rl_end;
        free(in.pending);
        in.pending = NULL;
        if (in.u) ui_mark_dirty(in.u);
    }
    if (!in.restore) return;
    rl_replace_line(in.restore, 0);
    rl_point = rl_end;
    free(in.restore);
    in.restore = NULL;
}

void input_feed(const char *bytes, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t k = n - i < sizeof in.q ? n - i : sizeof in.q;
        memcpy(in.q, bytes + i, k);
        in.qn = (int)k;
        in.qpos = 0;
        in.feeding = 1;
        while (in.qpos < in.qn) rl_callback_read_char();
        in.feeding = 0;
        i += k;
    }
    in.qn = in.qpos = 0;
    input_after_keys();
}

void input_insert(const char *text)
{
    rl_insert_text(text);
    if (in.u) ui_mark_dirty(in.u);
}

void input_command(int (*fn)(int, int))
{
    fn(1, 0);
    if (in.u) ui_mark_dirty(in.u);
}

int input_empty(void) { return rl_end == 0; }
const char *input_text(size_t *len)
{
    *len = rl_line_buffer ? (size_t)rl_end : 0;
    return rl_line_buffer ? rl_line_buffer : "";
}
int input_starts_with_slash(void) { return rl_end > 0 && rl_line_buffer[0] == '/'; }

int input_kill_draft(void)
{
    if (rl_end == 0) return 0;
    char *copy = strndup(rl_line_buffer, (size_t)rl_end);
    rl_kill_text(0, rl_end); /* into readline's kill ring: Ctrl-Y yanks it back */
    rl_point = rl_end = 0;
    if (copy) {
        history_append(copy); /* and the history (Up), kept across runs */
        free(copy);
    }
    if (in.u) ui_mark_dirty(in.u);
    return 1;
}

void input_clear(void)
{
    rl_replace_line("", 0);
    rl_point = rl_end = 0;
    if (in.u) ui_mark_dirty(in.u);
}

void input_set(const char *text, size_t len, const char *prompt)
{
    char *dup = strndup(text ? text : "", len);
    if (!dup) return;
    if (in.feeding) { /* readline empties the line when the handler returns: set it after */
        free(in.pending);
        in.pending = dup;
        in.pending_prompt = prompt;
        return;
    }
    rl_set_prompt(prompt ? prompt : "> ");
    rl_replace_line(dup, 0);
    rl_point = rl_end;
    free(dup);
    if (in.u) ui_mark_dirty(in.u);
}

void input_resize(int rows, int cols) { rl_set_screen_size(rows, cols); }

static const char *prompt_text(void) { return rl_display_prompt ? rl_display_prompt : "> "; }

/* Wrap the line buffer for a text area of w cells after the prompt (one cell kept free so
 * the cursor can sit after the last character). */
static int wrap_buffer(int w, ui_lines *l)
{
    int pw = ui_text_width(prompt_text(), strlen(prompt_text()));
    int tw = w - pw - 1;
    if (tw < 4) tw = 4;
    l->n = 0;
    ui_wrap(rl_line_buffer ? rl_line_buffer : "", (size_t)rl_end, 0, tw, UI_WRAP_CHAR, l);
    return pw;
}

int input_rows(int w, int max_h)
{
    ui_lines l = {0};
    wrap_buffer(w, &l);
    int n = (int)l.n;
    ui_lines_free(&l);
    if (n < 1) n = 1;
    return n > max_h ? max_h : n;
}

void input_draw(ui *u, int y, int x, int h, int w, int *cy, int *cx)
{
    ui_lines l = {0};
    int pw = wrap_buffer(w, &l);
    const char *buf = rl_line_buffer ? rl_line_buffer : "";
    /* the cursor's line: the last line whose start is <= rl_point */
    size_t cl = 0;
    for (size_t i = 0; i < l.n; i++)
        if (l.v[i].start <= (uint32_t)rl_point) cl = i;
    size_t first = cl + 1 > (size_t)h ? cl + 1 - (size_t)h : 0;
    if (pw > w - 4) pw = w - 4;
    ui_put(u, y, x, pw, prompt_text(), strlen(prompt_text()), u->attr[UI_EL_PROMPT]);
    if (first > 0) ui_puts(u, y, x, pw, ui_glyph(u, "↑", "^"), u->attr[UI_EL_PROMPT]);
    for (size_t i = first; i < l.n && (int)(i - first) < h; i++)
        ui_put(u, y + (int)(i - first), x + pw, w - pw, buf + l.v[i].start, l.v[i].end - l.v[i].start,
               u->attr[UI_EL_INPUT]);
    *cy = y + (int)(cl - first);
    size_t cs = l.n ? l.v[cl].start : 0;
    *cx = x + pw + ui_text_width(buf + cs, (size_t)rl_point - cs);
    if (*cx >= x + w) *cx = x + w - 1;
    ui_lines_free(&l);
}
