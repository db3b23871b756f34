/* ui: the full-screen chat (ncursesw) as the session controller sees it — screen, chat pane, input, controls, KV gauge, status and stats lines, help. */
#ifndef UI_UI_H
#define UI_UI_H

#include <stddef.h>

#include "engine/gen_stats.h" /* gen_stats: the engine's public timing type */
#include "engine/kv_cache.h" /* kv_cache_stats */
#include "theme.h"

/*
 * Runs on the UI thread only: every function here may call curses. The UI never calls the
 * model; the controller (app/chat.c) feeds it text and stats and gets user actions through
 * ui_callbacks. Layout (rows): status bar · chat pane (+ controls panel on the right, F2) ·
 * border · KV gauge · stats line · input (1 to H/4 rows). Below 40x10: "terminal too small".
 */

typedef struct ui ui;
typedef struct ui_msg ui_msg; /* a message shown in the chat pane */

enum ui_role {
    UI_ROLE_USER = 0,
    UI_ROLE_ASSISTANT,
    UI_ROLE_NOTICE, /* kvchat's own output (command results, tips); never sent to the model */
    UI_ROLE_ERROR,
};

enum ui_msg_state {
    UI_MSG_DONE = 0,
    UI_MSG_WAITING,   /* spinner: the request runs, no text yet */
    UI_MSG_STREAMING, /* text grows; a cursor follows it */
};

enum ui_slider_id {
    UI_SL_TEMP = 0,  /* temperature 0–2, step 0.05 */
    UI_SL_TOP_P,     /* 0–1, 0.01 */
    UI_SL_TOP_K,     /* 0–200, 1; 0 = off */
    UI_SL_MIN_P,     /* 0–1, 0.01; 0 = off */
    UI_SL_REPEAT,    /* repeat penalty 1–2, 0.05; 1 = off */
    UI_SL_MAX_TOKENS,/* 0–n_ctx, 16; 0 = unlimited */
    UI_SL_COUNT
};

typedef struct ui_callbacks {
    /* Enter on the input: a message or a /command (UTF-8, may hold '\n'). Return 1 if taken;
     * 0 keeps the text in the input (e.g. a reply is still streaming). */
    int (*submit)(void *ud, const char *line);
    void (*quit)(void *ud);                         /* Ctrl-D on an empty input, Ctrl-C twice */
    void (*stop)(void *ud);                         /* Esc / Ctrl-C while busy */
    void (*slider)(void *ud, int id, double value); /* a slider moved (already snapped and clamped) */
    void *ud;
    /* The sessions view (F3): action UI_SESS_SHOW (F3 pressed: answer with ui_sessions_show),
     * _SEARCH (text: the query so far), _OPEN / _DELETE (id), _RENAME (id, text: the new
     * title), _NEW (start a new conversation). NULL: F3 does nothing. */
    void (*sessions)(void *ud, int action, long long id, const char *text);
    /* Up on an empty input (input focused, no reply streaming; dir -1), and Up / Down (-1 / +1)
     * while the input still holds unchanged what ui_input_edit put there: return 1 if the
     * controller took it (e.g. put an earlier or later message in the input with
     * ui_input_edit, or ended the edit with ui_input_edit_end), 0 for the history. NULL: always
     * the history. */
    int (*edit_step)(void *ud, int dir);
    /* The input left ui_input_edit's mode without being sent (Esc / Ctrl-C cleared it). */
    void (*edit_cancel)(void *ud);
} ui_callbacks;

/* What the status bar shows. Strings are copied. */
typedef struct ui_info {
    const char *model_name;
    const char *arch;
    const char *weight_type;
    const char *params; /* "30.5B, 3.3B active" (mixture of experts), or NULL: not shown */
    const char *mode; /* "completion" or the chat template's name */
    int n_ctx;
    int n_threads;
    const char *remote; /* the server's URL when the replies come from one (NULL: the local engine):
                           the status bar names it and the KV gauge shows the server's token counts */
} ui_info;

/* A slash command as Tab completes it: its name ("/set") and the words its first argument
 * completes to (NULL-terminated; NULL: none), or the theme names (themes = 1). */
