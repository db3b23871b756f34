/* decode_cmd: --beams (engine/beam.c) and --best-of N in the one-shot mode: run the candidates, print the chosen one. */
#include "app/decode_cmd.h"

#include <stdlib.h>
#include <string.h>

#include "engine/beam.h"
#include "engine/best_of.h"
#include "engine/gen_batch.h"
#include "engine/logprob.h"
#include "engine/speculate.h"
#include "app/config.h"

void decode_samples_free(decode_sample *s, int n) { gen_candidates_free(s, n); }

int decode_best_of(engine *e, int seq, sampler *s, const int32_t *prompt, size_t n_prompt, int n, int n_predict,
                   int top_n, decode_sample *out, gen_stats *st, kv_error *err)
{
    return engine_best_of(e, seq, s, prompt, n_prompt, n, n_predict, top_n, NULL, out, st, err);
}

/* The reply's tokens as text, or JSON lines with each token's log-prob (lps[i]) and, when
 * --top-logprobs asked for them, its alternatives (tlps[i]; NULL: none kept). */
static void print_tokens(engine *e, const int32_t *toks, const float *lps, const token_logprob *tlps, int n,
                         const decode_opts *o, json_out *j)
{
    const tokenizer *tk = engine_tokenizer(e);
    detok_stream ds;
    detok_stream_init(&ds);
    char buf[4096];
    plain_out po = {.f = stdout};
    if (!o->json && o->prompt_text) out_plain(stdout, o->prompt_text, strlen(o->prompt_text));
    for (int i = 0; i < n; i++) {
        int eog = tokenizer_is_eog(tk, toks[i]);
        size_t m = eog ? 0 : detok_stream_push(&ds, tk, toks[i], buf, sizeof buf);
        if (m > sizeof buf) m = sizeof buf;
        if (o->json) {
            token_logprob tl = {.tok = toks[i], .lp = lps ? lps[i] : 0};
            json_out_token_lp(j, toks[i], buf, m, tlps ? &tlps[i] : &tl, eog, tk);
        } else {
            plain_out_write(&po, buf, m);
        }
    }
    size_t m = detok_stream_flush(&ds, buf, sizeof buf);
    if (m > sizeof buf) m = sizeof buf;
    if (o->json && m) json_out_token(j, -1, buf, m);
    else if (!o->json) {
        plain_out_write(&po, buf, m);
        plain_out_flush(&po);
    }
    fflush(stdout);
}

/* The log-probs of the tokens toks[0..n) following prompt (teacher-forced on a fork of seq,
 * which holds the prompt): lps[i] and, with top_n > 0, tlps[i] with top_n alternatives. 0, or -1
 * when a forward pass failed (err says why). */
static int replay_logprobs(engine *e, int seq, const int32_t *prompt, size_t n_prompt, const int32_t *toks, int n,
                           int top_n, float *lps, token_logprob *tlps, kv_error *err)
{
    int f;
    if (engine_seq_fork(e, seq, -1, &f, err)) return -1;
    int nv = engine_model(e)->hp.n_vocab, rc = 0;
    float *lg = malloc(sizeof(float) * (size_t)nv);
    if (!lg) rc = -1;
    engine_seq_truncate(e, f, (int)n_prompt - 1);
    int32_t cur = prompt[n_prompt - 1];
    for (int i = 0; !rc && i < n; i++) {
        if (engine_forward(e, f, &cur, 1, lg, 0, err)) rc = -1;
        else {
            token_logprob tl;
            logprob_token(lg, nv, toks[i], top_n, &tl);
            lps[i] = tl.lp;
            if (tlps) tlps[i] = tl;
            cur = toks[i];
        }
    }
    free(lg);
    engine_seq_free(e, f);
    return rc;
}

int decode_oneshot(engine *e, sampler *s, const int32_t *prompt, size_t n_prompt, const decode_opts *o, json_out *j,
                   gen_stats *st, int *finish, kv_error *err)
{
    memset(st, 0, sizeof *st);
    *finish = GEN_FINISH_ERROR;
    if (o->beams > 1) {
        beam_result r;
        int rc = engine_beam_search(e, ENGINE_SEQ_DEFAULT, prompt, (int)n_prompt, o->beams, o->length_penalty,
                                    o->n_predict, &r, st, err);
        if (rc) return rc;
        /* per-token log-probs (and alternatives) of the chosen beam: replay it on a fork */
        size_t nt = (size_t)(r.n_tokens ? r.n_tokens : 1);
        float *lps = calloc(nt, sizeof(float));
        token_logprob *tlps = o->json && o->top_logprobs > 0 ? calloc(nt, sizeof *tlps) : NULL;
        kv_error rerr = {0};
        int ok = lps && (tlps || !(o->json && o->top_logprobs > 0)) &&
                 !replay_logprobs(e, ENGINE_SEQ_DEFAULT, prompt, n_prompt, r.tokens, r.n_tokens, o->top_logprobs,
                                  lps, tlps, &rerr);
        if (!ok) {
            free(lps);
            free(tlps);
            beam_result_free(&r);
            if (rerr.code) *err = rerr;
            return rerr.code ? rerr.code : kv_error_set(err, KV_ERR_NOMEM, "beam search: out of memory for the log-probs");
        }
        print_tokens(e, r.tokens, lps, tlps, r.n_tokens, o, j);
        free(lps);
        free(tlps);
        fprintf(stderr, "%sbeam search: %d beams, chose the beam of score %.4f (sum of log-probs %.4f over %d tokens, "
                "length penalty %g; %d finished hypotheses)\n", o->json ? "" : "\n", o->beams, r.score, r.logprob,
                r.n_tokens, (double)o->length_penalty, r.n_finished);
        *finish = r.finish;
        st->n_prompt = (int)n_prompt;
        beam_result_free(&r);
        return KV_OK;
    }
    decode_sample ds[DECODE_MAX_N];
    int n = o->best_of;
    int rc = decode_best_of(e, ENGINE_SEQ_DEFAULT, s, prompt, n_prompt, n, o->n_predict, o->json ? o->top_logprobs : 0,
                            ds, st, err);
    if (rc) return rc;
    print_tokens(e, ds[0].tokens, ds[0].lp, ds[0].tlp, ds[0].n, o, j);
    fprintf(stderr, "%sbest of %d: chose the sample of the highest mean log-prob %.4f (seed %llu); the others:",
            o->json ? "" : "\n", n, ds[0].mean_lp, (unsigned long long)ds[0].seed);
    for (int i = 1; i < n; i++) fprintf(stderr, " %.4f", ds[i].mean_lp);
    fprintf(stderr, "\n");
    *finish = ds[0].finish;
    decode_samples_free(ds, n);
    return KV_OK;
}

