/*
 * torch_pt.c — torch.save's zip format read without PyTorch (torch_pt.h): the zip archive's
 * central directory, then a restricted pickle interpreter over ROOT/data.pkl.
 *
 * The interpreter keeps every value in one table (obj_t, referred to by index) with a stack of
 * indices and a memo; a value built by a callable it does not know is O_OPAQUE, and
 * SETITEMS/APPENDS/BUILD on an opaque value are ignored. Tensors are collected afterwards by
 * walking the dicts from the top value.
 */
#define _POSIX_C_SOURCE 200809L

#include "model/torch_pt.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "kernels/math.h"

#define MAX_OBJECTS (1 << 24) /* values one pickle may build */
#define MAX_MEMO (1 << 24)
#define MAX_DEPTH 16 /* dicts nested around a tensor */
#define MAX_NAME 1024

/* ---- the zip archive --------------------------------------------------------------------- */

typedef struct {
    const unsigned char *p;
    size_t len;
} span_t;

typedef struct {
    const unsigned char *base;
    size_t len;
    const unsigned char *cd; /* the central directory */
    size_t cd_len;
    uint64_t entries;
} zip_t;

static uint16_t rd16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t rd32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const unsigned char *p) { return rd32(p) | (uint64_t)rd32(p + 4) << 32; }

static int zip_open(zip_t *z, const unsigned char *b, size_t len, char *err, size_t errlen) {
    memset(z, 0, sizeof *z);
    z->base = b, z->len = len;
    if (len < 22)
        return ts_fail(err, errlen, TS_EKIND, "%zu bytes: too short for a zip archive", len);
    size_t lo = len > 22 + 65535 ? len - 22 - 65535 : 0, at = len - 22 + 1;
    while (at-- > lo)
        if (rd32(b + at) == 0x06054b50u)
            break;
    if (at + 1 == lo || rd32(b + at) != 0x06054b50u)
        return ts_fail(err, errlen, TS_EKIND,
                       "not a zip archive: torch.save's zip format is read (a file of the "
                       "legacy format: load it in PyTorch and save it again with torch.save)");
    uint64_t entries = rd16(b + at + 10), cd_len = rd32(b + at + 12), cd_off = rd32(b + at + 16);
    if (entries == 0xFFFFu || cd_len == 0xFFFFFFFFu || cd_off == 0xFFFFFFFFu) { /* zip64 */
        if (at < 20 || rd32(b + at - 20) != 0x07064b50u)
            return ts_fail(err, errlen, TS_ECORRUPT, "zip64 archive without its locator");
        uint64_t rec = rd64(b + at - 20 + 8);
        if (len < 56 || rec > len - 56 || rd32(b + rec) != 0x06064b50u)
            return ts_fail(err, errlen, TS_ECORRUPT, "zip64 end record missing");
        entries = rd64(b + rec + 32), cd_len = rd64(b + rec + 40), cd_off = rd64(b + rec + 48);
    }
    if (cd_off > len || cd_len > len - cd_off)
        return ts_fail(err, errlen, TS_ECORRUPT,
                       "the zip directory runs past the end of the file (truncated?)");
    z->cd = b + cd_off, z->cd_len = cd_len, z->entries = entries;
    return TS_OK;
}

