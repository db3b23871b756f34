/* chat_template: recognises a model's chat-template family and renders a conversation as prompt text. */
#ifndef CHAT_TEMPLATE_H
#define CHAT_TEMPLATE_H

#include <stddef.h>

#include "kv_error.h"

/*
 * kvchat does not run Jinja. Like llama.cpp's built-in templates it recognises the family
 * of a `tokenizer.chat_template` text by distinctive substrings (or takes a family name
 * from the user, `--chat-template NAME`) and renders the conversation with hand-written
 * rules for that family. Every family reproduces llama.cpp's built-in rendering byte for
 * byte (oracle: ../shared/golden/chat-templates.json); the model card each format comes
 * from is named next to its row in chat_template.c.
 *
 * Renderings never contain the tokenizer's own leading BOS: the tokenizer adds it as the
 * model's metadata asks. BOS/EOS *text* that belongs inside the conversation ("</s>" after
 * an assistant turn, monarch's "<s>" between messages, gigachat's leading "<s>") is part
 * of the rendering and must be tokenized with special tokens recognised.
 */

/* One message. role: "system" | "user" | "assistant"; content: UTF-8 text (NULL = ""). */
typedef struct chat_msg {
    const char *role;
    const char *content;
} chat_msg;

/* Template families; the value is what the rest of kvchat stores and passes around. */
enum chat_tmpl {
    CHAT_TMPL_NONE = 0,          /* no template: completion mode, the text goes in as typed */
    CHAT_TMPL_CHATML,            /* chatml */
    CHAT_TMPL_LLAMA2,            /* llama2 */
    CHAT_TMPL_LLAMA2_SYS,        /* llama2-sys */
    CHAT_TMPL_LLAMA2_SYS_BOS,    /* llama2-sys-bos */
    CHAT_TMPL_LLAMA2_SYS_STRIP,  /* llama2-sys-strip */
    CHAT_TMPL_MISTRAL_V1,        /* mistral-v1 */
    CHAT_TMPL_MISTRAL_V3,        /* mistral-v3 */
    CHAT_TMPL_MISTRAL_V3_TEKKEN, /* mistral-v3-tekken */
    CHAT_TMPL_MISTRAL_V7,        /* mistral-v7 */
    CHAT_TMPL_PHI3,              /* phi3 */
    CHAT_TMPL_PHI4,              /* phi4 */
    CHAT_TMPL_FALCON3,           /* falcon3 */
    CHAT_TMPL_ZEPHYR,            /* zephyr */
    CHAT_TMPL_MONARCH,           /* monarch */
    CHAT_TMPL_GEMMA,             /* gemma */
    CHAT_TMPL_ORION,             /* orion */
    CHAT_TMPL_OPENCHAT,          /* openchat */
    CHAT_TMPL_VICUNA,            /* vicuna */
    CHAT_TMPL_VICUNA_ORCA,       /* vicuna-orca */
    CHAT_TMPL_DEEPSEEK,          /* deepseek */
    CHAT_TMPL_DEEPSEEK2,         /* deepseek2 */
    CHAT_TMPL_DEEPSEEK3,         /* deepseek3 */
    CHAT_TMPL_COMMAND_R,         /* command-r */
    CHAT_TMPL_LLAMA3,            /* llama3 */
    CHAT_TMPL_CHATGLM3,          /* chatglm3 */
    CHAT_TMPL_CHATGLM4,          /* chatglm4 */
    CHAT_TMPL_GLMEDGE,           /* glmedge */
    CHAT_TMPL_MINICPM,           /* minicpm */
    CHAT_TMPL_EXAONE3,           /* exaone3 */
    CHAT_TMPL_RWKV_WORLD,        /* rwkv-world */
    CHAT_TMPL_GRANITE,           /* granite */
    CHAT_TMPL_GIGACHAT,          /* gigachat */
    CHAT_TMPL_MEGREZ,            /* megrez */
    CHAT_TMPL_UNKNOWN,           /* a template text no rule recognises: cannot chat with it */
    CHAT_TMPL_JINJA,             /* the model's own template run by the Jinja interpreter (app/prompt.c);
                                    not a shape-table family: chat_template_render refuses it */
};

