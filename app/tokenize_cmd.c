/* tokenize_cmd: `kvchat tokenize` — show how a model's tokenizer splits a text (ids and pieces). */
#include "app/tokenize_cmd.h"
#include "app/models.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/gguf.h"
#include "engine/tokenizer.h"

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: kvchat tokenize -m MODEL [--ids] [--no-bos] [--parse-special] [TEXT]\n"
            "Print the tokens of TEXT (or of standard input) for MODEL's tokenizer: one line per\n"
            "token with its id and piece (bytes that are not printable shown as \\xNN), or with\n"
            "--ids a JSON array of ids. Only the tokenizer is read, so vocab-only GGUF files work.\n"
            "  -m, --model PATH      GGUF file\n"
            "      --ids             print the ids as a JSON array\n"
            "      --no-bos          do not add the BOS token the model asks for\n"
            "      --parse-special   turn control-token text such as <|im_end|> into those tokens\n");
}

/* A piece as one safe line: printable ASCII and UTF-8 as is, other bytes as \xNN. */
static void print_piece(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '\\') fputs("\\\\", stdout);
        else if (c < 0x20 || c == 0x7f) printf("\\x%02x", c);
        else putchar(c);
    }
}

static char *slurp_stdin(size_t *len)
{
    size_t cap = 1 << 16, n = 0, r;
    char *buf = malloc(cap);
    while (buf && (r = fread(buf + n, 1, cap - n, stdin)) > 0) {
        n += r;
        if (n == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) { free(buf); return NULL; }
            buf = nb;
        }
    }
    *len = n;
    return buf;
}

int tokenize_main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"ids", no_argument, 0, 'i'},
        {"no-bos", no_argument, 0, 'b'},      {"parse-special", no_argument, 0, 's'},
        {"help", no_argument, 0, 'h'},        {0, 0, 0, 0},
    };
    const char *model = getenv("KVCHAT_MODEL");
    int ids = 0, no_bos = 0, special = 0, o;
    optind = 1;
    opterr = 0;
    while ((o = getopt_long(argc, argv, ":m:h", opts, NULL)) != -1) {
        switch (o) {
        case 'm': model = optarg; break;
        case 'i': ids = 1; break;
        case 'b': no_bos = 1; break;
        case 's': special = 1; break;
        case 'h': usage(stdout); return 0;
        default:
            fprintf(stderr, "kvchat tokenize: %s '%s'\nTry 'kvchat tokenize --help'.\n",
                    o == ':' ? "missing value for" : "unknown option", argv[optind - 1]);
            return 2;
        }
    }
    if (!model) {
        fprintf(stderr, "kvchat tokenize: no model given (-m MODEL)\n");
        return 2;
    }
    static char resolved[4096]; /* -m NAME: the models directory, as everywhere (app/models.c) */
    int found = models_resolve(model, resolved, sizeof resolved);
    if (found < 0) {
        fprintf(stderr, "kvchat tokenize: %s\n", resolved);
        return 3;
    }
    if (found > 0) model = resolved;
    if (optind < argc - 1) {
        fprintf(stderr, "kvchat tokenize: give the text as one argument (quote it)\n");
        return 2;
    }
    char *text;
    size_t len;
    if (optind == argc - 1) {
        text = strdup(argv[optind]);
        len = strlen(argv[optind]);
    } else if (!isatty(STDIN_FILENO)) {
        text = slurp_stdin(&len);
    } else {
        fprintf(stderr, "kvchat tokenize: no text given\n");
        return 2;
    }
    if (!text) {
        fprintf(stderr, "kvchat tokenize: out of memory\n");
        return 1;
    }
    kv_error err = {0};
    gguf_file *f = NULL;
    tokenizer *t = NULL;
    int32_t *toks = NULL;
    size_t n = 0;
    int rc = 3;
    if (gguf_open(model, &f, &err) || tokenizer_load(f, &t, &err)) {
        fprintf(stderr, "kvchat: %s\n", err.msg);
        goto out;
    }
    if (tokenizer_warning(t)) fprintf(stderr, "kvchat: warning: %s\n", tokenizer_warning(t));
    rc = 1;
    if (tokenizer_encode(t, text, len, !no_bos && tokenizer_add_bos(t), special, &toks, &n, &err)) {
        fprintf(stderr, "kvchat: %s\n", err.msg);
        goto out;
    }
    if (ids) {
        putchar('[');
        for (size_t i = 0; i < n; i++) printf("%s%d", i ? ", " : "", toks[i]);
        puts("]");
    } else {
        size_t cap = tokenizer_max_piece_len(t) + 1;
        char *piece = malloc(cap);
        for (size_t i = 0; piece && i < n; i++) {
            size_t pl = tokenizer_token_to_piece(t, toks[i], 1, piece, cap);
            printf("%6d  '", toks[i]);
            print_piece(piece, pl < cap ? pl : cap);
            printf("'\n");
        }
        free(piece);
    }
    rc = 0;
out:
    free(toks);
    tokenizer_free(t);
    gguf_close(f);
    free(text);
    return rc;
}