/* The stored data of the entry called name: TS_OK and *out, TS_ENOTFOUND, or TS_ECORRUPT. */
static int zip_find(const zip_t *z, const char *name, span_t *out, char *err, size_t errlen) {
    size_t nl = strlen(name), pos = 0;
    for (uint64_t i = 0; i < z->entries; i++) {
        if (pos + 46 > z->cd_len || rd32(z->cd + pos) != 0x02014b50u)
            return ts_fail(err, errlen, TS_ECORRUPT, "zip directory entry %llu is malformed",
                           (unsigned long long)i);
        const unsigned char *e = z->cd + pos;
        size_t n = rd16(e + 28), x = rd16(e + 30), c = rd16(e + 32);
        if (pos + 46 + n + x + c > z->cd_len)
            return ts_fail(err, errlen, TS_ECORRUPT, "zip directory entry %llu is malformed",
                           (unsigned long long)i);
        pos += 46 + n + x + c;
        if (n != nl || memcmp(e + 46, name, nl) != 0)
            continue;
        uint64_t csize = rd32(e + 20), usize = rd32(e + 24), off = rd32(e + 42);
        const unsigned char *ex = e + 46 + n;
        for (size_t k = 0; k + 4 <= x;) { /* zip64: the fields saturated above, in order */
            size_t id = rd16(ex + k), sz = rd16(ex + k + 2), q = k + 4;
            if (k + 4 + sz > x)
                break;
            if (id == 1) {
                if (usize == 0xFFFFFFFFu && q + 8 <= k + 4 + sz)
                    usize = rd64(ex + q), q += 8;
                if (csize == 0xFFFFFFFFu && q + 8 <= k + 4 + sz)
                    csize = rd64(ex + q), q += 8;
                if (off == 0xFFFFFFFFu && q + 8 <= k + 4 + sz)
                    off = rd64(ex + q);
            }
            k += 4 + sz;
        }
        if (rd16(e + 10) != 0 || csize != usize)
            return ts_fail(err, errlen, TS_ECORRUPT,
                           "zip entry %s is compressed; torch.save stores its entries", name);
        if (z->len < 30 || off > z->len - 30 || rd32(z->base + off) != 0x04034b50u)
            return ts_fail(err, errlen, TS_ECORRUPT, "zip entry %s: no local header", name);
        uint64_t data = off + 30 + rd16(z->base + off + 26) + rd16(z->base + off + 28);
        if (data > z->len || usize > z->len - data)
            return ts_fail(err, errlen, TS_ECORRUPT,
                           "zip entry %s runs past the end of the file (truncated?)", name);
        *out = (span_t){z->base + data, (size_t)usize};
        return TS_OK;
    }
    return TS_ENOTFOUND;
}

/* The archive's root folder: the name of its data.pkl less "data.pkl" (root[] ends in '/'). */
static int zip_root(const zip_t *z, char *root, size_t len, char *err, size_t errlen) {
    size_t pos = 0;
    for (uint64_t i = 0; i < z->entries && pos + 46 <= z->cd_len; i++) {
        const unsigned char *e = z->cd + pos;
        size_t n = rd16(e + 28);
        if (rd32(e) != 0x02014b50u || pos + 46 + n > z->cd_len)
            break;
        const char *nm = (const char *)e + 46;
        if (n >= 8 && memcmp(nm + n - 8, "data.pkl", 8) == 0 && (n == 8 || nm[n - 9] == '/') &&
            n - 8 < len) {
            memcpy(root, nm, n - 8);
            root[n - 8] = '\0';
            return TS_OK;
        }
        pos += 46 + n + rd16(e + 30) + rd16(e + 32);
    }
    return ts_fail(err, errlen, TS_EKIND, "a zip archive without data.pkl: not a torch.save file");
}

/* ---- the pickle interpreter -------------------------------------------------------------- */

enum {
    O_NONE,
    O_BOOL,
    O_INT,
    O_FLOAT,
    O_STR, /* text and bytes alike */
    O_TUPLE,
    O_LIST,
    O_DICT, /* items: key, value, key, value, … */
    O_GLOBAL,
    O_STORAGE,
    O_TENSOR,
    O_OPAQUE,
};

typedef struct {
    int kind;
    int64_t i;
    char *s; /* O_STR, O_GLOBAL ("module name"), O_STORAGE (its key) */
    int *items;
    int n, cap;
    /* O_STORAGE */
    ts_pt_dtype_t dtype;
    const char *type;
    /* O_TENSOR */
    int storage, ndim;
    int64_t shape[TS_PT_MAX_DIMS], stride[TS_PT_MAX_DIMS], offset;
} obj_t;

typedef struct {
    obj_t *o;
    int n, cap;
    int *stack;
    int sp, stack_cap;
    int *marks;
    int nm, marks_cap;
    int *memo;
    int64_t memo_cap;
    char *err;
    size_t errlen;
} vm_t;

static int grow(void **p, int *cap, int need, size_t size) {
    if (need <= *cap)
        return TS_OK;
    int c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, (size_t)c * size);
    if (!q)
        return TS_ENOMEM;
    *p = q;
    *cap = c;
    return TS_OK;
}

static int new_obj(vm_t *v, int kind) {
    if (v->n >= MAX_OBJECTS || grow((void **)&v->o, &v->cap, v->n + 1, sizeof *v->o) != TS_OK)
        return -1;
    memset(&v->o[v->n], 0, sizeof v->o[v->n]);
    v->o[v->n].kind = kind;
    return v->n++;
}

static int push(vm_t *v, int id) {
    if (id < 0 || grow((void **)&v->stack, &v->stack_cap, v->sp + 1, sizeof *v->stack) != TS_OK)
        return TS_ENOMEM;
    v->stack[v->sp++] = id;
    return TS_OK;
}

