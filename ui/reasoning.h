/* reasoning: where a reply's reasoning block is (<think>…</think> and the other markers reasoning models write) — for showing it folded and for leaving it out of the next prompt. */
#ifndef UI_REASONING_H
#define UI_REASONING_H

#include <stddef.h>

/*
 * Reasoning models (Qwen3, DeepSeek-R1, SmolLM3, Phi-4-reasoning, Magistral …) start a reply with
 * their reasoning between markers, then the answer. Markers (open, close), tried in order:
 *   <think> </think>    Qwen3, DeepSeek-R1 and its distills, SmolLM3, Granite, Phi-4-reasoning
 *   [THINK] [/THINK]    Mistral's Magistral
 *   <|begin_of_thought|> <|end_of_thought|>   Sky-T1 / OpenThinker style
 * Only a block at the start of the reply counts (after whitespace): a marker later in the text
 * is text the model writes about markers.
 */
typedef struct ui_reasoning {
    int found;          /* the reply starts with an open marker */
    int closed;         /* ... and its close marker has come */
    size_t body, body_end; /* the reasoning text: [body, body_end) (to the end while open) */
    size_t answer;      /* where the answer starts (after the close marker and the newlines after
                           it); the whole text's length while open; 0 when not found */
} ui_reasoning;

/* Find the reasoning block of reply text s[0..n). Returns r->found. Pure; byte offsets. */
int ui_reasoning_split(const char *s, size_t n, ui_reasoning *r);

/* The open marker a rendered prompt ends with (after whitespace) — a template that opens the
 * reasoning block itself (DeepSeek-R1: "<｜Assistant｜><think>\n"), so the reply starts inside
 * it — or NULL. */
const char *ui_reasoning_open_at_end(const char *prompt, size_t n);

#endif
