/*
 * ckpt.c — training checkpoints in the `ckpt` database (see ckpt.h).
 *
 * Keys are run id ‖ 0x00 ‖ big-endian step, so a prefix walk over "run id ‖ 0x00" visits one
 * run's checkpoints in step order. A save is one write function: reserve the value (MDB_RESERVE,
 * so a 100 MB blob is copied once, straight into the map), walk the run's keys, delete the
 * superseded and the surplus ones. The function is restartable — it keeps its list of steps in
 * its context and clears it at the start — because ts_store_write runs it again after growing
 * the map.
 */
#include "store/ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEY_MAX (TS_CKPT_RUN_MAX + 1 + 8)

static int run_len(const char *run_id, size_t *n) {
    if (!run_id)
        return TS_EINVAL;
    size_t len = strlen(run_id);
    if (len == 0 || len > TS_CKPT_RUN_MAX)
        return TS_EINVAL;
    *n = len;
    return TS_OK;
}

/* run ‖ 0 ‖ be64(step) into key; returns the key's length. */
static size_t make_key(unsigned char *key, const char *run, size_t rlen, int64_t step) {
    memcpy(key, run, rlen);
    key[rlen] = 0;
    uint64_t u = (uint64_t)step;
    for (int i = 0; i < 8; i++)
        key[rlen + 1 + i] = (unsigned char)(u >> (56 - 8 * i));
    return rlen + 9;
}

/* Splits a key into run id (rlen bytes at key) and step; TS_ECORRUPT when it does not parse. */
static int split_key(const unsigned char *key, size_t klen, size_t *rlen, int64_t *step) {
    if (klen < 10 || klen > KEY_MAX)
        return TS_ECORRUPT;
    size_t r = klen - 9;
    if (key[r] != 0 || memchr(key, 0, r) != NULL)
        return TS_ECORRUPT;
    uint64_t u = 0;
    for (int i = 0; i < 8; i++)
        u = (u << 8) | key[r + 1 + i];
    if (u > (uint64_t)INT64_MAX)
        return TS_ECORRUPT;
    *rlen = r;
    *step = (int64_t)u;
    return TS_OK;
}

/* ---- steps of one run ------------------------------------------------------------------- */

typedef struct {
    int64_t *v;
    size_t n, cap;
} steps_t;

static int steps_add(void *ctx, const void *key, size_t klen, const void *val, size_t vlen) {
    steps_t *st = ctx;
    (void)val, (void)vlen;
    size_t rlen;
    int64_t step;
    if (split_key(key, klen, &rlen, &step) != TS_OK)
        return TS_ECORRUPT;
    if (st->n == st->cap) {
        size_t cap = st->cap ? 2 * st->cap : 16;
        int64_t *v = realloc(st->v, cap * sizeof *v);
        if (!v)
            return TS_ENOMEM;
        st->v = v;
        st->cap = cap;
    }
    st->v[st->n++] = step;
    return TS_OK;
}

/* ---- save ------------------------------------------------------------------------------- */

typedef struct {
    const char *run;
    size_t rlen;
    int64_t step;
    const void *blob;
    size_t len;
    int keep;
    steps_t steps; /* the run's steps, collected afresh on every run of save_fn */
} save_t;