static int add_item(vm_t *v, int to, int item) {
    obj_t *o = &v->o[to];
    TS_TRY(grow((void **)&o->items, &o->cap, o->n + 1, sizeof *o->items));
    o->items[o->n++] = item;
    return TS_OK;
}

static int bad(vm_t *v, size_t at, const char *what) {
    return ts_fail(v->err, v->errlen, TS_ECORRUPT, "data.pkl at byte %zu: %s", at, what);
}

/* The items above the topmost mark, into a new value of kind (the mark popped). */
static int collect(vm_t *v, int kind, size_t at) {
    if (v->nm == 0)
        return bad(v, at, "no mark to collect to");
    int m = v->marks[--v->nm], id = new_obj(v, kind);
    if (id < 0)
        return TS_ENOMEM;
    for (int k = m; k < v->sp; k++)
        TS_TRY(add_item(v, id, v->stack[k]));
    v->sp = m;
    return push(v, id);
}

static const struct {
    const char *name;
    ts_pt_dtype_t dtype;
    int size;
} storages[] = {
    {"FloatStorage", TS_PT_F32, 4},     {"HalfStorage", TS_PT_F16, 2},
    {"BFloat16Storage", TS_PT_BF16, 2}, {"DoubleStorage", TS_PT_F64, 8},
    {"LongStorage", TS_PT_OTHER, 8},    {"IntStorage", TS_PT_OTHER, 4},
    {"ShortStorage", TS_PT_OTHER, 2},   {"CharStorage", TS_PT_OTHER, 1},
    {"ByteStorage", TS_PT_OTHER, 1},    {"BoolStorage", TS_PT_OTHER, 1},
};

static int dtype_size(const obj_t *storage) {
    for (size_t i = 0; i < sizeof storages / sizeof storages[0]; i++)
        if (storage->type == storages[i].name)
            return storages[i].size;
    return 0;
}

/* An int or an all-int tuple as dims; -1 when it is not one. */
static int dims_of(vm_t *v, int id, int64_t *out) {
    const obj_t *t = &v->o[id];
    if (t->kind != O_TUPLE || t->n > TS_PT_MAX_DIMS)
        return -1;
    for (int k = 0; k < t->n; k++) {
        const obj_t *e = &v->o[t->items[k]];
        if (e->kind != O_INT || e->i < 0)
            return -1;
        out[k] = e->i;
    }
    return t->n;
}

/* REDUCE / NEWOBJ: f(args) for the callables a state dict uses; anything else is opaque. */
static int call(vm_t *v, int f, int args, size_t at) {
    const obj_t *fn = &v->o[f], *a = &v->o[args];
    if (fn->kind == O_GLOBAL && a->kind == O_TUPLE) {
        if (strcmp(fn->s, "collections OrderedDict") == 0 && a->n == 0)
            return push(v, new_obj(v, O_DICT));
        if (strcmp(fn->s, "torch._utils _rebuild_parameter") == 0 && a->n >= 1)
            return push(v, a->items[0]); /* nn.Parameter(data): the data */
        if (strcmp(fn->s, "torch._utils _rebuild_tensor_v2") == 0 && a->n >= 4) {
            int st = a->items[0], ndim;
            int64_t shape[TS_PT_MAX_DIMS], stride[TS_PT_MAX_DIMS];
            const obj_t *off = &v->o[a->items[1]];
            if (v->o[st].kind != O_STORAGE || off->kind != O_INT || off->i < 0 ||
                (ndim = dims_of(v, a->items[2], shape)) < 0 ||
                dims_of(v, a->items[3], stride) != ndim)
                return bad(v, at, "a tensor whose storage, offset, size or stride is malformed");
            int64_t offset = off->i;
            int id = new_obj(v, O_TENSOR); /* may move the table: fn, a and off are stale */
            if (id < 0)
                return TS_ENOMEM;
            obj_t *t = &v->o[id];
            t->storage = st, t->ndim = ndim, t->offset = offset;
            memcpy(t->shape, shape, sizeof shape);
            memcpy(t->stride, stride, sizeof stride);
            return push(v, id);
        }
    }
    return push(v, new_obj(v, O_OPAQUE));
}