typedef struct ui_command {
    const char *name;
    const char *const *args;
    int themes;
} ui_command;

/* A slider of the controls panel: its range and how its value reads (the controller fills these
 * from its settings table). */
typedef struct ui_slider_spec {
    const char *label;
    double min, max, step;
    int decimals;          /* 0: whole numbers */
    double off_value;      /* the value shown as off_label ("off", "greedy", "∞"), if off_label */
    const char *off_label;
    int log;               /* logarithmic steps from min to max, then off_value at the right end */
} ui_slider_spec;

typedef struct ui_config {
    const char *history_path;      /* readline history file; NULL: none */
    int mouse;                     /* 1: wheel scrolls the pane */
    const ui_command *commands;    /* slash commands for Tab completion (n_commands of them; strings
                                      must outlive the ui) */
    size_t n_commands;
    const ui_slider_spec *sliders; /* UI_SL_COUNT specs (strings outlive the ui); NULL: built-in */
    int n_ctx;                     /* max-tokens slider range */
    const char *help_text;         /* the help overlay (lines; "KEY\tdescription" aligns) */
} ui_config;

/* Start curses on the terminal (UTF-8 locale required: the caller sets it), readline in
 * callback mode with history loaded, bracketed paste and (if asked) the mouse wheel.
 * Returns NULL with why filled if the terminal cannot be used. */
ui *ui_open(const ui_config *cfg, const ui_callbacks *cb, const ui_theme *theme, char *why, size_t why_cap);

/* Restore the terminal (endwin, paste/mouse modes off), free everything. NULL is a no-op. */
void ui_close(ui *u);

/* Best-effort terminal restore from a fatal signal handler: leaves curses and the modes the
 * UI turned on. Safe to call more than once. */
void ui_emergency_restore(void);

/* Descriptor to poll() for keys (standard input). */
int ui_input_fd(const ui *u);

/* Read every key waiting (non-blocking) and act on it; call after poll() wakes up, and on
 * any other wake-up too (a resize arrives through here). */
void ui_handle_input(ui *u);

/* Milliseconds until ui_render needs to run again (spinner, a throttled frame, a message
 * that expires); -1 when nothing is scheduled. */
int ui_timeout_ms(ui *u);

/* Draw what changed. Keystrokes draw at once; streamed text at most ~60 frames a second. */
void ui_render(ui *u);

/* Switch theme (colours are re-initialised; NO_COLOR or a colourless terminal stays mono). */
void ui_set_theme(ui *u, const ui_theme *t);
/* 1 if colours are off (NO_COLOR set, or the terminal has none). */
int ui_mono(const ui *u);
void ui_set_info(ui *u, const ui_info *info);

/* Chat pane. Text is sanitized for display (control bytes never reach the terminal). */
ui_msg *ui_msg_add(ui *u, int role, const char *label, const char *text, size_t len);
void ui_msg_append(ui *u, ui_msg *m, const char *text, size_t len);
void ui_msg_set_state(ui *u, ui_msg *m, int state);
/* A marker line under the message ("[stopped]"); NULL or "" removes it. error: error style. */
void ui_msg_set_note(ui *u, ui_msg *m, const char *note, int error);
/* Replace the label shown above a message ("you", the model's name; e.g. with "· branch 2/3"). */
void ui_msg_set_label(ui *u, ui_msg *m, const char *label);
void ui_msg_remove(ui *u, ui_msg *m);
/* Reasoning blocks of replies (<think>…</think>, ui/reasoning.h) are shown dimmed on one line;
 * this shows them whole, or folds them again (F4). */
void ui_toggle_reasoning(ui *u);
/* Show replies (the model's messages) as rendered Markdown — headings, emphasis, lists, quotes,
 * links, tables, numbered code blocks (ui/markdown.c) — or as their text (on = 0). Applies to the
 * messages shown and those added later; what the user typed is always shown as typed. */
