/* conv_tree: a conversation as a tree of messages (edits and regenerated replies are sibling branches) and the path of it the screen shows. */
#include "app/conv_tree.h"

#include <stdlib.h>
#include <string.h>

int conv_text_append(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t nc = *cap ? *cap : 256;
        while (nc < *len + n + 1) nc *= 2;
        char *nb = realloc(*buf, nc);
        if (!nb) return -1;
        *buf = nb;
        *cap = nc;
    }
    if (n) memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = 0;
    return 0;
}

long conv_add(conv_tree *t, long parent, int role, const char *text, size_t len)
{
    if (parent < -1 || parent >= (long)t->n) return -1;
    if (t->n == t->cap) {
        size_t nc = t->cap ? t->cap * 2 : 16;
        conv_node *nn = realloc(t->node, nc * sizeof *nn);
        if (!nn) return -1;
        t->node = nn;
        t->cap = nc;
    }
    conv_node *d = &t->node[t->n];
    memset(d, 0, sizeof *d);
    d->role = role;
    d->parent = parent;
    if (conv_text_append(&d->text, &d->len, &d->cap, text, len)) return -1;
    return (long)t->n++;
}

int conv_path_push(conv_tree *t, long k)
{
    if (t->n_path == t->cap_path) {
        size_t nc = t->cap_path ? t->cap_path * 2 : 16;
        long *np = realloc(t->path, nc * sizeof *np);
        if (!np) return -1;
        t->path = np;
        t->cap_path = nc;
    }
    t->path[t->n_path++] = k;
    return 0;
}

conv_node *conv_append(conv_tree *t, int role, const char *text, size_t len)
{
    long parent = t->n_path ? t->path[t->n_path - 1] : -1;
    long k = conv_add(t, parent, role, text, len);
    if (k < 0) return NULL;
    if (conv_path_push(t, k)) {
        free(t->node[k].text);
        t->n--;
        return NULL;
    }
    return &t->node[k];
}

conv_node *conv_at(const conv_tree *t, size_t i) { return &t->node[t->path[i]]; }

long conv_path_pop(conv_tree *t) { return t->n_path ? t->path[--t->n_path] : -1; }

int conv_drop_newest(conv_tree *t, long k)
{
    if (k < 0 || (size_t)k != t->n - 1 || t->node[k].id) return 0;
    for (size_t i = 0; i < t->n_path; i++)
        if (t->path[i] == k) return 0;
    --t->n;
    free(t->node[t->n].text);
    free(t->node[t->n].author);
    return 1;
}

int conv_set_author(conv_tree *t, long k, const char *author)
{
    char *a = NULL;
    if (author && !(a = strdup(author))) return -1;
    free(t->node[k].author);
    t->node[k].author = a;
    return 0;
}

void conv_clear(conv_tree *t)
{
    for (size_t i = 0; i < t->n; i++) free(t->node[i].text), free(t->node[i].author);
    t->n = 0;
    t->n_path = 0;
}

void conv_free(conv_tree *t)
{
    conv_clear(t);
    free(t->node);
    free(t->path);
    memset(t, 0, sizeof *t);
}

size_t conv_slot_of(const conv_tree *t, long k) { return t->node[k].parent < 0 ? t->n : (size_t)t->node[k].parent; }

size_t *conv_sibling_ranks(const conv_tree *t, size_t **count)
{
    size_t *rank = malloc((t->n ? t->n : 1) * sizeof *rank);
    *count = calloc(t->n + 1, sizeof **count);
    if (!rank || !*count) {
        free(rank);
        free(*count);
        *count = NULL;
        return NULL;
    }
    for (size_t i = 0; i < t->n; i++) rank[i] = ++(*count)[conv_slot_of(t, (long)i)];
    return rank;
}

long conv_sibling(const conv_tree *t, long k, size_t want)
{
    size_t seen = 0;
    for (size_t i = 0; i < t->n; i++)
        if (t->node[i].parent == t->node[k].parent && ++seen == want) return (long)i;
    return -1;
}

int conv_show_branch(conv_tree *t, size_t p, long target)
{
    if (p > t->n_path || target < 0 || (size_t)target >= t->n) return -1;
    if (t->node[target].parent != (p ? t->path[p - 1] : -1)) return -1;
    long *latest = malloc((t->n ? t->n : 1) * sizeof *latest);
    if (!latest) return -1;
    for (size_t i = 0; i < t->n; i++) latest[i] = -1;
    for (size_t i = 0; i < t->n; i++)
        if (t->node[i].parent >= 0) latest[t->node[i].parent] = (long)i;
    t->n_path = p;
    int rc = 0;
    for (long k = target; k >= 0 && rc == 0; k = latest[k]) rc = conv_path_push(t, k);
    free(latest);
    return rc;
}

long conv_find_id(const conv_tree *t, int64_t id)
{
    long lo = 0, hi = (long)t->n;
    while (lo < hi) {
        long mid = lo + (hi - lo) / 2;
        if (t->node[mid].id < id) lo = mid + 1;
        else hi = mid;
    }
    return id && lo < (long)t->n && t->node[lo].id == id ? lo : -1;
}

long conv_role_before(const conv_tree *t, int role, size_t before)
{
    for (size_t i = before < t->n_path ? before : t->n_path; i-- > 0;)
        if (conv_at(t, i)->role == role) return (long)i;
    return -1;
}

long conv_role_after(const conv_tree *t, int role, size_t after)
{
    for (size_t i = after + 1; i < t->n_path; i++)
        if (conv_at(t, i)->role == role) return (long)i;
    return -1;
}