/* BINPERSID: ('storage', type, key, location, numel). */
static int persistent(vm_t *v, int pid, size_t at) {
    const obj_t *t = &v->o[pid];
    if (t->kind != O_TUPLE || t->n < 5 || v->o[t->items[0]].kind != O_STR ||
        strcmp(v->o[t->items[0]].s, "storage") != 0 || v->o[t->items[1]].kind != O_GLOBAL ||
        v->o[t->items[2]].kind != O_STR || v->o[t->items[4]].kind != O_INT ||
        v->o[t->items[4]].i < 0)
        return bad(v, at, "a persistent id that is not a storage");
    const char *type = v->o[t->items[1]].s;
    int id = new_obj(v, O_STORAGE);
    if (id < 0)
        return TS_ENOMEM;
    obj_t *s = &v->o[id];
    t = &v->o[pid]; /* new_obj may have moved the table */
    for (size_t i = 0; i < sizeof storages / sizeof storages[0]; i++)
        if (strncmp(type, "torch ", 6) == 0 && strcmp(type + 6, storages[i].name) == 0)
            s->type = storages[i].name, s->dtype = storages[i].dtype;
    if (!s->type)
        return ts_fail(v->err, v->errlen, TS_ECORRUPT,
                       "data.pkl: a storage of type '%s', which is not one this reader knows",
                       type);
    s->s = strdup(v->o[t->items[2]].s);
    s->i = v->o[t->items[4]].i; /* numel */
    return s->s ? push(v, id) : TS_ENOMEM;
}

static int new_str(vm_t *v, const unsigned char *p, size_t n, int kind) {
    int id = new_obj(v, kind);
    if (id < 0 || !(v->o[id].s = malloc(n + 1)))
        return TS_ENOMEM;
    memcpy(v->o[id].s, p, n);
    v->o[id].s[n] = '\0';
    return push(v, id);
}

static int memo_put(vm_t *v, int64_t key, size_t at) {
    if (v->sp == 0)
        return bad(v, at, "memoizing an empty stack");
    if (key < 0 || key >= MAX_MEMO)
        return bad(v, at, "memo index out of range");
    if (key >= v->memo_cap) {
        int64_t c = v->memo_cap ? v->memo_cap : 64;
        while (c <= key)
            c *= 2;
        int *m = realloc(v->memo, (size_t)c * sizeof *m);
        if (!m)
            return TS_ENOMEM;
        for (int64_t k = v->memo_cap; k < c; k++)
            m[k] = -1;
        v->memo = m, v->memo_cap = c;
    }
    v->memo[key] = v->stack[v->sp - 1];
    return TS_OK;
}

