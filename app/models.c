/* models: the models directory ($XDG_DATA_HOME/kvchat/models) — `-m NAME` lookup, `kvchat models`, `kvchat themes`, and the message shown when no model is given. */
#include "app/models.h"

#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "app/output.h"
#include "engine/gguf.h"
#include "engine/kernels/quant.h"
#include "engine/model.h"
#include "ui/theme.h"

int models_dir(char *buf, size_t cap)
{
    const char *xdg = getenv("XDG_DATA_HOME"), *home = getenv("HOME");
    if (xdg && *xdg == '/') snprintf(buf, cap, "%s/kvchat/models", xdg);
    else if (home && *home) snprintf(buf, cap, "%s/.local/share/kvchat/models", home);
    else {
        if (cap) buf[0] = 0;
        return -1;
    }
    return 0;
}

static int is_file(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

int models_resolve(const char *name, char *out, size_t cap)
{
    if (access(name, F_OK) == 0 || strchr(name, '/')) {
        snprintf(out, cap, "%s", name);
        return 0;
    }
    char dir[512];
    if (models_dir(dir, sizeof dir) == 0) {
        snprintf(out, cap, "%s/%s", dir, name);
        if (is_file(out)) return 1;
        snprintf(out, cap, "%s/%s.gguf", dir, name);
        if (is_file(out)) return 1;
        snprintf(out, cap, "no model '%s': not a file here, nor %s.gguf in %s (kvchat models lists them)", name, name,
                 dir);
    } else {
        snprintf(out, cap, "no model '%s': no such file", name);
    }
    return -1;
}

void models_print_no_model(FILE *out)
{
    char dir[512];
    if (models_dir(dir, sizeof dir)) snprintf(dir, sizeof dir, "~/.local/share/kvchat/models");
    fprintf(out,
            "kvchat: no model given. Name one with -m MODEL (a .gguf file, or a name in the models directory),\n"
            "the KVCHAT_MODEL environment variable, or 'model = ...' in the config file.\n"
            "\n"
            "To get a model: download a GGUF file of a supported architecture (" MODEL_ARCHS "),\n"
            "e.g. a Q4_K_M or Q8_0 quantization of TinyLlama, Llama 3.2 1B, SmolLM2 or Qwen2.5 0.5B, from\n"
            "Hugging Face (search for the model name plus \"GGUF\"). Put it in\n"
            "    %s/\n"
            "then run 'kvchat -m NAME' (the file name without .gguf); 'kvchat models' lists that directory.\n"
            "To try kvchat without a download: 'kvchat gen-model --shape tiny --type q8_0 -o tiny.gguf'\n"
            "writes a small model with random weights (it babbles).\n",
            dir);
}

/* ---- kvchat models -------------------------------------------------------------------------- */

/* llama.cpp's general.file_type values (LLAMA_FTYPE_*), as its file names spell them. */
static const char *ftype_name(uint32_t t)
{
    static const char *const names[] = {
        [0] = "F32",      [1] = "F16",      [2] = "Q4_0",    [3] = "Q4_1",     [7] = "Q8_0",    [8] = "Q5_0",
        [9] = "Q5_1",     [10] = "Q2_K",    [11] = "Q3_K_S", [12] = "Q3_K_M",  [13] = "Q3_K_L", [14] = "Q4_K_S",
        [15] = "Q4_K_M",  [16] = "Q5_K_S",  [17] = "Q5_K_M", [18] = "Q6_K",    [19] = "IQ2_XXS", [20] = "IQ2_XS",
        [21] = "Q2_K_S",  [22] = "IQ3_XS",  [23] = "IQ3_XXS", [24] = "IQ1_S",  [25] = "IQ4_NL", [26] = "IQ3_S",
        [27] = "IQ3_M",   [28] = "IQ2_S",   [29] = "IQ2_M",  [30] = "IQ4_XS",  [31] = "IQ1_M",  [32] = "BF16",
        [36] = "TQ1_0",   [37] = "TQ2_0",
    };
    return t < sizeof names / sizeof names[0] ? names[t] : NULL;
}

typedef struct model_info {
    char name[256];
    char path[1024];
    uint64_t size;
    char arch[64], type[32], title[128];
    uint64_t n_params, n_params_active; /* active: less the experts a token does not select (MoE) */
    int64_t n_ctx;
    char error[512]; /* "" when the header was read */
} model_info;

static void read_info(model_info *mi)
{
    kv_error err = {0};
    gguf_file *f = NULL;
    if (gguf_open(mi->path, &f, &err)) {
        const char *m = err.msg;
        size_t pl = strlen(mi->path);
        if (!strncmp(m, mi->path, pl) && m[pl] == ':') m += pl + 1 + (m[pl + 1] == ' ');
        snprintf(mi->error, sizeof mi->error, "%s", m);
        return;
    }
    char *s = NULL;
    if (gguf_get_str(f, "general.architecture", 0, &s, &err) == 0 && s) snprintf(mi->arch, sizeof mi->arch, "%s", s);
    free(s);
    s = NULL;
    if (gguf_get_str(f, "general.name", 0, &s, &err) == 0 && s) snprintf(mi->title, sizeof mi->title, "%s", s);
    free(s);
    uint32_t ft = UINT32_MAX;
    const char *tn = NULL;
    if (gguf_get_u32(f, "general.file_type", 0, &ft, &err) == 0 && ft != UINT32_MAX) tn = ftype_name(ft);
    /* the most common 2-D weight type otherwise, as model.c names a model's type */
    int counts[GGML_TYPE_COUNT] = {0}, best = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        mi->n_params += (uint64_t)t->n_elements;
        if (t->n_dims == 2 && t->type >= 0 && t->type < GGML_TYPE_COUNT) counts[t->type]++;
    }
    for (int t = 0; t < GGML_TYPE_COUNT; t++)
        if (counts[t] > counts[best]) best = t;
    if (!tn && f->n_tensors) tn = quant_traits_of(best) ? quant_traits_of(best)->name : NULL;
    snprintf(mi->type, sizeof mi->type, "%s", tn ? tn : "?");
    mi->n_ctx = -1;
    mi->n_params_active = mi->n_params;
    if (*mi->arch) {
        /* MoE: of each 3-D expert tensor a token uses expert_used_count of expert_count */
        char key[128];
        int64_t nx = 0, nk = 0;
        snprintf(key, sizeof key, "%s.expert_count", mi->arch);
        gguf_get_i64(f, key, 0, &nx, &err);
        snprintf(key, sizeof key, "%s.expert_used_count", mi->arch);
        gguf_get_i64(f, key, 0, &nk, &err);
        for (uint64_t i = 0; nx > 0 && nk > 0 && nk <= nx && i < f->n_tensors; i++) {
            const gguf_tensor *t = &f->tensors[i];
            if (t->n_dims == 3 && t->ne[2] == nx && strstr(t->name, "_exps."))
                mi->n_params_active -= (uint64_t)t->n_elements / (uint64_t)nx * (uint64_t)(nx - nk);
        }
    }
    if (*mi->arch) {
        char key[128];
        snprintf(key, sizeof key, "%s.context_length", mi->arch);
        gguf_get_i64(f, key, 0, &mi->n_ctx, &err);
    }
    gguf_close(f);
}

