/* text: UTF-8 decoding, terminal display width, safe display text and word wrapping by cells (no curses). */
#ifndef UI_TEXT_H
#define UI_TEXT_H

#include <stddef.h>
#include <stdint.h>

/* Widths follow the C library's wcwidth() for the current LC_CTYPE (the same table ncursesw
 * uses to place the cursor), so the caller must have set a UTF-8 locale. */

/* Decode one character from s[0..len) (len > 0). Returns the bytes consumed (1..4) and sets
 * *cp; an invalid, overlong, surrogate or truncated sequence consumes one byte and gives
 * U+FFFD, so every byte string decodes and the loop always advances. */
size_t ui_utf8_decode(const char *s, size_t len, uint32_t *cp);

/* Encode cp as UTF-8 into out (4 bytes); returns the length (1..4). Invalid cp → U+FFFD. */
size_t ui_utf8_encode(uint32_t cp, char *out);

/* Cells a code point takes once made safe by ui_sanitize: 0 for combining marks and other
 * zero-width characters, 2 for wide (CJK, most emoji), 1 otherwise — including characters
 * the terminal cannot print, which ui_sanitize replaces by a one-cell picture. '\n' is 0. */
int ui_cp_width(uint32_t cp);

/* Cells text s[0..len) takes on one line (newlines count 0). */
int ui_text_width(const char *s, size_t len);

/* The one rule for control characters in every text kvchat writes — the chat screen, one-shot
 * stdout, Markdown export, listings: the code point to show for cp. C0 controls other than TAB
 * and LF → their Unicode control pictures (U+2400 + cp: ␛ for ESC, ␍ for CR, ␀ for NUL),
 * DEL → ␡ (U+2421), C1 controls U+0080..U+009F (U+009B is the 8-bit CSI) → U+FFFD; any other
 * cp is itself. So no output of kvchat carries an escape sequence. */
uint32_t ui_control_picture(uint32_t cp);

/* Text made safe for a terminal or a pipe with ui_control_picture: invalid UTF-8 → U+FFFD (a
 * lone 0x9B byte is no CSI either), a CR directly before LF dropped (a Windows line end), TAB
 * and LF kept. Writes to out (cap bytes) and returns the bytes the whole result needs (at most
 * 3 * len); writes nothing past cap. */
size_t ui_neutralize(const char *s, size_t len, char *out, size_t cap);

/* ui_neutralize for the screen, which also lays text out: '\t' → four spaces, and code points
 * wcwidth() calls unprintable → U+FFFD. */
size_t ui_sanitize(const char *s, size_t len, char *out, size_t cap);

/* One wrapped line: bytes [start, end) of the text, shown from column 0. */
typedef struct ui_line {
    uint32_t start, end;
} ui_line;

enum ui_wrap_mode {
    UI_WRAP_WORD = 0, /* break after spaces (which are not shown at the line end) and
                         between wide characters; a word longer than the line is cut */
    UI_WRAP_CHAR = 1, /* break at the last cell that fits (input editing: every byte of the
                         text belongs to exactly one line, so a cursor offset maps to a cell) */
};

/* A growable array of lines. */
typedef struct ui_lines {
    ui_line *v;
    size_t n, cap;
} ui_lines;

/* Wrap s[from..len) into lines at most `width` cells wide (width < 1 is taken as 1) and
 * append them to *out. `from` must be 0 or the start of a line a previous call produced on
 * the same text and width (so a growing text re-wraps only its last line). A character
 * never splits (a wide character that cannot fit a 1-cell line gets a line of its own);
 * combining marks stay with their base; '\n' ends a line, and text ending in '\n' ends with
 * an empty line. The empty text is one empty line. Returns 0, or -1 when out of memory. */
int ui_wrap(const char *s, size_t len, size_t from, int width, int mode, ui_lines *out);

void ui_lines_free(ui_lines *l);

#endif
