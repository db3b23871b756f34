/* output: what the one-shot mode writes to stdout — plain text with control bytes made harmless, or JSON lines (one object per token, then a final stats object). */
#include "app/output.h"

#include "ui/text.h"

#include <math.h>
#include <string.h>

void out_plain(FILE *f, const char *text, size_t len)
{
    char buf[3 * 1024];
    while (len > 0) {
        /* pieces of at most 1024 bytes, never cut inside a character or a CR LF */
        size_t n = len;
        if (n > 1024) {
            n = 1024;
            while (n > 1020 && (((unsigned char)text[n] & 0xC0) == 0x80 || (text[n] == '\n' && text[n - 1] == '\r')))
                n--;
        }
        size_t k = ui_neutralize(text, n, buf, sizeof buf);
        fwrite(buf, 1, k, f);
        text += n;
        len -= n;
    }
}

void plain_out_write(plain_out *p, const char *text, size_t len)
{
    if (p->cr) { /* the CR held back by the last call: half of a CR LF, or a lone one (␍) */
        p->cr = 0;
        if (!(len > 0 && text[0] == '\n')) out_plain(p->f, "\r", 1);
    }
    if (len > 0 && text[len - 1] == '\r') {
        p->cr = 1;
        len--;
    }
    out_plain(p->f, text, len);
}

void plain_out_flush(plain_out *p)
{
    if (p->cr) out_plain(p->f, "\r", 1);
    p->cr = 0;
}

/* Length of the valid UTF-8 sequence at s (n bytes available): 1-4, 0 if invalid, or -k if
 * the k available bytes are a valid but incomplete start of a sequence. */
static int utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    int need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;      /* no overlongs */
        if (c == 0xED) hi = 0x9F;      /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;      /* at most U+10FFFF */
    } else return 0;
    for (int k = 1; k < need; k++) {
        if ((size_t)k >= n) return -k;
        unsigned char b = s[k];
        if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
    }
    return need;
}

/* Escaped body of a JSON string (no quotes). Returns how many bytes at the end were left
 * unwritten because they start an incomplete character and `keep_tail` is set. */
static size_t write_escaped(FILE *f, const unsigned char *s, size_t len, int keep_tail)
{
    size_t i = 0;
    while (i < len) {
        unsigned char c = s[i];
        if (c >= 0x80) {
            int n = utf8_seq(s + i, len - i);
            if (n < 0 && keep_tail) return len - i;
            if (n <= 0) {
                fputs("\\ufffd", f);
                i++;
            } else if (n == 2 && c == 0xC2 && s[i + 1] < 0xA0) { /* C1 controls (U+009B CSI …) */
                fprintf(f, "\\u%04x", s[i + 1]);
                i += 2;
            } else {
                fwrite(s + i, 1, (size_t)n, f);
                i += (size_t)n;
            }
            continue;
        }
        switch (c) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        case '\b': fputs("\\b", f); break;
        case '\f': fputs("\\f", f); break;
        default:
            if (c < 0x20 || c == 0x7f) fprintf(f, "\\u%04x", c);
            else fputc(c, f);
        }
        i++;
    }
    return 0;
}

void json_write_string(FILE *f, const char *s, size_t len)
{
    fputc('"', f);
    write_escaped(f, (const unsigned char *)s, len, 0);
    fputc('"', f);
}

void json_out_init(json_out *j, FILE *f)
{
    memset(j, 0, sizeof *j);
    j->f = f;
}

void json_out_set_seed(json_out *j, uint64_t seed)
{
    j->has_seed = 1;
    j->seed = seed;
}

/* The fields after "text" of a token line, and its end. */
static void token_tail(json_out *j, const token_logprob *lp, int eog, const tokenizer *tok)
{
    if (eog) fputs(", \"eog\": true", j->f);
    if (lp) {
        fprintf(j->f, ", \"logprob\": %.6g", isfinite(lp->lp) ? lp->lp : -9999.0);
        if (lp->n_top > 0 || j->top_logprobs > 0) {
            fputs(", \"top_logprobs\": [", j->f);
            for (int k = 0; k < lp->n_top; k++) {
                char piece[256];
                size_t n = tok ? tokenizer_token_to_piece(tok, lp->top[k], 0, piece, sizeof piece) : 0;
                if (n > sizeof piece) n = sizeof piece;
                fprintf(j->f, "%s{\"token\": %d, \"text\": ", k ? ", " : "", (int)lp->top[k]);
                json_write_string(j->f, piece, n);
                fprintf(j->f, ", \"logprob\": %.6g}", isfinite(lp->top_lp[k]) ? lp->top_lp[k] : -9999.0);
            }
            fputc(']', j->f);
        }
    }
    fputs("}\n", j->f);
    fflush(j->f);
}