/* Runs the pickle; *top receives the value STOP returns. */
static int run(vm_t *v, const unsigned char *b, size_t len, int *top) {
    size_t pc = 0;
    int64_t memo_next = 0;
#define NEED(k)                                                                                    \
    do {                                                                                           \
        if (len - pc < (size_t)(k))                                                                \
            return bad(v, pc, "truncated");                                                        \
    } while (0)
#define POP(var)                                                                                   \
    do {                                                                                           \
        if (v->sp <= (v->nm ? v->marks[v->nm - 1] : 0))                                            \
            return bad(v, at, "stack underflow");                                                  \
        (var) = v->stack[--v->sp];                                                                 \
    } while (0)
    while (pc < len) {
        size_t at = pc;
        unsigned char op = b[pc++];
        int a = 0, c = 0, d = 0;
        size_t n;
        switch (op) {
        case 0x80:
            NEED(1);
            pc++;
            break; /* PROTO */
        case 0x95:
            NEED(8);
            pc += 8;
            break; /* FRAME */
        case '.':  /* STOP */
            if (v->sp != 1)
                return bad(v, at, "STOP with a stack that is not one value");
            *top = v->stack[0];
            return TS_OK;
        case '(': /* MARK */
            TS_TRY(grow((void **)&v->marks, &v->marks_cap, v->nm + 1, sizeof *v->marks));
            v->marks[v->nm++] = v->sp;
            break;
        case '0': POP(a); break; /* POP */
        case '1':                /* POP_MARK */
            if (v->nm == 0)
                return bad(v, at, "POP_MARK without a mark");
            v->sp = v->marks[--v->nm];
            break;
        case '2': /* DUP */
            if (v->sp == 0)
                return bad(v, at, "DUP of an empty stack");
            TS_TRY(push(v, v->stack[v->sp - 1]));
            break;
        case 'N': TS_TRY(push(v, new_obj(v, O_NONE))); break;
        case 0x88: /* NEWTRUE */
        case 0x89: /* NEWFALSE */
            if ((a = new_obj(v, O_BOOL)) < 0)
                return TS_ENOMEM;
            v->o[a].i = op == 0x88;
            TS_TRY(push(v, a));
            break;
        case 'J': /* BININT */
        case 'K': /* BININT1 */
        case 'M': /* BININT2 */
            n = op == 'J' ? 4 : op == 'K' ? 1 : 2;
            NEED(n);
            if ((a = new_obj(v, O_INT)) < 0)
                return TS_ENOMEM;
            v->o[a].i = op == 'J'   ? (int64_t)(int32_t)rd32(b + pc)
                        : op == 'K' ? b[pc]
                                    : rd16(b + pc);
            pc += n;
            TS_TRY(push(v, a));
            break;
        case 0x8a: { /* LONG1: n little-endian two's-complement bytes */
            NEED(1);
            n = b[pc++];
            NEED(n);
            if (n > 8)
                return bad(v, at, "an integer wider than 64 bits");
            uint64_t u = 0;
            for (size_t k = 0; k < n; k++)
                u |= (uint64_t)b[pc + k] << (8 * k);
            if (n && n < 8 && (b[pc + n - 1] & 0x80))
                u |= ~(uint64_t)0 << (8 * n);
            pc += n;
            if ((a = new_obj(v, O_INT)) < 0)
                return TS_ENOMEM;
            v->o[a].i = (int64_t)u;
            TS_TRY(push(v, a));
            break;
        }
        case 'G': /* BINFLOAT: big-endian double, kept as its bits (only skipped over) */
            NEED(8);
            pc += 8;
            TS_TRY(push(v, new_obj(v, O_FLOAT)));
            break;
        case 'X':  /* BINUNICODE */
        case 'B':  /* BINBYTES */
        case 'T':  /* BINSTRING */
        case 0x8c: /* SHORT_BINUNICODE */
        case 'C':  /* SHORT_BINBYTES */
        case 'U':  /* SHORT_BINSTRING */
        case 0x8d: /* BINUNICODE8 */
        case 0x8e: /* BINBYTES8 */
        case 0x96: /* BYTEARRAY8 */
            if (op == 0x8c || op == 'C' || op == 'U') {
                NEED(1);
                n = b[pc++];
            } else if (op == 0x8d || op == 0x8e || op == 0x96) {
                NEED(8);
                uint64_t u = rd64(b + pc);
                pc += 8;
                if (u > len)
                    return bad(v, at, "a string past the end");
                n = (size_t)u;
            } else {
                NEED(4);
                n = rd32(b + pc);
                pc += 4;
            }
            NEED(n);
            TS_TRY(new_str(v, b + pc, n, O_STR));
            pc += n;
            break;
        case 'c': { /* GLOBAL "module\nname\n" */
            const unsigned char *m = memchr(b + pc, '\n', len - pc);
            const unsigned char *q = m ? memchr(m + 1, '\n', len - (size_t)(m + 1 - b)) : NULL;
            if (!q)
                return bad(v, at, "GLOBAL without its two lines");
            size_t ml = (size_t)(m - (b + pc)), nl = (size_t)(q - (m + 1));
            if (ml + nl + 2 > MAX_NAME)
                return bad(v, at, "a global's name is too long");
            char name[MAX_NAME];
            memcpy(name, b + pc, ml);
            name[ml] = ' ';
            memcpy(name + ml + 1, m + 1, nl);
            TS_TRY(new_str(v, (const unsigned char *)name, ml + 1 + nl, O_GLOBAL));
            pc = (size_t)(q + 1 - b);
            break;
        }
        case 0x93: { /* STACK_GLOBAL */
            POP(c);
            POP(a);
            if (v->o[a].kind != O_STR || v->o[c].kind != O_STR ||
                strlen(v->o[a].s) + strlen(v->o[c].s) + 2 > MAX_NAME)
                return bad(v, at, "STACK_GLOBAL of values that are not names");
            char name[MAX_NAME];
            size_t ml = strlen(v->o[a].s), nl = strlen(v->o[c].s); /* ml + nl + 2 ≤ MAX_NAME */
            memcpy(name, v->o[a].s, ml);
            name[ml] = ' ';
            memcpy(name + ml + 1, v->o[c].s, nl);
            TS_TRY(new_str(v, (const unsigned char *)name, ml + 1 + nl, O_GLOBAL));
            break;
        }
        case ')': TS_TRY(push(v, new_obj(v, O_TUPLE))); break; /* EMPTY_TUPLE */
        case ']': TS_TRY(push(v, new_obj(v, O_LIST))); break;  /* EMPTY_LIST */
        case '}': TS_TRY(push(v, new_obj(v, O_DICT))); break;  /* EMPTY_DICT */
        case 0x8f: TS_TRY(push(v, new_obj(v, O_LIST))); break; /* EMPTY_SET */
        case 't': TS_TRY(collect(v, O_TUPLE, at)); break;
        case 'l': TS_TRY(collect(v, O_LIST, at)); break;
        case 'd': { /* DICT */
            TS_TRY(collect(v, O_DICT, at));
            if (v->o[v->stack[v->sp - 1]].n % 2)
                return bad(v, at, "DICT of an odd number of items");
            break;
        }
        case 0x91: TS_TRY(collect(v, O_TUPLE, at)); break; /* FROZENSET */
        case 0x85:                                         /* TUPLE1..3 */
        case 0x86:
        case 0x87: {
            int k = op - 0x84, it[3];
            for (int j = k - 1; j >= 0; j--)
                POP(it[j]);
            if ((a = new_obj(v, O_TUPLE)) < 0)
                return TS_ENOMEM;
            for (int j = 0; j < k; j++)
                TS_TRY(add_item(v, a, it[j]));
            TS_TRY(push(v, a));
            break;
        }
        case 'a': /* APPEND */
            POP(c);
            if (v->sp == 0)
                return bad(v, at, "APPEND to nothing");
            if (v->o[v->stack[v->sp - 1]].kind == O_LIST)
                TS_TRY(add_item(v, v->stack[v->sp - 1], c));
            break;
        case 'e':   /* APPENDS */
        case 0x90:  /* ADDITEMS */
        case 'u': { /* SETITEMS */
            if (v->nm == 0)
                return bad(v, at, "no mark for the items");
            int m = v->marks[--v->nm];
            if (m == 0)
                return bad(v, at, "items with nothing to add them to");
            int to = v->stack[m - 1], k = v->sp - m;
            if (op == 'u' && k % 2)
                return bad(v, at, "SETITEMS of an odd number of values");
            if ((op == 'u' && v->o[to].kind == O_DICT) || (op != 'u' && v->o[to].kind == O_LIST))
                for (int j = m; j < v->sp; j++)
                    TS_TRY(add_item(v, to, v->stack[j]));
            v->sp = m;
            break;
        }
        case 's': /* SETITEM */
            POP(d);
            POP(c);
            if (v->sp == 0)
                return bad(v, at, "SETITEM with nothing to set it in");
            if (v->o[v->stack[v->sp - 1]].kind == O_DICT) {
                TS_TRY(add_item(v, v->stack[v->sp - 1], c));
                TS_TRY(add_item(v, v->stack[v->sp - 1], d));
            }
            break;
        case 'R':  /* REDUCE */
        case 0x81: /* NEWOBJ */
            POP(c);
            POP(a);
            TS_TRY(call(v, a, c, at));
            break;
        case 0x92: /* NEWOBJ_EX: cls, args, kwargs */
            POP(d);
            POP(c);
            POP(a);
            TS_TRY(call(v, a, c, at));
            break;
        case 'b': /* BUILD: the state set on the object, which is kept as it is */
            POP(c);
            if (v->sp == 0)
                return bad(v, at, "BUILD with nothing to build");
            break;
        case 'Q': /* BINPERSID */
            POP(a);
            TS_TRY(persistent(v, a, at));
            break;
        case 'q': /* BINPUT */
            NEED(1);
            TS_TRY(memo_put(v, b[pc++], at));
            break;
        case 'r': /* LONG_BINPUT */
            NEED(4);
            TS_TRY(memo_put(v, rd32(b + pc), at));
            pc += 4;
            break;
        case 0x94: TS_TRY(memo_put(v, memo_next++, at)); break; /* MEMOIZE */
        case 'h':                                               /* BINGET */
        case 'j': {                                             /* LONG_BINGET */
            int64_t k;
            if (op == 'h') {
                NEED(1);
                k = b[pc++];
            } else {
                NEED(4);
                k = rd32(b + pc);
                pc += 4;
            }
            if (k >= v->memo_cap || v->memo[k] < 0)
                return bad(v, at, "a memo entry that was never put");
            TS_TRY(push(v, v->memo[k]));
            break;
        }
        default: {
            char what[64];
            snprintf(what, sizeof what, "opcode 0x%02x, which a state dict does not use", op);
            return bad(v, at, what);
        }
        }
    }
#undef NEED
#undef POP
    return bad(v, pc, "no STOP");
}