static void human_size(uint64_t b, char *out, size_t cap)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int i = 0;
    while (v >= 1000 && i < 4) v /= 1024, i++;
    if (i == 0) snprintf(out, cap, "%llu B", (unsigned long long)b);
    else snprintf(out, cap, "%.*f %s", v < 10 ? 1 : 0, v, u[i]);
}

static void human_count(uint64_t n, char *out, size_t cap)
{
    const char *u[] = {"", "K", "M", "B", "T"};
    double v = (double)n;
    int i = 0;
    while (v >= 1000 && i < 4) v /= 1000, i++;
    if (i == 0) snprintf(out, cap, "%llu", (unsigned long long)n);
    else snprintf(out, cap, "%.*f%s", v < 10 ? 1 : 0, v, u[i]);
}

static int cmp_info(const void *a, const void *b)
{
    return strcmp(((const model_info *)a)->name, ((const model_info *)b)->name);
}

static void json_kv_str(FILE *f, const char *key, const char *v, int first)
{
    fprintf(f, "%s\"%s\": ", first ? "" : ", ", key);
    json_write_string(f, v, strlen(v));
}

int models_main(int argc, char **argv)
{
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("Usage: kvchat models [--json]\n"
                   "List the GGUF models in the models directory ($XDG_DATA_HOME/kvchat/models, default\n"
                   "~/.local/share/kvchat/models): name (what -m accepts), file size, parameters,\n"
                   "architecture, weight type and context length, read from each file's header.\n"
                   "  --json   one JSON object per model\n");
            return 0;
        } else {
            fprintf(stderr, "kvchat models: unknown argument '%s'\nTry 'kvchat models --help' for more information.\n",
                    argv[i]);
            return 2;
        }
    }
    char dir[512];
    if (models_dir(dir, sizeof dir)) {
        fprintf(stderr, "kvchat models: neither XDG_DATA_HOME nor HOME is set\n");
        return 1;
    }
    DIR *d = opendir(dir);
    model_info *list = NULL;
    size_t n = 0, cap = 0;
    if (d) {
        struct dirent *de;
        while ((de = readdir(d))) {
            size_t l = strlen(de->d_name);
            if (l <= 5 || strcmp(de->d_name + l - 5, ".gguf") || de->d_name[0] == '.') continue;
            if (n == cap) {
                size_t nc = cap ? cap * 2 : 16;
                model_info *nl = realloc(list, nc * sizeof *nl);
                if (!nl) break;
                list = nl, cap = nc;
            }
            model_info *mi = &list[n];
            memset(mi, 0, sizeof *mi);
            snprintf(mi->name, sizeof mi->name, "%.*s", (int)(l - 5), de->d_name);
            snprintf(mi->path, sizeof mi->path, "%s/%s", dir, de->d_name);
            struct stat st;
            if (stat(mi->path, &st) || !S_ISREG(st.st_mode)) continue;
            mi->size = (uint64_t)st.st_size;
            n++;
        }
        closedir(d);
    }
    qsort(list, n, sizeof *list, cmp_info);
    for (size_t i = 0; i < n; i++) read_info(&list[i]);
    if (json) {
        for (size_t i = 0; i < n; i++) {
            model_info *mi = &list[i];
            fputc('{', stdout);
            json_kv_str(stdout, "name", mi->name, 1);
            json_kv_str(stdout, "path", mi->path, 0);
            printf(", \"size\": %llu", (unsigned long long)mi->size);
            if (*mi->error) json_kv_str(stdout, "error", mi->error, 0);
            else {
                json_kv_str(stdout, "architecture", mi->arch, 0);
                json_kv_str(stdout, "type", mi->type, 0);
                printf(", \"n_params\": %llu, \"n_params_active\": %llu, \"n_ctx_train\": %lld",
                       (unsigned long long)mi->n_params, (unsigned long long)mi->n_params_active, (long long)mi->n_ctx);
                json_kv_str(stdout, "title", mi->title, 0);
            }
            printf("}\n");
        }
        free(list);
        return 0;
    }
    if (!n) {
        printf("No models in %s%s.\n", dir, d ? "" : " (it does not exist yet)");
        printf("Put GGUF files there (mkdir -p '%s'); 'kvchat -m NAME' then finds NAME.gguf.\n", dir);
        free(list);
        return 0;
    }
    printf("Models in %s:\n", dir);
    int wn = 4;
    for (size_t i = 0; i < n; i++) {
        int l = (int)strlen(list[i].name);
        if (l > wn) wn = l;
    }
    if (wn > 48) wn = 48;
    printf("%-*s  %9s  %7s  %-8s  %-7s  %7s\n", wn, "NAME", "SIZE", "PARAMS", "ARCH", "TYPE", "CONTEXT");
    for (size_t i = 0; i < n; i++) {
        model_info *mi = &list[i];
        char sz[32], np[72];
        human_size(mi->size, sz, sizeof sz);
        if (*mi->error) {
            printf("%-*s  %9s  error: ", wn, mi->name, sz);
            out_plain(stdout, mi->error, strlen(mi->error));
            printf("\n");
            continue;
        }
        human_count(mi->n_params, np, sizeof np);
        if (mi->n_params_active != mi->n_params) { /* MoE: total/active */
            size_t l = strlen(np);
            np[l++] = '/';
            human_count(mi->n_params_active, np + l, sizeof np - l);
        }
        printf("%-*s  %9s  %7s  %-8s  %-7s  %7lld\n", wn, mi->name, sz, np, *mi->arch ? mi->arch : "?", mi->type,
               (long long)mi->n_ctx);
    }
    free(list);
    return 0;
}

/* ---- kvchat themes -------------------------------------------------------------------------- */

int themes_main(int argc, char **argv)
{
    if (argc > 1) {
        if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
            printf("Usage: kvchat themes\n"
                   "List the colour themes --theme and /theme accept: NAME, a tab, and the file it is read from\n"
                   "(\"built in\" for default and mono when no file is found). kvchat-theme(5) describes the format.\n");
            return 0;
        }
        fprintf(stderr, "kvchat themes: unknown argument '%s'\nTry 'kvchat themes --help' for more information.\n",
                argv[1]);
        return 2;
    }
    char *names[256];
    int n = ui_theme_names(names, 256);
    char dirs[4][512];
    int nd = ui_theme_dirs(dirs, 4);
    for (int i = 0; i < n; i++) {
        const char *where = "built in";
        char path[700];
        for (int k = 0; k < nd; k++) {
            snprintf(path, sizeof path, "%.500s/%.60s.theme", dirs[k], names[i]);
            if (access(path, R_OK) == 0) {
                where = path;
                break;
            }
        }
        printf("%s\t%s\n", names[i], where);
        free(names[i]);
    }
    return 0;
}
