/* chat_template: per-family chat formats as data, their detection rules, and the three renderers that read them. */
#include "chat_template.h"

#include <stdlib.h>
#include <string.h>

/* ---- family descriptions ------------------------------------------------------------- */

enum { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, N_ROLES };

/* Bits of tmpl_spec.trim: whose content loses its surrounding whitespace. */
#define TRIM_SYSTEM    (1u << ROLE_SYSTEM)
#define TRIM_USER      (1u << ROLE_USER)
#define TRIM_ASSISTANT (1u << ROLE_ASSISTANT)
#define TRIM_ALL       (TRIM_SYSTEM | TRIM_USER | TRIM_ASSISTANT)

/* How a family lays out a conversation. */
enum render_kind {
    /* Each message is open[role] + content + close[role], in order; `between` goes before
     * every message but the first; a preamble goes once in front. */
    KIND_TAGGED,
    /* [INST] turns: a turn opens with turn_open (first) / turn_reopen (later) before the
     * first message that finds no turn open, an assistant message closes it. With
     * turn_eager the first turn opens even before any message (llama2 writes "[INST] "
     * unconditionally). */
    KIND_INST,
    /* No system turn: system contents wait and go at the start of the next user turn,
     * followed by merge_sep; several waiting system contents are joined by merge_sep. */
    KIND_MERGE_SYSTEM,
};

typedef struct tmpl_spec {
    const char *name;           /* the name llama.cpp and --chat-template use */
    enum render_kind kind;
    const char *preamble;       /* once, before the first message */
    const char *open[N_ROLES];  /* before a message's content */
    const char *close[N_ROLES]; /* after a message's content */
    const char *gen;            /* generation prompt (add_assistant) */
    unsigned trim;              /* TRIM_* bits */
    const char *between;        /* KIND_TAGGED: before every message except msgs[0] */
    int system_first_only;      /* KIND_TAGGED: a system message is rendered only as msgs[0] */
    const char *turn_open;      /* KIND_INST */
    const char *turn_reopen;    /* KIND_INST */
    int turn_eager;             /* KIND_INST */
    const char *merge_sep;      /* KIND_MERGE_SYSTEM */
    int prefix_stable;          /* see chat_template_is_prefix_stable() in the header */
} tmpl_spec;

/* Shorthand for the open/close triples, in role order system, user, assistant. */
#define ROLES(s, u, a) { s, u, a }

/* One row per family. Each format is the one on the model card named in the comment, as
 * rendered by llama.cpp's built-in templates (golden/chat-templates.json holds both the
 * with- and without-system rendering of every row). */