/* ---- collecting the tensors -------------------------------------------------------------- */

typedef struct {
    vm_t *v;
    ts_pt_file_t *f;
    const zip_t *z;
    const char *root;
    int cap;
    char *err;
    size_t errlen;
} walk_t;

static int add_tensor(walk_t *w, const char *name, const obj_t *t) {
    const obj_t *s = &w->v->o[t->storage];
    char entry[MAX_NAME + 16];
    snprintf(entry, sizeof entry, "%sdata/%s", w->root, s->s);
    span_t sp;
    int rc = zip_find(w->z, entry, &sp, w->err, w->errlen);
    if (rc == TS_ENOTFOUND)
        return ts_fail(w->err, w->errlen, TS_ECORRUPT, "tensor %s: its storage %s is missing", name,
                       entry);
    TS_TRY(rc);
    int es = dtype_size(s);
    if ((uint64_t)s->i > sp.len / (uint64_t)es)
        return ts_fail(w->err, w->errlen, TS_ECORRUPT,
                       "tensor %s: storage %s holds %zu bytes, not %lld %s elements", name, entry,
                       sp.len, (long long)s->i, s->type);
    /* the furthest element it reaches must lie in the storage */
    uint64_t last = (uint64_t)t->offset, numel = 1;
    for (int k = 0; k < t->ndim; k++) {
        numel = t->shape[k] ? numel * (uint64_t)t->shape[k] : 0;
        if (t->shape[k] > ((int64_t)1 << 40) || t->stride[k] > ((int64_t)1 << 40))
            return ts_fail(w->err, w->errlen, TS_ECORRUPT, "tensor %s: absurd size or stride",
                           name);
        if (t->shape[k])
            last += (uint64_t)(t->shape[k] - 1) * (uint64_t)t->stride[k];
    }
    if (numel && last >= (uint64_t)s->i)
        return ts_fail(w->err, w->errlen, TS_ECORRUPT,
                       "tensor %s reaches element %llu of a storage of %lld", name,
                       (unsigned long long)last, (long long)s->i);
    if (grow((void **)&w->f->t, &w->cap, w->f->n + 1, sizeof *w->f->t) != TS_OK)
        return TS_ENOMEM;
    ts_pt_tensor_t *o = &w->f->t[w->f->n];
    memset(o, 0, sizeof *o);
    if (!(o->name = strdup(name)))
        return TS_ENOMEM;
    w->f->n++;
    o->dtype = s->dtype, o->storage_type = s->type, o->ndim = t->ndim, o->offset = t->offset;
    memcpy(o->shape, t->shape, sizeof o->shape);
    memcpy(o->stride, t->stride, sizeof o->stride);
    o->data = sp.p, o->storage_numel = s->i;
    return TS_OK;
}