static int save_fn(void *ctx, ts_store_txn_t *txn) {
    save_t *sv = ctx;
    unsigned char key[KEY_MAX], prefix[KEY_MAX];
    size_t plen = make_key(prefix, sv->run, sv->rlen, 0) - 8;
    sv->steps.n = 0;
    /* first the keys already there, so the walk never sees the new one half-written */
    int rc = ts_txn_foreach(txn, TS_DB_CKPT, prefix, plen, steps_add, &sv->steps);
    if (rc)
        return rc;
    /* superseded: every checkpoint at or after the new step (the new one overwrites its own) */
    size_t kept = 0;
    for (size_t i = 0; i < sv->steps.n; i++) {
        int64_t s = sv->steps.v[i];
        if (s > sv->step) {
            size_t klen = make_key(key, sv->run, sv->rlen, s);
            if ((rc = ts_txn_del(txn, TS_DB_CKPT, key, klen)) != TS_OK)
                return rc;
        } else if (s < sv->step) {
            sv->steps.v[kept++] = s; /* ascending, as the walk gave them */
        }
    }
    void *dst;
    size_t klen = make_key(key, sv->run, sv->rlen, sv->step);
    if ((rc = ts_txn_reserve(txn, TS_DB_CKPT, key, klen, sv->len, &dst)) != TS_OK)
        return rc;
    if (sv->len)
        memcpy(dst, sv->blob, sv->len);
    /* the new checkpoint plus the newest keep − 1 older ones stay */
    if (sv->keep > 0 && kept + 1 > (size_t)sv->keep) {
        size_t drop = kept + 1 - (size_t)sv->keep;
        for (size_t i = 0; i < drop; i++) {
            klen = make_key(key, sv->run, sv->rlen, sv->steps.v[i]);
            if ((rc = ts_txn_del(txn, TS_DB_CKPT, key, klen)) != TS_OK)
                return rc;
        }
    }
    return TS_OK;
}

int ts_ckpt_save(ts_store_t *s, const char *run_id, int64_t step, const void *blob, size_t len,
                 int keep_last) {
    save_t sv = {.run = run_id, .step = step, .blob = blob, .len = len, .keep = keep_last};
    if (!s || run_len(run_id, &sv.rlen) != TS_OK || step < 0 || keep_last < 0 || (!blob && len))
        return TS_EINVAL;
    int rc = ts_store_write(s, save_fn, &sv);
    free(sv.steps.v);
    return rc;
}

/* ---- latest, list, drop ----------------------------------------------------------------- */

typedef struct {
    int found;
    int64_t step;
    const void *val;
    size_t len;
} last_t;

static int remember_last(void *ctx, const void *key, size_t klen, const void *val, size_t vlen) {
    last_t *l = ctx;
    size_t rlen;
    if (split_key(key, klen, &rlen, &l->step) != TS_OK)
        return TS_ECORRUPT;
    l->found = 1;
    l->val = val;
    l->len = vlen;
    return TS_OK;
}

typedef struct {
    const char *run;
    size_t rlen;
    int64_t step;
    unsigned char *blob;
    size_t len;
} latest_t;

static int latest_fn(void *ctx, ts_store_txn_t *txn) {
    latest_t *lt = ctx;
    unsigned char prefix[KEY_MAX];
    size_t plen = make_key(prefix, lt->run, lt->rlen, 0) - 8;
    last_t l = {0};
    /* a run keeps a handful of checkpoints: walking them to the last one is cheap, and only
     * the value of the last one is copied */
    int rc = ts_txn_foreach(txn, TS_DB_CKPT, prefix, plen, remember_last, &l);
    if (rc)
        return rc;
    if (!l.found)
        return TS_ENOTFOUND;
    lt->blob = malloc(l.len ? l.len : 1);
    if (!lt->blob)
        return TS_ENOMEM;
    memcpy(lt->blob, l.val, l.len);
    lt->len = l.len;
    lt->step = l.step;
    return TS_OK;
}

int ts_ckpt_latest(ts_store_t *s, const char *run_id, int64_t *step, unsigned char **blob,
                   size_t *len) {
    if (blob)
        *blob = NULL;
    latest_t lt = {.run = run_id};
    if (!s || run_len(run_id, &lt.rlen) != TS_OK || !step || !blob || !len)
        return TS_EINVAL;
    int rc = ts_store_read(s, latest_fn, &lt);
    if (rc != TS_OK) {
        free(lt.blob);
        return rc;
    }
    *step = lt.step;
    *blob = lt.blob;
    *len = lt.len;
    return TS_OK;
}

typedef struct {
    const char *run;
    size_t rlen;
    ts_ckpt_each_fn fn;
    void *ctx;
    char name[TS_CKPT_RUN_MAX + 1];
} list_t;