void json_out_token(json_out *j, int32_t token, const char *text, size_t len)
{
    json_out_token_lp(j, token, text, len, NULL, 0, NULL);
}

void json_out_token_lp(json_out *j, int32_t token, const char *text, size_t len, const token_logprob *lp, int eog,
                       const tokenizer *tk)
{
    fprintf(j->f, "{\"token\": %d, \"text\": \"", (int)token);
    /* the carried bytes and this text, as one string */
    unsigned char buf[512];
    const unsigned char *s = (const unsigned char *)text;
    size_t n_carry = j->n_carry;
    j->n_carry = 0;
    if (n_carry) {
        /* complete the carried character from the start of text */
        size_t take = len < sizeof buf - n_carry ? len : sizeof buf - n_carry;
        memcpy(buf, j->carry, n_carry);
        memcpy(buf + n_carry, s, take);
        int n = utf8_seq(buf, n_carry + take);
        if (n < 0) { /* still incomplete (all of text taken): carry it all on */
            memcpy(j->carry, buf, n_carry + take);
            j->n_carry = n_carry + take;
            fputc('"', j->f);
            token_tail(j, lp, eog, tk);
            return;
        }
        if (n > 0) { /* the character completed by text */
            write_escaped(j->f, buf, (size_t)n, 0);
            s += (size_t)n - n_carry;
            len -= (size_t)n - n_carry;
        } else { /* text does not continue it: the carried bytes are invalid */
            write_escaped(j->f, buf, n_carry, 0);
        }
    }
    size_t left = write_escaped(j->f, s, len, 1);
    if (left) {
        memcpy(j->carry, s + len - left, left);
        j->n_carry = left;
    }
    fputc('"', j->f);
    token_tail(j, lp, eog, tk);
}

const char *json_finish_name(int finish)
{
    switch (finish) {
    case GEN_FINISH_EOG: return "eog";
    case GEN_FINISH_LENGTH: return "length";
    case GEN_FINISH_CONTEXT: return "context";
    case GEN_FINISH_CANCELLED: return "cancelled";
    case GEN_FINISH_STOP: return "stop";
    case GEN_FINISH_ERROR: return "error";
    default: return gen_finish_name(finish);
    }
}

static void num(FILE *f, const char *key, double v)
{
    if (isfinite(v)) fprintf(f, ", \"%s\": %.3f", key, v);
    else fprintf(f, ", \"%s\": null", key);
}

void json_out_done(json_out *j, const gen_stats *st, int finish, const char *error)
{
    if (j->n_carry) {
        fputs("{\"token\": -1, \"text\": ", j->f);
        json_write_string(j->f, j->carry, j->n_carry);
        fputs("}\n", j->f);
        j->n_carry = 0;
    }
    fputs("{\"done\": true, \"finish\": ", j->f);
    const char *fn = json_finish_name(finish);
    json_write_string(j->f, fn, strlen(fn));
    if (st) {
        fprintf(j->f, ", \"n_prompt\": %d, \"n_reused\": %d, \"n_prefilled\": %d, \"n_generated\": %d", st->n_prompt,
                st->n_reused, st->n_prefilled, st->n_generated);
        num(j->f, "ttft_ms", st->ttft_ms);
        num(j->f, "prefill_tps", st->prefill_tps);
        num(j->f, "decode_tps", st->decode_tps);
        num(j->f, "itl_ms_mean", st->itl_ms_mean);
        num(j->f, "itl_ms_max", st->itl_ms_max);
        if (st->n_verify) /* speculative decoding */
            fprintf(j->f, ", \"n_drafted\": %d, \"n_accepted\": %d, \"n_verify\": %d, \"draft_stopped\": %s",
                    st->n_drafted, st->n_accepted, st->n_verify, st->draft_stopped ? "true" : "false");
    }
    if (j->has_seed) fprintf(j->f, ", \"seed\": \"%llu\"", (unsigned long long)j->seed);
    if (error) {
        fputs(", \"error\": ", j->f);
        json_write_string(j->f, error, strlen(error));
    }
    fputs("}\n", j->f);
    fflush(j->f);
}