static int walk(walk_t *w, int id, const char *prefix, int depth) {
    const obj_t *o = &w->v->o[id];
    if (o->kind == O_TENSOR)
        return add_tensor(w, prefix, o);
    if (o->kind != O_DICT || depth > MAX_DEPTH)
        return TS_OK;
    for (int k = 0; k + 1 < o->n; k += 2) {
        const obj_t *key = &w->v->o[o->items[k]];
        if (key->kind != O_STR)
            continue;
        char name[MAX_NAME];
        if ((size_t)snprintf(name, sizeof name, "%s%s%s", prefix, *prefix ? "." : "", key->s) >=
            sizeof name)
            return ts_fail(w->err, w->errlen, TS_ECORRUPT, "a key longer than %d bytes", MAX_NAME);
        TS_TRY(walk(w, o->items[k + 1], name, depth + 1));
        o = &w->v->o[id];
    }
    return TS_OK;
}

/* ---- the file ---------------------------------------------------------------------------- */

void ts_pt_close(ts_pt_file_t *f) {
    if (!f)
        return;
    for (int i = 0; i < f->n; i++)
        free(f->t[i].name);
    free(f->t);
    if (f->map && !f->borrowed)
        munmap(f->map, f->len);
    memset(f, 0, sizeof *f);
}

static void vm_free(vm_t *v) {
    for (int i = 0; i < v->n; i++) {
        free(v->o[i].s);
        free(v->o[i].items);
    }
    free(v->o);
    free(v->stack);
    free(v->marks);
    free(v->memo);
}

