/* template_cmd: `kvchat template-render` — render a Jinja chat template (a file or a model's own) with a JSON context, as the chat would. */
#include "app/template_cmd.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/gguf.h"
#include "engine/jinja.h"
#include "engine/tokenizer.h"

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: kvchat template-render [-t TEMPLATE] [-m MODEL] [--now SECONDS] [--spans] CONTEXT.json\n"
            "Render a Jinja chat template with the variables of CONTEXT.json (a JSON object: messages,\n"
            "add_generation_prompt, bos_token, ...; '-' reads standard input) and print the text as is.\n"
            "  -t, --template FILE  the template text (else the model's tokenizer.chat_template)\n"
            "  -m, --model PATH     a GGUF whose vocabulary gives bos_token and eos_token when CONTEXT\n"
            "                       does not set them\n"
            "      --now SECONDS    the clock of strftime_now() (seconds since 1970, UTC; default: now)\n"
            "      --spans          print, instead of the text, the byte ranges that came from message\n"
            "                       contents as a JSON array of [start, length]\n");
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return NULL;
    size_t cap = 1 << 14, n = 0, r;
    char *buf = malloc(cap + 1);
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            char *nb = realloc(buf, (cap *= 2) + 1);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
        }
    }
    if (f != stdin) fclose(f);
    if (buf) buf[n] = 0;
    *len = n;
    return buf;
}

/* ctx with "bos_token"/"eos_token" added after its '{' when absent (and the vocab has them) */
static char *add_specials(char *ctx, size_t *len, const char *bos, const char *eos)
{
    char *out = NULL;
    size_t ol = 0;
    const char *brace = strchr(ctx, '{');
    if (!brace) return ctx;
    size_t head = (size_t)(brace - ctx) + 1;
    out = malloc(head + 1);
    if (!out) return ctx;
    memcpy(out, ctx, head);
    out[head] = 0;
    ol = head;
    const char *names[2] = { "bos_token", "eos_token" }, *vals[2] = { bos, eos };
    for (int i = 0; i < 2; i++) {
        char key[32];
        snprintf(key, sizeof key, "\"%s\"", names[i]);
        if (!vals[i] || strstr(ctx, key)) continue;
        char *no = realloc(out, ol + strlen(key) + 2);
        if (!no) break;
        out = no;
        ol += (size_t)sprintf(out + ol, "%s:", key);
        if (jinja_json_append_str(&out, &ol, vals[i], strlen(vals[i]))) break;
        no = realloc(out, ol + 2);
        if (!no) break;
        out = no;
        out[ol++] = ',';
        out[ol] = 0;
    }
    size_t rest = *len - head;
    /* an empty object: drop the trailing comma */
    const char *r = ctx + head;
    size_t k = 0;
    while (k < rest && (r[k] == ' ' || r[k] == '\n' || r[k] == '\t' || r[k] == '\r')) k++;
    if (k < rest && r[k] == '}' && ol > head && out[ol - 1] == ',') ol--;
    char *no = realloc(out, ol + rest + 1);
    if (!no) {
        free(out);
        return ctx;
    }
    out = no;
    memcpy(out + ol, r, rest);
    ol += rest;
    out[ol] = 0;
    free(ctx);
    *len = ol;
    return out;
}

int template_main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"template", required_argument, 0, 't'}, {"model", required_argument, 0, 'm'},
        {"now", required_argument, 0, 'n'},      {"spans", no_argument, 0, 's'},
        {"help", no_argument, 0, 'h'},           {0, 0, 0, 0},
    };
    const char *tpath = NULL, *model = NULL;
    long long now = (long long)time(NULL);
    int spans = 0, o;
    optind = 1;
    opterr = 0;
    while ((o = getopt_long(argc, argv, ":t:m:h", opts, NULL)) != -1) {
        switch (o) {
        case 't': tpath = optarg; break;
        case 'm': model = optarg; break;
        case 'n': now = strtoll(optarg, NULL, 10); break;
        case 's': spans = 1; break;
        case 'h': usage(stdout); return 0;
        default:
            fprintf(stderr, "kvchat template-render: %s '%s'\nTry 'kvchat template-render --help'.\n",
                    o == ':' ? "missing value for" : "unknown option", argv[optind - 1]);
            return 2;
        }
    }
    if ((!tpath && !model) || optind != argc - 1) {
        usage(stderr);
        return 2;
    }
    size_t clen = 0, tlen = 0;
    char *ctx = slurp(argv[optind], &clen), *text = NULL;
    if (!ctx) {
        fprintf(stderr, "kvchat template-render: cannot read %s\n", argv[optind]);
        return 3;
    }
    kv_error err = {0};
    if (tpath && !(text = slurp(tpath, &tlen))) {
        fprintf(stderr, "kvchat template-render: cannot read %s\n", tpath);
        free(ctx);
        return 3;
    }
    if (model) {
        gguf_file *f = NULL;
        tokenizer *tk = NULL;
        if (gguf_open(model, &f, &err) || (!text && gguf_get_str(f, "tokenizer.chat_template", 1, &text, &err)) ||
            tokenizer_load(f, &tk, &err)) {
            fprintf(stderr, "kvchat: %s\n", err.msg);
            free(text);
            tokenizer_free(tk);
            gguf_close(f);
            free(ctx);
            return 3;
        }
        if (!tpath) tlen = strlen(text);
        int32_t b = tokenizer_bos(tk), e = tokenizer_eos(tk);
        ctx = add_specials(ctx, &clen, b >= 0 ? tokenizer_token_text(tk, b) : NULL, e >= 0 ? tokenizer_token_text(tk, e) : NULL);
        tokenizer_free(tk);
        gguf_close(f);
    }
    jinja_template *t = NULL;
    char *out = NULL;
    unsigned char *mask = NULL;
    size_t olen = 0;
    int rc = 1;
    if (jinja_parse(text, tlen, &t, &err) || jinja_render(t, ctx, clen, now, &out, &olen, &mask, &err)) {
        fprintf(stderr, "kvchat: %s\n", err.msg);
        goto done;
    }
    if (spans) {
        int first = 1;
        putchar('[');
        for (size_t i = 0; i < olen;) {
            if (!mask[i]) { i++; continue; }
            size_t j = i;
            while (j < olen && mask[j]) j++;
            printf("%s[%zu, %zu]", first ? "" : ", ", i, j - i);
            first = 0;
            i = j;
        }
        puts("]");
    } else {
        fwrite(out, 1, olen, stdout);
    }
    rc = 0;
done:
    jinja_free(t);
    free(out);
    free(mask);
    free(text);
    free(ctx);
    return rc;
}