int decode_set_draft(spec_params *sp, int key, const char *value, const char *draft_path, char *msg, size_t cap)
{
    char norm[1100], why[600];
    if (config_check(key, value, norm, sizeof norm, why, sizeof why)) {
        snprintf(msg, cap, "/set %s: %s", config_key_name(key), why);
        return -1;
    }
    if (key == CFG_DRAFT_MAX) sp->draft_max = atoi(norm);
    else if (key == CFG_DRAFT_MIN_P) sp->draft_min_p = (float)atof(norm);
    else if (!strcmp(norm, "off")) sp->mode = SPEC_OFF;
    else if (!strcmp(norm, "lookup")) sp->mode = SPEC_LOOKUP;
    else if (sp->draft && (!strcmp(norm, "model") || (draft_path && !strcmp(norm, draft_path)))) sp->mode = SPEC_DRAFT;
    else {
        if (sp->draft) snprintf(msg, cap, "/set draft: off, lookup or model (the draft model %s loaded at start)",
                                draft_path ? draft_path : "");
        else snprintf(msg, cap, "/set draft: off or lookup (a draft model is loaded at start: --draft MODEL or draft = "
                                "MODEL in config.ini)");
        return -1;
    }
    char v[96];
    decode_draft_text(sp, key, v, sizeof v);
    snprintf(msg, cap, "%s = %s", config_key_name(key), v);
    return 0;
}

void decode_draft_text(const spec_params *sp, int key, char *buf, size_t cap)
{
    if (key == CFG_DRAFT_MAX) snprintf(buf, cap, "%d", sp->draft_max);
    else if (key == CFG_DRAFT_MIN_P) snprintf(buf, cap, "%.2f", (double)sp->draft_min_p);
    else snprintf(buf, cap, "%s", sp->mode == SPEC_DRAFT ? "model" : spec_mode_name(sp->mode));
}

int decode_parse_count(const char *cmd, const char *args, int *n, const char **rest, char *msg, size_t cap)
{
    char *end;
    long v = strtol(args, &end, 10);
    if (end == args || (*end && *end != ' ') || v < 2 || v > DECODE_MAX_N) {
        snprintf(msg, cap, "usage: %s N [MESSAGE] — N from 2 to %d (%s)", cmd, DECODE_MAX_N,
                 !strcmp(cmd, "/beams") ? "beams searched for one reply" : "samples of one reply, the best shown");
        return -1;
    }
    while (*end == ' ') end++;
    *n = (int)v;
    *rest = end;
    return 0;
}

long decode_add_siblings(conv_tree *t, long reply, const worker_candidate *cand, int n, int role, const char *author,
                         int (*finish_of)(int gen_finish))
{
    if (reply < 0 || (size_t)reply >= t->n) return -1;
    long parent = t->node[reply].parent, first = (long)t->n;
    for (int i = 1; i < n; i++) {
        long k = conv_add(t, parent, role, cand[i].text, cand[i].len);
        if (k < 0 || (author && conv_set_author(t, k, author))) return -1;
        t->node[k].finish = finish_of ? finish_of(cand[i].finish) : cand[i].finish;
    }
    return first;
}

void decode_candidates_note(const worker_candidate *cand, int n, int beams, float length_penalty, size_t first_branch,
                            size_t n_branches, char *buf, size_t cap)
{
    if (n < 1) {
        snprintf(buf, cap, "no candidates");
        return;
    }
    if (beams > 1) {
        snprintf(buf, cap, "beam search, %d beams: chose the beam of score %.4f (sum of log-probs %.4f over %d tokens, "
                 "length penalty %g)", beams, cand[0].score, cand[0].logprob, cand[0].n_tokens, (double)length_penalty);
        return;
    }
    size_t k = (size_t)snprintf(buf, cap, "best of %d, ranked by mean log-probability per token: this reply %.4f "
                                "(seed %llu)", n, cand[0].score, (unsigned long long)cand[0].seed);
    if (n > 1 && k < cap)
        k += (size_t)snprintf(buf + k, cap - k, "; the others, branches %zu-%zu/%zu (/branch N):", first_branch + 1,
                              first_branch + (size_t)n - 1, n_branches);
    for (int i = 1; i < n && k < cap; i++) k += (size_t)snprintf(buf + k, cap - k, " %.4f", cand[i].score);
}