/* Reads the archive f->map / f->len (mapped or borrowed). */
static int parse(ts_pt_file_t *f, char *err, size_t errlen) {
    if (err && errlen)
        err[0] = '\0';
    zip_t z;
    char root[MAX_NAME];
    span_t pkl, order;
    vm_t v = {.err = err, .errlen = errlen};
    int top = -1;
    int rc = zip_open(&z, f->map, f->len, err, errlen);
    if (rc == TS_OK)
        rc = zip_root(&z, root, sizeof root, err, errlen);
    if (rc == TS_OK) {
        char name[MAX_NAME + 16];
        snprintf(name, sizeof name, "%sbyteorder", root);
        int o = zip_find(&z, name, &order, err, errlen);
        if (o == TS_OK && !(order.len == 6 && memcmp(order.p, "little", 6) == 0))
            rc = ts_fail(err, errlen, TS_ENOTSUP, "saved on a big-endian machine");
        else if (o != TS_OK && o != TS_ENOTFOUND)
            rc = o;
        snprintf(name, sizeof name, "%sdata.pkl", root);
        if (rc == TS_OK && (rc = zip_find(&z, name, &pkl, err, errlen)) == TS_ENOTFOUND)
            rc = ts_fail(err, errlen, TS_ECORRUPT, "the zip directory does not reach %s", name);
    }
    if (rc == TS_OK)
        rc = run(&v, pkl.p, pkl.len, &top);
    if (rc == TS_OK) {
        walk_t w = {.v = &v, .f = f, .z = &z, .root = root, .err = err, .errlen = errlen};
        rc = walk(&w, top, "", 0);
    }
    if (rc == TS_ENOMEM)
        ts_set_err(err, errlen, "out of memory");
    else if (rc != TS_OK && err && errlen && !err[0])
        ts_set_err(err, errlen, "malformed: %s", ts_strerror(rc));
    vm_free(&v);
    return rc;
}

int ts_pt_parse(const void *buf, size_t len, ts_pt_file_t *f, char *err, size_t errlen) {
    if (!buf || !f)
        return ts_fail(err, errlen, TS_EINVAL, "ts_pt_parse: NULL argument");
    memset(f, 0, sizeof *f);
    f->map = (void *)buf, f->len = len, f->borrowed = 1;
    int rc = parse(f, err, errlen);
    if (rc != TS_OK)
        ts_pt_close(f);
    return rc;
}

int ts_pt_open(const char *path, ts_pt_file_t *f, char *err, size_t errlen) {
    if (!path || !f)
        return ts_fail(err, errlen, TS_EINVAL, "ts_pt_open: NULL argument");
    memset(f, 0, sizeof *f);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ts_fail(err, errlen, errno == ENOENT ? TS_ENOTFOUND : TS_EIO, "cannot open %s: %s",
                       path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 1) {
        close(fd);
        return ts_fail(err, errlen, TS_EIO, "%s is not a regular file with data", path);
    }
    f->len = (size_t)st.st_size;
    f->map = mmap(NULL, f->len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        return ts_fail(err, errlen, TS_EIO, "cannot map %s: %s", path, strerror(errno));
    }
    int rc = parse(f, err, errlen);
    if (rc != TS_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", err ? err : "");
        ts_set_err(err, errlen, "%s: %s", path, why);
        ts_pt_close(f);
    }
    return rc;
}

const ts_pt_tensor_t *ts_pt_find(const ts_pt_file_t *f, const char *name) {
    for (int i = 0; f && name && i < f->n; i++)
        if (strcmp(f->t[i].name, name) == 0)
            return &f->t[i];
    return NULL;
}

int64_t ts_pt_numel(const ts_pt_tensor_t *t) {
    int64_t n = 1;
    for (int k = 0; k < t->ndim; k++)
        n *= t->shape[k];
    return n;
}

int ts_pt_to_f32(const ts_pt_tensor_t *t, float *out) {
    if (!t || !out)
        return TS_EINVAL;
    if (t->dtype == TS_PT_OTHER)
        return TS_ENOTSUP;
    int64_t n = ts_pt_numel(t), idx[TS_PT_MAX_DIMS] = {0};
    for (int64_t i = 0; i < n; i++) {
        int64_t e = t->offset;
        for (int k = 0; k < t->ndim; k++)
            e += idx[k] * t->stride[k];
        switch (t->dtype) {
        case TS_PT_F32: {
            uint32_t u = rd32(t->data + 4 * e);
            memcpy(&out[i], &u, 4);
            break;
        }
        case TS_PT_F16: out[i] = ts_f16_to_f32(rd16(t->data + 2 * e)); break;
        case TS_PT_BF16: out[i] = ts_bf16_to_f32(rd16(t->data + 2 * e)); break;
        case TS_PT_F64: {
            uint64_t u = rd64(t->data + 8 * e);
            double d;
            memcpy(&d, &u, 8);
            out[i] = (float)d;
            break;
        }
        default: return TS_ENOTSUP;
        }
        for (int k = t->ndim - 1; k >= 0; k--) { /* the next index, last dimension fastest */
            if (++idx[k] < t->shape[k])
                break;
            idx[k] = 0;
        }
    }
    return TS_OK;
}