static const tmpl_spec SPECS[] = {
    /* OpenAI ChatML; teknium/OpenHermes-2.5, Qwen/Qwen2.5-*-Instruct, NousResearch/Hermes-2/3 */
    [CHAT_TMPL_CHATML] = {
        .name = "chatml", .kind = KIND_TAGGED,
        .open  = ROLES("<|im_start|>system\n", "<|im_start|>user\n", "<|im_start|>assistant\n"),
        .close = ROLES("<|im_end|>\n", "<|im_end|>\n", "<|im_end|>\n"),
        .gen = "<|im_start|>assistant\n", .prefix_stable = 1 },

    /* meta-llama/Llama-2-*-chat and Mistral-7B-Instruct-v0.2 (no <<SYS>>: the system text
     * opens the first [INST] followed by "\n") */
    [CHAT_TMPL_LLAMA2] = {
        .name = "llama2", .kind = KIND_INST,
        .turn_open = "[INST] ", .turn_reopen = "[INST] ", .turn_eager = 1,
        .open  = ROLES("", "", ""),
        .close = ROLES("\n", " [/INST]", "</s>"),
        .gen = "", .prefix_stable = 1 },
    /* Llama 2 with <<SYS>> (huggingface.co/blog/llama2#how-to-prompt-llama-2) */
    [CHAT_TMPL_LLAMA2_SYS] = {
        .name = "llama2-sys", .kind = KIND_INST,
        .turn_open = "[INST] ", .turn_reopen = "[INST] ", .turn_eager = 1,
        .open  = ROLES("<<SYS>>\n", "", ""),
        .close = ROLES("\n<</SYS>>\n\n", " [/INST]", "</s>"),
        .gen = "", .prefix_stable = 1 },
    /* TheBloke/FusionNet_34Bx2_MoE: as llama2-sys, "<s>" before every later [INST] */
    [CHAT_TMPL_LLAMA2_SYS_BOS] = {
        .name = "llama2-sys-bos", .kind = KIND_INST,
        .turn_open = "[INST] ", .turn_reopen = "<s>[INST] ", .turn_eager = 1,
        .open  = ROLES("<<SYS>>\n", "", ""),
        .close = ROLES("\n<</SYS>>\n\n", " [/INST]", "</s>"),
        .gen = "", .prefix_stable = 1 },
    /* bofenghuang/vigogne-2-70b-chat: as llama2-sys, every content strip()ped */
    [CHAT_TMPL_LLAMA2_SYS_STRIP] = {
        .name = "llama2-sys-strip", .kind = KIND_INST,
        .turn_open = "[INST] ", .turn_reopen = "[INST] ", .turn_eager = 1,
        .open  = ROLES("<<SYS>>\n", "", ""),
        .close = ROLES("\n<</SYS>>\n\n", " [/INST]", "</s>"),
        .gen = "", .trim = TRIM_ALL },

    /* mistralai cookbook, concept-deep-dive/tokenization/templates.md: v1 (Mistral-7B-
     * Instruct-v0.1), v3 (Mistral-7B-Instruct-v0.3, Mistral-Large-2407), v3-tekken
     * (Mistral-Nemo-Instruct-2407). The system text opens the first [INST] + "\n\n". */
    [CHAT_TMPL_MISTRAL_V1] = {
        .name = "mistral-v1", .kind = KIND_INST,
        .turn_open = " [INST] ", .turn_reopen = " [INST] ",
        .open  = ROLES("", "", " "),
        .close = ROLES("\n\n", " [/INST]", "</s>"),
        .gen = "" },
    [CHAT_TMPL_MISTRAL_V3] = {
        .name = "mistral-v3", .kind = KIND_INST,
        .turn_open = "[INST] ", .turn_reopen = "[INST] ",
        .open  = ROLES("", "", " "),
        .close = ROLES("\n\n", "[/INST]", "</s>"),
        .gen = "", .trim = TRIM_ASSISTANT },
    [CHAT_TMPL_MISTRAL_V3_TEKKEN] = {
        .name = "mistral-v3-tekken", .kind = KIND_INST,
        .turn_open = "[INST]", .turn_reopen = "[INST]",
        .open  = ROLES("", "", ""),
        .close = ROLES("\n\n", "[/INST]", "</s>"),
        .gen = "", .prefix_stable = 1 },
    /* mistralai/Mistral-Large-Instruct-2411 model card, "basic instruct template (v7)" */
    [CHAT_TMPL_MISTRAL_V7] = {
        .name = "mistral-v7", .kind = KIND_TAGGED,
        .open  = ROLES("[SYSTEM_PROMPT] ", "[INST] ", " "),
        .close = ROLES("[/SYSTEM_PROMPT]", "[/INST]", "</s>"),
        .gen = "" },

    /* microsoft/Phi-3-mini-4k-instruct, Phi-3.5-mini-instruct */
    [CHAT_TMPL_PHI3] = {
        .name = "phi3", .kind = KIND_TAGGED,
        .open  = ROLES("<|system|>\n", "<|user|>\n", "<|assistant|>\n"),
        .close = ROLES("<|end|>\n", "<|end|>\n", "<|end|>\n"),
        .gen = "<|assistant|>\n", .prefix_stable = 1 },
    /* microsoft/phi-4 */
    [CHAT_TMPL_PHI4] = {
        .name = "phi4", .kind = KIND_TAGGED,
        .open  = ROLES("<|im_start|>system<|im_sep|>", "<|im_start|>user<|im_sep|>",
                       "<|im_start|>assistant<|im_sep|>"),
        .close = ROLES("<|im_end|>", "<|im_end|>", "<|im_end|>"),
        .gen = "<|im_start|>assistant<|im_sep|>", .prefix_stable = 1 },
    /* tiiuae/Falcon3-*-Instruct */
    [CHAT_TMPL_FALCON3] = {
        .name = "falcon3", .kind = KIND_TAGGED,
        .open  = ROLES("<|system|>\n", "<|user|>\n", "<|assistant|>\n"),
        .close = ROLES("\n", "\n", "\n"),
        .gen = "<|assistant|>\n", .prefix_stable = 1 },
    /* HuggingFaceH4/zephyr-7b-beta */
    [CHAT_TMPL_ZEPHYR] = {
        .name = "zephyr", .kind = KIND_TAGGED,
        .open  = ROLES("<|system|>\n", "<|user|>\n", "<|assistant|>\n"),
        .close = ROLES("<|endoftext|>\n", "<|endoftext|>\n", "<|endoftext|>\n"),
        .gen = "<|assistant|>\n", .prefix_stable = 1 },
    /* mlabonne/AlphaMonarch-7B: "<s>" opens every message but the first (the tokenizer's
     * BOS is the first one) */
    [CHAT_TMPL_MONARCH] = {
        .name = "monarch", .kind = KIND_TAGGED, .between = "<s>",
        .open  = ROLES("system\n", "user\n", "assistant\n"),
        .close = ROLES("</s>\n", "</s>\n", "</s>\n"),
        .gen = "<s>assistant\n", .prefix_stable = 1 },

    /* google/gemma-7b-it, gemma-2-2b-it: no system role, assistant is "model", trimmed */
    [CHAT_TMPL_GEMMA] = {
        .name = "gemma", .kind = KIND_MERGE_SYSTEM, .merge_sep = "\n\n",
        .open  = ROLES("", "<start_of_turn>user\n", "<start_of_turn>model\n"),
        .close = ROLES("", "<end_of_turn>\n", "<end_of_turn>\n"),
        .gen = "<start_of_turn>model\n", .trim = TRIM_ALL },
    /* OrionStarAI/Orion-14B-Chat: the user turn ends with the assistant cue and EOS */
    [CHAT_TMPL_ORION] = {
        .name = "orion", .kind = KIND_MERGE_SYSTEM, .merge_sep = "\n\n",
        .open  = ROLES("", "Human: ", ""),
        .close = ROLES("", "\n\nAssistant: </s>", "</s>"),
        .gen = "", .prefix_stable = 1 },
    /* openchat/openchat-3.5-0106 (the author's format: a bare system text) */
    [CHAT_TMPL_OPENCHAT] = {
        .name = "openchat", .kind = KIND_TAGGED,
        .open  = ROLES("", "GPT4 Correct User: ", "GPT4 Correct Assistant: "),
        .close = ROLES("<|end_of_turn|>", "<|end_of_turn|>", "<|end_of_turn|>"),
        .gen = "GPT4 Correct Assistant:" },
    /* eachadea/vicuna-13b-1.1 */
    [CHAT_TMPL_VICUNA] = {
        .name = "vicuna", .kind = KIND_TAGGED,
        .open  = ROLES("", "USER: ", "ASSISTANT: "),
        .close = ROLES("\n\n", "\n", "</s>\n"),
        .gen = "ASSISTANT:" },
    /* Orca-Vicuna: vicuna with a "SYSTEM: " line */
    [CHAT_TMPL_VICUNA_ORCA] = {
        .name = "vicuna-orca", .kind = KIND_TAGGED,
        .open  = ROLES("SYSTEM: ", "USER: ", "ASSISTANT: "),
        .close = ROLES("\n", "\n", "</s>\n"),
        .gen = "ASSISTANT:" },
    /* deepseek-ai/deepseek-coder-33b-instruct */
    [CHAT_TMPL_DEEPSEEK] = {
        .name = "deepseek", .kind = KIND_TAGGED,
        .open  = ROLES("", "### Instruction:\n", "### Response:\n"),
        .close = ROLES("", "\n", "\n<|EOT|>\n"),
        .gen = "### Response:\n", .prefix_stable = 1 },
    /* deepseek-ai/DeepSeek-V2-Chat */
    [CHAT_TMPL_DEEPSEEK2] = {
        .name = "deepseek2", .kind = KIND_TAGGED,
        .open  = ROLES("", "User: ", "Assistant: "),
        .close = ROLES("\n\n", "\n\n", "<｜end▁of▁sentence｜>"),
        .gen = "Assistant:" },
    /* deepseek-ai/DeepSeek-V3, DeepSeek-R1 and its distills (<｜User｜> <｜Assistant｜>) */
    [CHAT_TMPL_DEEPSEEK3] = {
        .name = "deepseek3", .kind = KIND_TAGGED,
        .open  = ROLES("", "<｜User｜>", "<｜Assistant｜>"),
        .close = ROLES("\n\n", "", "<｜end▁of▁sentence｜>"),
        .gen = "<｜Assistant｜>", .prefix_stable = 1 },
    /* CohereForAI/c4ai-command-r-plus, c4ai-command-r7b-12-2024 (contents strip()ped) */
    [CHAT_TMPL_COMMAND_R] = {
        .name = "command-r", .kind = KIND_TAGGED,
        .open  = ROLES("<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>", "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>",
                       "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
        .close = ROLES("<|END_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>"),
        .gen = "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", .trim = TRIM_ALL },
    /* meta-llama/Meta-Llama-3-8B-Instruct, Llama-3.1/3.2/3.3 (contents | trim) */
    [CHAT_TMPL_LLAMA3] = {
        .name = "llama3", .kind = KIND_TAGGED,
        .open  = ROLES("<|start_header_id|>system<|end_header_id|>\n\n",
                       "<|start_header_id|>user<|end_header_id|>\n\n",
                       "<|start_header_id|>assistant<|end_header_id|>\n\n"),
        .close = ROLES("<|eot_id|>", "<|eot_id|>", "<|eot_id|>"),
        .gen = "<|start_header_id|>assistant<|end_header_id|>\n\n", .trim = TRIM_ALL },
    /* THUDM/chatglm3-6b */
    [CHAT_TMPL_CHATGLM3] = {
        .name = "chatglm3", .kind = KIND_TAGGED, .preamble = "[gMASK]sop",
        .open  = ROLES("<|system|>\n ", "<|user|>\n ", "<|assistant|>\n "),
        .close = ROLES("", "", ""),
        .gen = "<|assistant|>" },
    /* THUDM/glm-4-9b-chat */
    [CHAT_TMPL_CHATGLM4] = {
        .name = "chatglm4", .kind = KIND_TAGGED, .preamble = "[gMASK]<sop>",
        .open  = ROLES("<|system|>\n", "<|user|>\n", "<|assistant|>\n"),
        .close = ROLES("", "", ""),
        .gen = "<|assistant|>" },
    /* THUDM/glm-edge-*-chat */
    [CHAT_TMPL_GLMEDGE] = {
        .name = "glmedge", .kind = KIND_TAGGED,
        .open  = ROLES("<|system|>\n", "<|user|>\n", "<|assistant|>\n"),
        .close = ROLES("", "", ""),
        .gen = "<|assistant|>" },
    /* MiniCPM-3B-OpenHermes-2.5-v2: the user turn ends with the <AI> cue, contents stripped */
    [CHAT_TMPL_MINICPM] = {
        .name = "minicpm", .kind = KIND_TAGGED,
        .open  = ROLES("", "<用户>", ""),
        .close = ROLES("", "<AI>", ""),
        .gen = "", .trim = TRIM_ALL },
    /* LGAI-EXAONE/EXAONE-3.0-7.8B-Instruct (contents trimmed) */
    [CHAT_TMPL_EXAONE3] = {
        .name = "exaone3", .kind = KIND_TAGGED,
        .open  = ROLES("[|system|]", "[|user|]", "[|assistant|]"),
        .close = ROLES("[|endofturn|]\n", "\n", "[|endofturn|]\n"),
        .gen = "[|assistant|]", .trim = TRIM_ALL },
    /* BlinkDL RWKV World models: "\n\n" ends a turn, the user turn ends with the cue */
    [CHAT_TMPL_RWKV_WORLD] = {
        .name = "rwkv-world", .kind = KIND_TAGGED,
        .open  = ROLES("", "User: ", ""),
        .close = ROLES("\n\n", "\n\nAssistant:", "\n\n"),
        .gen = "", .prefix_stable = 1 },
    /* ibm-granite/granite-3.0-8b-instruct */
    [CHAT_TMPL_GRANITE] = {
        .name = "granite", .kind = KIND_TAGGED,
        .open  = ROLES("<|start_of_role|>system<|end_of_role|>", "<|start_of_role|>user<|end_of_role|>",
                       "<|start_of_role|>assistant<|end_of_role|>"),
        .close = ROLES("<|end_of_text|>\n", "<|end_of_text|>\n", "<|end_of_text|>\n"),
        .gen = "<|start_of_role|>assistant<|end_of_role|>\n" },
    /* ai-sage/GigaChat-20B-A3B-instruct: BOS text first, a leading system text, every user
     * turn followed by an empty "available functions" turn */
    [CHAT_TMPL_GIGACHAT] = {
        .name = "gigachat", .kind = KIND_TAGGED, .preamble = "<s>", .system_first_only = 1,
        .open  = ROLES("", "user<|role_sep|>", "assistant<|role_sep|>"),
        .close = ROLES("<|message_sep|>",
                       "<|message_sep|>available functions<|role_sep|>[]<|message_sep|>",
                       "<|message_sep|>"),
        .gen = "assistant<|role_sep|>", .prefix_stable = 1 },
    /* Infinigence/Megrez-3B-Instruct */
    [CHAT_TMPL_MEGREZ] = {
        .name = "megrez", .kind = KIND_TAGGED,
        .open  = ROLES("<|role_start|>system<|role_end|>", "<|role_start|>user<|role_end|>",
                       "<|role_start|>assistant<|role_end|>"),
        .close = ROLES("<|turn_end|>", "<|turn_end|>", "<|turn_end|>"),
        .gen = "<|role_start|>assistant<|role_end|>", .prefix_stable = 1 },
};

#define N_SPECS ((int)(sizeof SPECS / sizeof SPECS[0]))

/* Keep in step with SPECS (the test checks they agree). */
static const char ALL_NAMES[] =
    "chatml, llama2, llama2-sys, llama2-sys-bos, llama2-sys-strip, mistral-v1, mistral-v3, "
    "mistral-v3-tekken, mistral-v7, phi3, phi4, falcon3, zephyr, monarch, gemma, orion, "
    "openchat, vicuna, vicuna-orca, deepseek, deepseek2, deepseek3, command-r, llama3, "
    "chatglm3, chatglm4, glmedge, minicpm, exaone3, rwkv-world, granite, gigachat, megrez";

static int is_family(int tmpl)
{
    return tmpl > CHAT_TMPL_NONE && tmpl < CHAT_TMPL_UNKNOWN && tmpl < N_SPECS &&
           SPECS[tmpl].name != NULL;
}

/* ---- names --------------------------------------------------------------------------- */

int chat_template_from_name(const char *name)
{
    if (!name)
        return -1;
    if (strcmp(name, "none") == 0)
        return CHAT_TMPL_NONE;
    for (int t = CHAT_TMPL_NONE + 1; t < CHAT_TMPL_UNKNOWN; t++)
        if (is_family(t) && strcmp(SPECS[t].name, name) == 0)
            return t;
    return -1;
}

const char *chat_template_name(int tmpl)
{
    if (tmpl == CHAT_TMPL_NONE)
        return "none";
    if (tmpl == CHAT_TMPL_JINJA)
        return "jinja";
    return is_family(tmpl) ? SPECS[tmpl].name : "unknown";
}

const char *chat_template_names(void)
{
    return ALL_NAMES;
}

int chat_template_is_prefix_stable(int tmpl)
{
    return is_family(tmpl) ? SPECS[tmpl].prefix_stable : 0;
}

/* ---- detection ----------------------------------------------------------------------- */

/* A rule matches when the template text contains every one of its needles. Rules are
 * tried in order, so a more specific rule sits before a broader one that would also
 * match (phi4 before chatml, mistral-v7 before the other [INST] families, falcon3
 * before glmedge, vicuna-orca before vicuna). */
typedef struct detect_rule {
    int tmpl;
    const char *needle[3];
} detect_rule;

static const detect_rule RULES[] = {
    { CHAT_TMPL_PHI4,              { "<|im_start|>", "<|im_sep|>" } },
    { CHAT_TMPL_CHATML,            { "<|im_start|>" } },
    /* Mistral's official templates: [SYSTEM_PROMPT] is v7; the tool-aware ones
     * ([AVAILABLE_TOOLS]) are v1 with " [INST]", v3-tekken with "[INST]" quoted bare,
     * else v3. */
    { CHAT_TMPL_MISTRAL_V7,        { "[INST]", "[SYSTEM_PROMPT]" } },
    { CHAT_TMPL_MISTRAL_V1,        { "' [INST] ' + system_message" } },
    { CHAT_TMPL_MISTRAL_V1,        { "[AVAILABLE_TOOLS]", " [INST]" } },
    { CHAT_TMPL_MISTRAL_V3_TEKKEN, { "[AVAILABLE_TOOLS]", "\"[INST]\"" } },
    { CHAT_TMPL_MISTRAL_V3,        { "[AVAILABLE_TOOLS]", "[INST]" } },
    /* Llama 2 and its community variants. */
    { CHAT_TMPL_LLAMA2_SYS_STRIP,  { "[INST]", "content.strip()" } },
    { CHAT_TMPL_LLAMA2_SYS_BOS,    { "[INST]", "bos_token + '[INST]" } },
    { CHAT_TMPL_LLAMA2_SYS,        { "[INST]", "<<SYS>>" } },
    { CHAT_TMPL_LLAMA2,            { "[INST]" } },
    { CHAT_TMPL_PHI3,              { "<|assistant|>", "<|end|>" } },
    { CHAT_TMPL_CHATGLM4,          { "[gMASK]<sop>" } },
    { CHAT_TMPL_CHATGLM3,          { "[gMASK]sop" } },
    { CHAT_TMPL_FALCON3,           { "<|assistant|>", "<|user|>", "</s>" } },
    { CHAT_TMPL_GLMEDGE,           { "<|assistant|>", "<|user|>" } },
    { CHAT_TMPL_ZEPHYR,            { "<|user|>", "<|endoftext|>" } },
    { CHAT_TMPL_MONARCH,           { "bos_token + message['role']" } },
    { CHAT_TMPL_GEMMA,             { "<start_of_turn>" } },
    { CHAT_TMPL_ORION,             { "'\\n\\nAssistant: ' + eos_token" } },
    { CHAT_TMPL_OPENCHAT,          { "GPT4 Correct " } },
    { CHAT_TMPL_VICUNA_ORCA,       { "USER: ", "ASSISTANT: ", "SYSTEM: " } },
    { CHAT_TMPL_VICUNA,            { "USER: ", "ASSISTANT: " } },
    { CHAT_TMPL_DEEPSEEK,          { "### Instruction:", "<|EOT|>" } },
    { CHAT_TMPL_COMMAND_R,         { "<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>" } },
    { CHAT_TMPL_LLAMA3,            { "<|start_header_id|>", "<|end_header_id|>" } },
    { CHAT_TMPL_MINICPM,           { "<用户>" } },
    { CHAT_TMPL_DEEPSEEK2,         { "'Assistant: ' + message['content'] + eos_token" } },
    { CHAT_TMPL_DEEPSEEK3,         { "<｜Assistant｜>",
                                     "<｜User｜>",
                                     "<｜end▁of▁sentence｜>" } },
    { CHAT_TMPL_EXAONE3,           { "[|system|]", "[|assistant|]", "[|endofturn|]" } },
    { CHAT_TMPL_RWKV_WORLD,        { "rwkv-world" } },
    { CHAT_TMPL_GRANITE,           { "<|start_of_role|>" } },
    { CHAT_TMPL_GIGACHAT,          { "message['role'] + additional_special_tokens[0]" } },
    { CHAT_TMPL_GIGACHAT,          { "<|message_sep|>", "<|role_sep|>" } },
    { CHAT_TMPL_MEGREZ,            { "<|role_start|>" } },
};

static int rule_matches(const detect_rule *r, const char *text)
{
    for (size_t i = 0; i < sizeof r->needle / sizeof r->needle[0]; i++)
        if (r->needle[i] && !strstr(text, r->needle[i]))
            return 0;
    return 1;
}

int chat_template_detect(const char *tmpl_text)
{
    if (!tmpl_text || !*tmpl_text)
        return CHAT_TMPL_NONE;
    int by_name = chat_template_from_name(tmpl_text);
    if (by_name > CHAT_TMPL_NONE)
        return by_name;
    for (size_t i = 0; i < sizeof RULES / sizeof RULES[0]; i++)
        if (rule_matches(&RULES[i], tmpl_text))
            return RULES[i].tmpl;
    return CHAT_TMPL_UNKNOWN;
}

/* ---- output buffer ------------------------------------------------------------------- */

typedef struct strbuf {
    char *p;
    size_t len, cap;
    int oom; /* an append failed; the buffer is freed by the caller */
} strbuf;

static void sb_putn(strbuf *b, const char *s, size_t n)
{
    if (b->oom || n == 0)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_puts(strbuf *b, const char *s)
{
    if (s)
        sb_putn(b, s, strlen(s));
}

/* ASCII whitespace, as the families' own trim()/strip() see it. */
static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* Message content, trimmed when the family trims this role. */
static void sb_content(strbuf *b, const tmpl_spec *s, int role, const char *content)
{
    if (!content)
        return;
    size_t start = 0, end = strlen(content);
    if (s->trim & (1u << role)) {
        while (start < end && is_space(content[start]))
            start++;
        while (end > start && is_space(content[end - 1]))
            end--;
    }
    sb_putn(b, content + start, end - start);
}

/* ---- renderers ----------------------------------------------------------------------- */

static void render_tagged(strbuf *b, const tmpl_spec *s, const chat_msg *msgs, const int *roles,
                          size_t n, int add_assistant)
{
    sb_puts(b, s->preamble);
    for (size_t i = 0; i < n; i++) {
        int r = roles[i];
        if (r == ROLE_SYSTEM && s->system_first_only && i != 0)
            continue;
        if (i != 0)
            sb_puts(b, s->between);
        sb_puts(b, s->open[r]);
        sb_content(b, s, r, msgs[i].content);
        sb_puts(b, s->close[r]);
    }
    if (add_assistant)
        sb_puts(b, s->gen);
}

static void render_inst(strbuf *b, const tmpl_spec *s, const chat_msg *msgs, const int *roles,
                        size_t n, int add_assistant)
{
    int in_turn = 0, opened_before = 0;
    if (s->turn_eager) {
        sb_puts(b, s->turn_open);
        in_turn = opened_before = 1;
    }
    for (size_t i = 0; i < n; i++) {
        int r = roles[i];
        if (!in_turn) {
            sb_puts(b, opened_before ? s->turn_reopen : s->turn_open);
            in_turn = opened_before = 1;
        }
        sb_puts(b, s->open[r]);
        sb_content(b, s, r, msgs[i].content);
        sb_puts(b, s->close[r]);
        if (r == ROLE_ASSISTANT)
            in_turn = 0;
    }
    if (add_assistant)
        sb_puts(b, s->gen);
}

static void render_merge_system(strbuf *b, const tmpl_spec *s, const chat_msg *msgs,
                                const int *roles, size_t n, int add_assistant)
{
    strbuf pending = { 0 }; /* system text waiting for the next user turn */
    for (size_t i = 0; i < n; i++) {
        int r = roles[i];
        if (r == ROLE_SYSTEM) {
            if (pending.len)
                sb_puts(&pending, s->merge_sep);
            sb_content(&pending, s, r, msgs[i].content);
            b->oom |= pending.oom;
            continue;
        }
        sb_puts(b, s->open[r]);
        if (r == ROLE_USER && pending.len) {
            sb_putn(b, pending.p, pending.len);
            sb_puts(b, s->merge_sep);
            pending.len = 0;
        }
        sb_content(b, s, r, msgs[i].content);
        sb_puts(b, s->close[r]);
    }
    free(pending.p);
    if (add_assistant)
        sb_puts(b, s->gen);
}

static int role_index(const char *role)
{
    if (!role)
        return -1;
    if (strcmp(role, "system") == 0)
        return ROLE_SYSTEM;
    if (strcmp(role, "user") == 0)
        return ROLE_USER;
    if (strcmp(role, "assistant") == 0)
        return ROLE_ASSISTANT;
    return -1;
}

int chat_template_render(int tmpl, const chat_msg *msgs, size_t n, int add_assistant,
                         char **out, kv_error *err)
{
    if (!out)
        return kv_error_set(err, KV_ERR_INVALID, "chat template: no output pointer given");
    *out = NULL;
    if (tmpl == CHAT_TMPL_NONE)
        return kv_error_set(err, KV_ERR_UNSUPPORTED,
                            "chat template 'none': completion mode has no chat format; "
                            "choose one with --chat-template NAME (%s)", ALL_NAMES);
    if (tmpl == CHAT_TMPL_UNKNOWN)
        return kv_error_set(err, KV_ERR_UNSUPPORTED,
                            "chat template 'unknown': the model's tokenizer.chat_template is "
                            "not a format kvchat knows; choose one with --chat-template NAME (%s)",
                            ALL_NAMES);
    if (!is_family(tmpl))
        return kv_error_set(err, KV_ERR_INVALID, "chat template %d: no such template", tmpl);
    if (n > 0 && !msgs)
        return kv_error_set(err, KV_ERR_INVALID,
                            "chat template '%s': %zu messages given without an array",
                            SPECS[tmpl].name, n);

    int *roles = malloc((n ? n : 1) * sizeof *roles);
    if (!roles)
        return kv_error_set(err, KV_ERR_NOMEM, "chat template '%s': out of memory for %zu messages",
                            SPECS[tmpl].name, n);
    for (size_t i = 0; i < n; i++) {
        roles[i] = role_index(msgs[i].role);
        if (roles[i] < 0) {
            int rc = kv_error_set(err, KV_ERR_INVALID,
                                  "chat template '%s': message %zu has role '%s' "
                                  "(expected system, user or assistant)",
                                  SPECS[tmpl].name, i, msgs[i].role ? msgs[i].role : "(null)");
            free(roles);
            return rc;
        }
    }

    const tmpl_spec *s = &SPECS[tmpl];
    strbuf b = { 0 };
    switch (s->kind) {
    case KIND_TAGGED:        render_tagged(&b, s, msgs, roles, n, add_assistant); break;
    case KIND_INST:          render_inst(&b, s, msgs, roles, n, add_assistant); break;
    case KIND_MERGE_SYSTEM:  render_merge_system(&b, s, msgs, roles, n, add_assistant); break;
    }
    free(roles);

    if (!b.oom && !b.p) { /* nothing written (e.g. no messages, no generation prompt) */
        b.p = malloc(1);
        if (b.p)
            b.p[0] = '\0';
        else
            b.oom = 1;
    }
    if (b.oom) {
        free(b.p);
        return kv_error_set(err, KV_ERR_NOMEM, "chat template '%s': out of memory rendering "
                            "%zu messages", s->name, n);
    }
    *out = b.p;
    return KV_OK;
}
