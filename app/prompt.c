/* prompt: turns a conversation into the model's prompt — plain text in completion mode, or a chat template cut into scaffolding and message contents. */
#include "prompt.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/chat_template.h"
#include "engine/jinja.h"

static int is_space(char ch) { return ch == ' ' || ch == '\n' || ch == '\t' || ch == '\r'; }

int prompt_needs_space(const char *prev, size_t prev_len, const char *next, size_t next_len)
{
    return prev_len && next_len && !is_space(prev[prev_len - 1]) && !is_space(next[0]);
}

static int buf_put(prompt_buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->len + n + 1) nc *= 2;
        char *nt = realloc(b->text, nc);
        if (!nt) return -1;
        b->text = nt;
        b->cap = nc;
    }
    if (n) memcpy(b->text + b->len, s, n);
    b->len += n;
    b->text[b->len] = 0;
    return 0;
}

/* Start a segment at the current end of the text (its pointer is fixed up by finish()). */
static int seg_open(prompt_buf *b, int special)
{
    if (b->n_seg == b->cap_seg) {
        size_t nc = b->cap_seg ? b->cap_seg * 2 : 16;
        worker_segment *ns = realloc(b->seg, nc * sizeof *ns);
        if (!ns) return -1;
        b->seg = ns;
        b->cap_seg = nc;
    }
    b->seg[b->n_seg++] = (worker_segment){(const char *)(uintptr_t)b->len, 0, special};
    return 0;
}

static int seg_add(prompt_buf *b, const char *s, size_t n, int special)
{
    if (seg_open(b, special) || buf_put(b, s, n)) return -1;
    b->seg[b->n_seg - 1].len = n;
    return 0;
}

static void finish(prompt_buf *b)
{
    /* nothing buffered (every segment empty): no text yet, so point them at "" */
    for (size_t i = 0; i < b->n_seg; i++) b->seg[i].text = b->text ? b->text + (uintptr_t)b->seg[i].text : "";
}

static void reset(prompt_buf *b)
{
    b->len = 0;
    b->n_seg = 0;
    if (b->text) b->text[0] = 0;
}

static int build_completion(const prompt_msg *msgs, size_t n, prompt_buf *b)
{
    if (seg_open(b, 0)) return -1;
    size_t start = b->len;
    for (size_t i = 0; i < n; i++) {
        const prompt_msg *m = &msgs[i];
        if (!strcmp(m->role, "system")) {
            if (!m->len) continue;
            if (buf_put(b, m->text, m->len) || buf_put(b, "\n\n", 2)) return -1;
            continue;
        }
        if (!strcmp(m->role, "user") && prompt_needs_space(b->text ? b->text + start : "", b->len - start, m->text, m->len) &&
            buf_put(b, " ", 1))
            return -1;
        if (buf_put(b, m->text, m->len)) return -1;
    }
    b->seg[b->n_seg - 1].len = b->len - start;
    return 0;
}

/* Families whose rendering trims the surrounding whitespace of a message (chat_template.h). */
static int family_trims(int tmpl, int is_assistant)
{
    switch (tmpl) {
    case CHAT_TMPL_LLAMA2_SYS_STRIP: case CHAT_TMPL_GEMMA: case CHAT_TMPL_COMMAND_R: case CHAT_TMPL_LLAMA3:
    case CHAT_TMPL_MINICPM: case CHAT_TMPL_EXAONE3: return 1;
    case CHAT_TMPL_MISTRAL_V3: return is_assistant;
    default: return 0;
    }
}

/* Render with a marker ("\x1e" index "\x1f") in place of each content, then cut the
 * rendering at the markers: template text → special segments, contents → plain ones. */