static int list_each(void *ctx, const void *key, size_t klen, const void *val, size_t vlen) {
    list_t *ls = ctx;
    (void)val;
    size_t rlen;
    int64_t step;
    if (split_key(key, klen, &rlen, &step) != TS_OK)
        return TS_ECORRUPT;
    memcpy(ls->name, key, rlen);
    ls->name[rlen] = '\0';
    return ls->fn(ls->ctx, ls->name, step, vlen);
}

static int list_fn(void *ctx, ts_store_txn_t *txn) {
    list_t *ls = ctx;
    unsigned char prefix[KEY_MAX];
    size_t plen = ls->run ? make_key(prefix, ls->run, ls->rlen, 0) - 8 : 0;
    return ts_txn_foreach(txn, TS_DB_CKPT, prefix, plen, list_each, ls);
}

int ts_ckpt_list(ts_store_t *s, const char *run_id, ts_ckpt_each_fn fn, void *ctx) {
    list_t ls = {.run = run_id, .fn = fn, .ctx = ctx};
    if (!s || !fn || (run_id && run_len(run_id, &ls.rlen) != TS_OK))
        return TS_EINVAL;
    return ts_store_read(s, list_fn, &ls);
}

typedef struct {
    const char *run;
    size_t rlen;
    steps_t steps;
} drop_t;

static int drop_fn(void *ctx, ts_store_txn_t *txn) {
    drop_t *d = ctx;
    unsigned char key[KEY_MAX];
    size_t plen = make_key(key, d->run, d->rlen, 0) - 8;
    d->steps.n = 0;
    int rc = ts_txn_foreach(txn, TS_DB_CKPT, key, plen, steps_add, &d->steps);
    for (size_t i = 0; i < d->steps.n && rc == TS_OK; i++) {
        size_t klen = make_key(key, d->run, d->rlen, d->steps.v[i]);
        rc = ts_txn_del(txn, TS_DB_CKPT, key, klen);
    }
    return rc;
}

int ts_ckpt_drop(ts_store_t *s, const char *run_id, int *removed) {
    drop_t d = {.run = run_id};
    if (removed)
        *removed = 0;
    if (!s || run_len(run_id, &d.rlen) != TS_OK)
        return TS_EINVAL;
    int rc = ts_store_write(s, drop_fn, &d);
    if (rc == TS_OK && removed)
        *removed = (int)d.steps.n;
    free(d.steps.v);
    return rc;
}

int ts_ckpt_save_trainer(ts_store_t *s, const char *run_id, const ts_trainer_t *tr, int keep_last,
                         char *err, size_t errlen) {
    unsigned char *blob = NULL;
    size_t len = 0;
    int rc = ts_trainer_save_mem(tr, &blob, &len, err, errlen);
    if (rc == TS_OK && (rc = ts_ckpt_save(s, run_id, tr->step, blob, len, keep_last)) != TS_OK)
        ts_set_err(err, errlen, "store %s: cannot save the checkpoint of run '%s' at step %lld "
                                "(%zu bytes)",
                   ts_store_dir(s), run_id, (long long)tr->step, len);
    free(blob);
    return rc;
}

int ts_ckpt_resume_trainer(ts_store_t *s, const char *run_id, ts_trainer_t *tr, char *err,
                           size_t errlen) {
    int64_t step = 0;
    unsigned char *blob = NULL;
    size_t len = 0;
    int rc = ts_ckpt_latest(s, run_id, &step, &blob, &len);
    if (rc == TS_ENOTFOUND)
        return rc;
    if (rc != TS_OK) {
        ts_set_err(err, errlen, "store %s: cannot read the checkpoint of run '%s'",
                   ts_store_dir(s), run_id);
        return rc;
    }
    rc = ts_trainer_load_mem(tr, blob, len, err, errlen);
    free(blob);
    if (rc == TS_OK && tr->step != step) {
        ts_set_err(err, errlen, "run '%s': the checkpoint stored as step %lld holds step %lld",
                   run_id, (long long)step, (long long)tr->step);
        rc = TS_ECORRUPT;
    }
    return rc;
}