/* Family of a `tokenizer.chat_template` text. NULL or empty → CHAT_TMPL_NONE; a text that
 * is exactly a family name ("chatml") → that family; otherwise the first matching rule of
 * an ordered list of distinctive substrings ("<|im_start|>" → chatml, "[INST]" → the
 * mistral/llama2 variants, "<|start_header_id|>" → llama3, …); nothing matches →
 * CHAT_TMPL_UNKNOWN. Never fails. */
int chat_template_detect(const char *tmpl_text);

/* Family from a user-given name: the names llama.cpp uses ("chatml", "llama2", "llama3",
 * "gemma", "phi3", "mistral-v7", … — the full list is chat_template_names()); "none" gives
 * CHAT_TMPL_NONE (completion mode). Exact, case-sensitive match. Unknown name or NULL → -1. */
int chat_template_from_name(const char *name);

/* Name of a family (as accepted by chat_template_from_name); "none" for CHAT_TMPL_NONE,
 * "jinja" for CHAT_TMPL_JINJA, "unknown" for CHAT_TMPL_UNKNOWN or any value out of range.
 * Static string, never NULL. */
const char *chat_template_name(int tmpl);

/* All family names, comma-separated in enum order ("chatml, llama2, …"), for --help and
 * error messages. Static string. */
const char *chat_template_names(void);

/* Render msgs[0..n) in family tmpl, followed by the assistant's generation prompt when
 * add_assistant (families whose user turn already ends with the assistant cue — llama2,
 * mistral-v1/v3/v3-tekken/v7, orion, minicpm, rwkv-world — add nothing).
 * On success *out is a malloc'd NUL-terminated string the caller frees; returns KV_OK.
 * Errors (err filled, *out = NULL):
 *   KV_ERR_UNSUPPORTED  tmpl is CHAT_TMPL_NONE or CHAT_TMPL_UNKNOWN (message names it);
 *   KV_ERR_INVALID      tmpl out of range, out NULL, msgs NULL with n > 0, or a message
 *                       whose role is not system/user/assistant (message gives its index);
 *   KV_ERR_NOMEM        allocation failed.
 * Per-family details the golden renderings fix: contents are trimmed of surrounding
 * whitespace by llama2-sys-strip, gemma, command-r, llama3, minicpm, exaone3 and (assistant
 * turns only) mistral-v3; gemma and orion have no system turn and put the system text in
 * front of the next user turn ("SYS\n\nUSER"); gigachat renders a system message only as
 * msgs[0] and drops later ones; the other families render every message in place. */
int chat_template_render(int tmpl, const chat_msg *msgs, size_t n, int add_assistant,
                         char **out, kv_error *err);

/* 1 if family tmpl is prefix-stable, 0 if not (and for NONE/UNKNOWN/out of range).
 * Prefix-stable means: for every conversation msgs[0..n) ending with a user turn and every
 * reply R,
 *     render(msgs[0..n), add_assistant=1) + R
 * is a byte prefix of
 *     render(msgs[0..n) + {assistant, R} + {user, U}, add_assistant=1),
 * so the KV cache of the prompt plus the reply as generated can be kept for the next turn
 * (the family's end-of-turn text follows R in the longer rendering).
 * Stable: chatml, llama2, llama2-sys, llama2-sys-bos, mistral-v3-tekken, phi3, phi4,
 *   falcon3, zephyr, monarch, orion, deepseek, deepseek3, rwkv-world, gigachat, megrez.
 * Not stable, because previous assistant turns are
 *   trimmed of surrounding whitespace (stable only for replies without it):
 *     llama2-sys-strip, gemma, command-r, llama3, minicpm, exaone3;
 *   written with a separator the generation prompt does not end with (a space in
 *   "[/INST] R", "Assistant: R", "USER: …\nASSISTANT: R", "\n" or "\n " after the role tag):
 *     mistral-v1, mistral-v7, openchat, vicuna, vicuna-orca, deepseek2, granite,
 *     chatglm3, chatglm4, glmedge;
 *   both: mistral-v3.
 * For unstable families the caller re-renders the whole conversation and keeps only the
 * KV cache of the tokens the old and new prompts share. */
int chat_template_is_prefix_stable(int tmpl);

#endif