static int build_template(int tmpl, const prompt_msg *msgs, size_t n, prompt_buf *b, char *err, size_t err_cap)
{
    chat_msg *cm = calloc(n ? n : 1, sizeof *cm);
    char (*marks)[24] = calloc(n ? n : 1, sizeof *marks);
    int rc = -1;
    char *out = NULL;
    if (!cm || !marks) goto done;
    for (size_t i = 0; i < n; i++) {
        snprintf(marks[i], sizeof marks[i], "\x1e%zu\x1f", i);
        cm[i].role = msgs[i].role;
        cm[i].content = marks[i];
    }
    kv_error ke = {0};
    if (chat_template_render(tmpl, cm, n, 1, &out, &ke)) {
        snprintf(err, err_cap, "%s", ke.msg);
        goto done;
    }
    for (const char *p = out;;) {
        const char *m = strchr(p, '\x1e');
        if (!m) {
            if (*p && seg_add(b, p, strlen(p), 1)) goto done;
            break;
        }
        if (m > p && seg_add(b, p, (size_t)(m - p), 1)) goto done;
        char *end;
        unsigned long idx = strtoul(m + 1, &end, 10);
        if (*end != '\x1f' || idx >= n) {
            snprintf(err, err_cap, "chat template %s: cannot locate the message contents", chat_template_name(tmpl));
            goto done;
        }
        const char *t = msgs[idx].text;
        size_t len = msgs[idx].len;
        if (family_trims(tmpl, !strcmp(msgs[idx].role, "assistant"))) {
            while (len && is_space(t[0])) t++, len--;
            while (len && is_space(t[len - 1])) len--;
        }
        if (len && seg_add(b, t, len, 0)) goto done;
        p = end + 1;
    }
    rc = 0;
done:
    free(out);
    free(cm);
    free(marks);
    return rc;
}

int prompt_build(int tmpl, const prompt_msg *msgs, size_t n, prompt_buf *out, char *err, size_t err_cap)
{
    reset(out);
    if (err_cap) err[0] = 0;
    int rc = tmpl == CHAT_TMPL_NONE ? build_completion(msgs, n, out) : build_template(tmpl, msgs, n, out, err, err_cap);
    if (rc) {
        if (err_cap && !err[0]) snprintf(err, err_cap, "out of memory building the prompt");
        reset(out);
        return -1;
    }
    finish(out);
    return 0;
}

int prompt_build_append(const char *prev, size_t prev_len, const char *next, size_t next_len, prompt_buf *out)
{
    reset(out);
    if (seg_open(out, 0)) return -1;
    if (prompt_needs_space(prev, prev_len, next, next_len) && buf_put(out, " ", 1)) return -1;
    if (buf_put(out, next, next_len)) return -1;
    out->seg[0].len = out->len;
    finish(out);
    return 0;
}

void prompt_buf_free(prompt_buf *b)
{
    free(b->text);
    free(b->seg);
    memset(b, 0, sizeof *b);
}

/* ---- the model's own template (Jinja) ----------------------------------------------------- */

struct prompt_jinja {
    jinja_template *t;
    char *bos, *eos;
    int fallback;  /* shape-table family for a conversation the template refuses */
    int noticed;   /* the fallback notice was given */
    int64_t now;   /* strftime_now's clock; < 0: the time of the render */
};

void prompt_jinja_set_clock(prompt_jinja *pj, int64_t now) { pj->now = now; }

void prompt_jinja_free(prompt_jinja *pj)
{
    if (!pj) return;
    jinja_free(pj->t);
    free(pj->bos);
    free(pj->eos);
    free(pj);
}

static int render_jinja(prompt_jinja *pj, const prompt_msg *msgs, size_t n, char **text, size_t *len,
                        unsigned char **mask, kv_error *ke)
{
    jinja_chat_msg *jm = calloc(n ? n : 1, sizeof *jm);
    if (!jm) return kv_error_set(ke, KV_ERR_NOMEM, "out of memory building the prompt");
    for (size_t i = 0; i < n; i++) jm[i] = (jinja_chat_msg){msgs[i].role, msgs[i].text, msgs[i].len};
    int rc = jinja_render_chat(pj->t, jm, n, 1, pj->bos, pj->eos, pj->now >= 0 ? pj->now : (int64_t)time(NULL), text,
                               len, mask, ke);
    free(jm);
    return rc;
}

int prompt_is_template_file(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    return n && (strchr(name, '/') || (n > 6 && !strcmp(name + n - 6, ".jinja")));
}

static int choose(const char *tmpl_text, const char *name, const char *bos, const char *eos, prompt_jinja **pj,
                  char *notice, size_t notice_cap);

