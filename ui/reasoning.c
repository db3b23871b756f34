/* reasoning: where a reply's reasoning block is (<think>…</think> and the other markers reasoning models write) — for showing it folded and for leaving it out of the next prompt. */
#include "reasoning.h"

#include <string.h>

static const struct {
    const char *open, *close;
} markers[] = {
    {"<think>", "</think>"},
    {"[THINK]", "[/THINK]"},
    {"<|begin_of_thought|>", "<|end_of_thought|>"},
};
#define N_MARKERS (sizeof markers / sizeof markers[0])

static int is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

/* The first occurrence of needle in s[from..n), or n. */
static size_t find(const char *s, size_t n, size_t from, const char *needle)
{
    size_t k = strlen(needle);
    for (size_t i = from; i + k <= n; i++)
        if (s[i] == needle[0] && !memcmp(s + i, needle, k)) return i;
    return n;
}

int ui_reasoning_split(const char *s, size_t n, ui_reasoning *r)
{
    memset(r, 0, sizeof *r);
    size_t i = 0;
    while (i < n && is_space(s[i])) i++;
    for (size_t m = 0; m < N_MARKERS; m++) {
        size_t ol = strlen(markers[m].open);
        if (n - i < ol || memcmp(s + i, markers[m].open, ol)) continue;
        r->found = 1;
        r->body = i + ol;
        while (r->body < n && (s[r->body] == '\n' || s[r->body] == '\r')) r->body++;
        size_t c = find(s, n, i + ol, markers[m].close);
        if (c == n) { /* still thinking */
            r->body_end = r->answer = n;
            return 1;
        }
        r->closed = 1;
        r->body_end = c;
        while (r->body_end > r->body && is_space(s[r->body_end - 1])) r->body_end--;
        r->answer = c + strlen(markers[m].close);
        while (r->answer < n && is_space(s[r->answer])) r->answer++;
        return 1;
    }
    return 0;
}

const char *ui_reasoning_open_at_end(const char *prompt, size_t n)
{
    while (n && is_space(prompt[n - 1])) n--;
    for (size_t m = 0; m < N_MARKERS; m++) {
        size_t ol = strlen(markers[m].open);
        if (n >= ol && !memcmp(prompt + n - ol, markers[m].open, ol)) return markers[m].open;
    }
    return NULL;
}
