/* conv_tree: a conversation as a tree of messages (edits and regenerated replies are sibling branches) and the path of it the screen shows. */
#ifndef APP_CONV_TREE_H
#define APP_CONV_TREE_H

#include <stddef.h>
#include <stdint.h>

/*
 * Nodes are kept in creation order, so a parent always comes before its children (a stored
 * conversation is loaded in id order, which keeps this). Messages that follow the same message
 * (the same parent, or none: first messages) are siblings — branches of each other. The path is
 * the branch shown: node indices from a first message on, each the child of the one before.
 * No UI here: `view` is an opaque pointer the controller attaches (its pane message).
 */

struct ui_msg;

typedef struct conv_node {
    int role;            /* the controller's role code (app/chat.c: UI_ROLE_USER, _ASSISTANT) */
    char *text;          /* raw bytes as the model saw / wrote them, NUL-terminated */
    size_t len, cap;
    struct ui_msg *view; /* its pane message while on the shown path, else NULL */
    int64_t id;          /* its row in the store (0: not saved) */
    long parent;         /* index of the message it follows; -1: a first message */
    int finish;          /* a finished reply's enum store_finish; 0 */
    int unreadable;      /* a stored row that could not be read */
    char *author;        /* a reply's model name as shown (malloc'd, conv_set_author); NULL: the
                            controller's current model */
} conv_node;

typedef struct conv_tree {
    conv_node *node;
    size_t n, cap;
    long *path;          /* the shown branch */
    size_t n_path, cap_path;
} conv_tree;

/* Append s[0..n) to a growing NUL-terminated buffer. 0, or -1 (out of memory; unchanged). */
int conv_text_append(char **buf, size_t *len, size_t *cap, const char *s, size_t n);

/* A new node after parent (-1: a first message) holding a copy of text. Returns its index, or
 * -1 (out of memory, or parent not an existing node). The path is not changed. */
long conv_add(conv_tree *t, long parent, int role, const char *text, size_t len);

/* Put node k at the end of the path. 0, or -1 (out of memory). */
int conv_path_push(conv_tree *t, long k);

/* A new node after the path's last one, pushed on the path; NULL when out of memory. */
conv_node *conv_append(conv_tree *t, int role, const char *text, size_t len);

/* The i-th node of the path (i < n_path; valid until the tree grows). */
conv_node *conv_at(const conv_tree *t, size_t i);

/* Take the last node off the path (it stays in the tree as a branch). Returns its index, or -1
 * when the path is empty. */
long conv_path_pop(conv_tree *t);

/* Remove node k from the tree if it is the newest node and has no store id (an empty reply that
 * failed); it must not be on the path. Returns 1 if removed. */
int conv_drop_newest(conv_tree *t, long k);

/* Set node k's author (copied; NULL clears it). 0, or -1 (out of memory; unchanged). */
int conv_set_author(conv_tree *t, long k, const char *author);

/* Empty the tree and the path (the texts are freed; views are the caller's). */
void conv_clear(conv_tree *t);
void conv_free(conv_tree *t);

/* The sibling group of node k: its parent's index, or t->n for first messages. */
size_t conv_slot_of(const conv_tree *t, long k);

/* For every node its 1-based rank among its siblings (rank[i], creation order) and the size of
 * every sibling group (count[slot], slot = conv_slot_of). One pass, O(n). Returns rank and sets
 * *count (both malloc'd, the caller frees), or NULL (out of memory). */
size_t *conv_sibling_ranks(const conv_tree *t, size_t **count);

/* The want-th (1-based) sibling of node k, or -1. */
long conv_sibling(const conv_tree *t, long k, size_t want);

/* Make the path its first p nodes, then target (a node whose parent is path[p - 1], or a first
 * message for p = 0), then target's newest continuation: the newest child at every step.
 * 0, or -1 (out of memory, or target does not follow path[p - 1]; the path is then unchanged). */
int conv_show_branch(conv_tree *t, size_t p, long target);

/* The node with store id `id` (ids ascend with the index, as when loaded from the store), or -1.
 * Binary search. */
long conv_find_id(const conv_tree *t, int64_t id);

/* The path position of the last node of `role` before position `before`, or -1; and of the
 * first one after position `after`, or -1. */
long conv_role_before(const conv_tree *t, int role, size_t before);
long conv_role_after(const conv_tree *t, int role, size_t after);

#endif