int prompt_choose(const char *tmpl_text, const char *name, const char *bos, const char *eos, prompt_jinja **pj,
                  char *notice, size_t notice_cap)
{
    if (!prompt_is_template_file(name)) return choose(tmpl_text, name, bos, eos, pj, notice, notice_cap);
    FILE *f = fopen(name, "rb");
    char *text = NULL;
    size_t len = 0, cap = 0, r;
    char buf[4096];
    while (f && (r = fread(buf, 1, sizeof buf, f)) > 0) {
        if (len + r + 1 > cap) {
            char *nt = realloc(text, cap = (len + r + 1) * 2);
            if (!nt) break;
            text = nt;
        }
        memcpy(text + len, buf, r);
        len += r;
        text[len] = 0;
    }
    int ok = f && !ferror(f) && text;
    if (f) fclose(f);
    int t;
    if (ok) {
        t = choose(text, NULL, bos, eos, pj, notice, notice_cap);
    } else {
        t = choose(tmpl_text, NULL, bos, eos, pj, notice, notice_cap);
        snprintf(notice, notice_cap, "cannot read the chat template file %s; using the model's own", name);
    }
    free(text);
    return t;
}

static int choose(const char *tmpl_text, const char *name, const char *bos, const char *eos, prompt_jinja **pj,
                  char *notice, size_t notice_cap)
{
    *pj = NULL;
    if (notice_cap) notice[0] = 0;
    if (name) {
        int t = chat_template_from_name(name);
        return t < 0 ? CHAT_TMPL_NONE : t;
    }
    if (!tmpl_text || !*tmpl_text) return CHAT_TMPL_NONE;
    int family = chat_template_detect(tmpl_text);
    kv_error ke = {0};
    prompt_jinja *p = calloc(1, sizeof *p);
    if (p) p->now = -1;
    if (p && !(p->bos = strdup(bos ? bos : "")) ) ke.code = KV_ERR_NOMEM;
    if (p && !ke.code && !(p->eos = strdup(eos ? eos : ""))) ke.code = KV_ERR_NOMEM;
    if (!p || ke.code) snprintf(ke.msg, sizeof ke.msg, "out of memory");
    else if (!jinja_parse(tmpl_text, strlen(tmpl_text), &p->t, &ke)) {
        static const prompt_msg probe[] = {{"user", "Hello!", 6}, {"assistant", "Hi.", 3}, {"user", "Bye.", 4}};
        char *text = NULL;
        size_t len = 0;
        unsigned char *mask = NULL;
        if (!render_jinja(p, probe, 3, &text, &len, &mask, &ke)) {
            free(text);
            free(mask);
            p->fallback = family;
            *pj = p;
            return CHAT_TMPL_JINJA;
        }
    }
    prompt_jinja_free(p);
    if (family == CHAT_TMPL_UNKNOWN)
        snprintf(notice, notice_cap, "cannot run the model's chat template (%s) and no built-in format matches it",
                 ke.msg);
    else
        snprintf(notice, notice_cap, "cannot run the model's chat template (%s); using the built-in format '%s'",
                 ke.msg, chat_template_name(family));
    return family;
}

int prompt_build_jinja(prompt_jinja *pj, const prompt_msg *msgs, size_t n, prompt_buf *out, char *err, size_t err_cap)
{
    reset(out);
    if (err_cap) err[0] = 0;
    char *text = NULL;
    size_t len = 0;
    unsigned char *mask = NULL;
    kv_error ke = {0};
    if (render_jinja(pj, msgs, n, &text, &len, &mask, &ke)) {
        if (ke.code == KV_ERR_NOMEM || pj->fallback == CHAT_TMPL_UNKNOWN || pj->fallback == CHAT_TMPL_NONE) {
            snprintf(err, err_cap, "%s", ke.msg);
            return -1;
        }
        if (prompt_build(pj->fallback, msgs, n, out, err, err_cap)) return -1;
        if (!pj->noticed && err_cap)
            snprintf(err, err_cap, "the model's chat template refuses this conversation (%s); using the built-in "
                     "format '%s'", ke.msg, chat_template_name(pj->fallback));
        pj->noticed = 1;
        return 0;
    }
    int rc = 0;
    for (size_t i = 0; i < len && !rc;) {
        size_t j = i;
        while (j < len && mask[j] == mask[i]) j++;
        rc = seg_add(out, text + i, j - i, !mask[i]);
        i = j;
    }
    free(text);
    free(mask);
    if (rc) {
        reset(out);
        snprintf(err, err_cap, "out of memory building the prompt");
        return -1;
    }
    finish(out);
    return 0;
}
