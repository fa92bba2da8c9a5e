/*
 * list.h — an intrusive circular doubly-linked list (libuv's QUEUE in spirit), used by net/ and
 * the daemon.
 *
 * A list head and a list node are the same struct; an empty list points at itself. The element
 * that holds a node is found with TS_CONTAINER_OF. Nothing here allocates.
 */
#ifndef TS_BASE_LIST_H
#define TS_BASE_LIST_H

#include <stddef.h>

#define TS_CONTAINER_OF(ptr, type, field) ((type *)(void *)((char *)(ptr)-offsetof(type, field)))

typedef struct ts_list {
    struct ts_list *prev, *next;
} ts_list_t;

static inline void ts_list_init(ts_list_t *h) { h->prev = h->next = h; }
static inline int ts_list_empty(const ts_list_t *h) { return h->next == h; }
/* Appends n at the end of the list h. */
static inline void ts_list_push(ts_list_t *h, ts_list_t *n) {
    n->prev = h->prev;
    n->next = h;
    h->prev->next = n;
    h->prev = n;
}
/* Inserts n before the node at. */
static inline void ts_list_insert_before(ts_list_t *at, ts_list_t *n) { ts_list_push(at, n); }
/* Unlinks n (which then forms an empty list of its own, so removing it twice is harmless). */
static inline void ts_list_remove(ts_list_t *n) {
    n->prev->next = n->next;
    n->next->prev = n->prev;
    ts_list_init(n);
}

#define TS_LIST_FOREACH(it, h) for (ts_list_t *it = (h)->next; it != (h); it = it->next)

#endif