void ui_set_markdown(ui *u, int on);
/* The probability heat-map of a reply: raw[0..raw_len) is the text as it was appended (before
 * sanitizing), and raw[start[i], end[i]) came from a token of probability p[i] (in [0, 1]; spans
 * ascending, not overlapping). Copied, mapped to the shown text; n = 0 clears it. While the
 * heat-map is on (ui_set_heat) those bytes are drawn in the theme's heat_high (p >= 0.8),
 * heat_mid (p >= 0.3) or heat_low colour, on the text as it is (wrapped as the pane is, a
 * Markdown reply shown unrendered). */
void ui_msg_set_heat(ui *u, ui_msg *m, const char *raw, size_t raw_len, const uint32_t *start, const uint32_t *end,
                     const float *p, size_t n);
/* Heat-map on / off (F6); returns how many messages have one. */
size_t ui_set_heat(ui *u, int on);
int ui_heat_on(const ui *u);
#define UI_HEAT_HIGH 0.8f
#define UI_HEAT_MID 0.3f
void ui_pane_clear(ui *u);
size_t ui_pane_count(const ui *u);
/* Printf-style notice / error message in the pane. */
void ui_notice(ui *u, int role, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

enum ui_phase { UI_PHASE_IDLE = 0, UI_PHASE_PREFILL, UI_PHASE_DECODE };

/* Stats line: live figures while a request runs (phase PREFILL / DECODE), final ones after
 * (phase IDLE, finish_name e.g. "end of text"). st NULL: nothing measured yet. */
void ui_set_stats(ui *u, const gen_stats *st, int phase, const char *finish_name);
/* Prefill progress of the running request: done of total prompt tokens in the KV cache (the
 * stats line shows "prefill 123 / 469" while the phase is PREFILL). */
void ui_set_prefill(ui *u, int done, int total);
/* KV gauge from the engine's real figures. */
void ui_set_kv(ui *u, const kv_cache_stats *kv);
/* Programmatic slider value (e.g. after /set); no callback. */
void ui_set_slider(ui *u, int id, double value);
/* A request runs: Esc/Ctrl-C stop it, the status bar says so. */
void ui_set_busy(ui *u, int busy);
/* Replace the input's text with text[0..len) (cursor at the end) and show prompt instead of
 * "> " (e.g. "edit> ", a string that outlives the edit; NULL keeps "> ") until the line is sent or cleared: Esc / Ctrl-C then
 * empty it and call cb.edit_cancel. */
void ui_input_edit(ui *u, const char *text, size_t len, const char *prompt);
/* Leave that mode: the input is emptied and the prompt is "> " again (no edit_cancel call). */
void ui_input_edit_end(ui *u);
void ui_show_help(ui *u, int on);
/* Put text[0..len) on the terminal's clipboard with the OSC 52 escape (xterm's selection data;
 * works over SSH, and in tmux with set-clipboard on). Returns 0, or -1 with why filled: a terminal
 * known to have no such escape (TERM=linux, dumb, vt100 …), out of memory. */
int ui_clipboard_set(ui *u, const char *text, size_t len, char *why, size_t why_cap);
/* A one-line message in the status bar for a few seconds. */
void ui_flash(ui *u, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- sessions view (F3, /sessions): a list the controller fills; keys Enter open, / search,
 * r rename, d delete (asks y/n), n new, Esc close ---- */
enum ui_sessions_action { UI_SESS_SHOW = 0, UI_SESS_SEARCH, UI_SESS_OPEN, UI_SESS_RENAME, UI_SESS_DELETE, UI_SESS_NEW };

typedef struct ui_session_row {
    long long id;
    const char *title, *model, *date; /* copied */
    int n_messages, n_branches;
    int current;                      /* the conversation on screen */
    const char *snippet;              /* copied; a search's matching text, the matched words between
                                         UI_HL_ON and UI_HL_OFF bytes (shown highlighted); NULL: none */
} ui_session_row;
#define UI_HL_ON '\x02'
#define UI_HL_OFF '\x03'

/* Show the view with these rows (or refresh it: the selection stays on the same id); status is
 * a line above the list ("" for the default hint). */
void ui_sessions_show(ui *u, const ui_session_row *rows, size_t n, const char *status);
void ui_sessions_hide(ui *u);
int ui_sessions_visible(const ui *u);

#endif
