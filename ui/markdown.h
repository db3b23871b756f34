/* markdown: a reply's Markdown (CommonMark + GitHub tables, parsed by md4c) as display text with a style per byte — headings, emphasis, code, lists, quotes, links, tables, numbered code blocks. */
#ifndef UI_MARKDOWN_H
#define UI_MARKDOWN_H

#include <stddef.h>

enum ui_md_style {
    UI_MD_PLAIN = 0,
    UI_MD_BOLD = 1,       /* flags, combined */
    UI_MD_ITALIC = 2,
    UI_MD_CODE = 4,       /* `code` spans and code block lines: exact text */
    UI_MD_HEADING = 8,
    UI_MD_QUOTE = 16,     /* the "│ " of a block quote */
    UI_MD_LINK = 32,
    UI_MD_LABEL = 64,     /* a code block's label line ("code 2 · python") and its rules */
    UI_MD_STRIKE = 128,
};

typedef struct ui_md {
    char *text;           /* the text to show (UTF-8; malloc'd) */
    unsigned char *style; /* one enum ui_md_style set per byte of text */
    size_t len, cap;
    int n_code;           /* code blocks in it */
} ui_md;

/* Render src[0..len) (a reply so far: an unfinished construct renders as far as it goes) into
 * *out (reset first; text and style reused). Code blocks are numbered from code_base + 1 in
 * their label lines. Markers are dropped (**, `, #), list items get "• " or "N. ", quotes
 * "│ ", links "text <url>", table cells " │ " between them; code block lines are kept byte
 * for byte. Returns 0, or -1 (out of memory, or md4c failed: *out then holds src as plain). */
int ui_md_render(const char *src, size_t len, int code_base, ui_md *out);
void ui_md_free(ui_md *m);

/* The code blocks of src[0..len) as ui_md_render numbers them: returns their count (-1: md4c
 * failed), and for 1 <= want <= count block want's exact text in *out (malloc'd, the caller
 * frees; its final newline dropped) and *out_len. */
int ui_md_code_block(const char *src, size_t len, int want, char **out, size_t *out_len);

#endif
