/*
 * swim_wire.c — encoding and decoding of gossip datagrams and push-pull states (swim_wire.h).
 *
 * A datagram, all integers big-endian:
 *
 *   offset  size  field
 *   0       1     wire version, 1
 *   1       1     message type: 1 ping, 2 ack, 3 ping-req, 4 nack, 5 gossip
 *   2       32    sender id
 *   34      …     body: ping: seq (4), target id (32); ack: seq (4), flags (1); nack: seq (4);
 *                 ping-req: seq (4), target id (32), target address (16 ip + 2 port); gossip: none
 *   …       1     n, the number of updates, 0..TS_SWIM_MAX_UPDATES
 *   …       …     n updates, each a type byte then a fixed body:
 *                 1 alive:   id (32), incarnation (4), address (18), advert version (8),
 *                            advert hash (32), signature (64)
 *                 2 suspect, 3 dead: id (32), incarnation (4), accuser id (32)
 *                 4 leave:   id (32), incarnation (4), signature (64)
 *
 * and the datagram ends exactly after the last update. A push-pull state is a header (version,
 * type 6, sender id, join flag 0/1, count (4)) then per member: state (1), state incarnation
 * (4), and the member's claim encoded as an alive or leave update. A digest is version, type 7,
 * sender id, the bucket count (2, always TS_SWIM_DIGEST_BUCKETS) and a 64-bit hash per bucket.
 * A diff is version, type 8, sender id, the mask of differing buckets (32 bytes, bucket b is
 * bit b % 8 of byte b / 8), then count and entries as in a state, each in a masked bucket.
 *
 * The decoder reads through a cursor that refuses to move past the end, so every read is
 * bounds-checked in one place; a failed read poisons the cursor and the decode ends as
 * TS_ECORRUPT.
 */
#include "net/swim_wire.h"

#include <string.h>

#include "base/error.h"

#define TYPE_STATE 6  /* push-pull: a full state */
#define TYPE_DIGEST 7 /* push-pull: a digest */
#define TYPE_DIFF 8   /* push-pull: the members of the buckets that differ */

/* The largest body and the smallest update bound how many updates fit in the plaintext budget;
 * swim.h's TS_SWIM_MAX_UPDATES must be exactly that many, so that a full packet is always
 * encodable and a decoder never needs more room. */
_Static_assert(TS_SWIM_MAX_UPDATES ==
                   (TS_SWIM_PLAIN_MAX - (TS_SWIM_WIRE_HEADER + 1)) / TS_SWIM_WIRE_ACCUSE,
               "TS_SWIM_MAX_UPDATES must match the plaintext budget");
_Static_assert(TS_SWIM_WIRE_ALIVE == 1 + TS_SWIM_ID_LEN + 4 + TS_SWIM_WIRE_ADDR + 8 +
                                         TS_SWIM_HASH_LEN + TS_SWIM_SIG_LEN,
               "alive size");
_Static_assert(TS_SWIM_SIGNED_MAX == 20 + TS_SWIM_WIRE_ALIVE - 1 - TS_SWIM_SIG_LEN, "signed size");

static const char TAG_ALIVE[20] = "tessera/swim/alive/1";
static const char TAG_LEAVE[20] = "tessera/swim/leave/1";

/* ---- writing ----------------------------------------------------------------------------- */

typedef struct {
    uint8_t *p, *end;
    int overflow;
} wcur_t;

static void put(wcur_t *w, const void *src, size_t n) {
    if (w->overflow || (size_t)(w->end - w->p) < n) {
        w->overflow = 1;
        return;
    }
    memcpy(w->p, src, n);
    w->p += n;
}

static void put_u8(wcur_t *w, uint8_t v) { put(w, &v, 1); }

static void put_u16(wcur_t *w, uint16_t v) {
    uint8_t b[2] = {(uint8_t)(v >> 8), (uint8_t)v};
    put(w, b, 2);
}

static void put_u32(wcur_t *w, uint32_t v) {
    uint8_t b[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
    put(w, b, 4);
}

static void put_u64(wcur_t *w, uint64_t v) {
    put_u32(w, (uint32_t)(v >> 32));
    put_u32(w, (uint32_t)v);
}

static void put_addr(wcur_t *w, const ts_swim_addr_t *a) {
    put(w, a->ip, sizeof a->ip);
    put_u16(w, a->port);
}

/* The claim's fields without kind and sig, in wire order. */
static void put_claim_body(wcur_t *w, const ts_swim_claim_t *c) {
    put(w, c->id, TS_SWIM_ID_LEN);
    put_u32(w, c->incarnation);
    if (c->kind == TS_SWIM_CLAIM_ALIVE) {
        put_addr(w, &c->addr);
        put_u64(w, c->advert_version);
        put(w, c->advert_hash, TS_SWIM_HASH_LEN);
    }
}

static int put_update(wcur_t *w, const ts_swim_update_t *u) {
    switch (u->type) {
    case TS_SWIM_UP_ALIVE:
    case TS_SWIM_UP_LEAVE:
        if (u->u.claim.kind !=
            (u->type == TS_SWIM_UP_ALIVE ? TS_SWIM_CLAIM_ALIVE : TS_SWIM_CLAIM_LEAVE))
            return TS_EINVAL;
        put_u8(w, u->type);
        put_claim_body(w, &u->u.claim);
        put(w, u->u.claim.sig, TS_SWIM_SIG_LEN);
        return TS_OK;
    case TS_SWIM_UP_SUSPECT:
    case TS_SWIM_UP_DEAD:
        put_u8(w, u->type);
        put(w, u->u.accuse.id, TS_SWIM_ID_LEN);
        put_u32(w, u->u.accuse.incarnation);
        put(w, u->u.accuse.from, TS_SWIM_ID_LEN);
        return TS_OK;
    default: return TS_EINVAL;
    }
}

/* ---- reading ----------------------------------------------------------------------------- */

typedef struct {
    const uint8_t *p, *end;
    int bad;
} rcur_t;

static int get(rcur_t *r, void *dst, size_t n) {
    if (r->bad || (size_t)(r->end - r->p) < n) {
        r->bad = 1;
        memset(dst, 0, n);
        return 0;
    }
    memcpy(dst, r->p, n);
    r->p += n;
    return 1;
}

static uint8_t get_u8(rcur_t *r) {
    uint8_t v;
    get(r, &v, 1);
    return v;
}

static uint16_t get_u16(rcur_t *r) {
    uint8_t b[2];
    get(r, b, 2);
    return (uint16_t)(b[0] << 8 | b[1]);
}

static uint32_t get_u32(rcur_t *r) {
    uint8_t b[4];
    get(r, b, 4);
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

static uint64_t get_u64(rcur_t *r) {
    uint64_t hi = get_u32(r);
    return hi << 32 | get_u32(r);
}

static void get_addr(rcur_t *r, ts_swim_addr_t *a) {
    get(r, a->ip, sizeof a->ip);
    a->port = get_u16(r);
}

/* Reads an update body of the given type (the type byte already read); marks the cursor bad
 * for an unknown type. */
static void get_update(rcur_t *r, uint8_t type, ts_swim_update_t *u) {
    memset(u, 0, sizeof *u);
    u->type = type;
    switch (type) {
    case TS_SWIM_UP_ALIVE:
    case TS_SWIM_UP_LEAVE: {
        ts_swim_claim_t *c = &u->u.claim;
        c->kind = type == TS_SWIM_UP_ALIVE ? TS_SWIM_CLAIM_ALIVE : TS_SWIM_CLAIM_LEAVE;
        get(r, c->id, TS_SWIM_ID_LEN);
        c->incarnation = get_u32(r);
        if (c->kind == TS_SWIM_CLAIM_ALIVE) {
            get_addr(r, &c->addr);
            c->advert_version = get_u64(r);
            get(r, c->advert_hash, TS_SWIM_HASH_LEN);
        }
        get(r, c->sig, TS_SWIM_SIG_LEN);
        return;
    }
    case TS_SWIM_UP_SUSPECT:
    case TS_SWIM_UP_DEAD:
        get(r, u->u.accuse.id, TS_SWIM_ID_LEN);
        u->u.accuse.incarnation = get_u32(r);
        get(r, u->u.accuse.from, TS_SWIM_ID_LEN);
        return;
    default: r->bad = 1; return;
    }
}

/* ---- datagrams --------------------------------------------------------------------------- */

size_t ts_swim_wire_update_size(const ts_swim_update_t *u) {
    switch (u->type) {
    case TS_SWIM_UP_ALIVE: return TS_SWIM_WIRE_ALIVE;
    case TS_SWIM_UP_LEAVE: return TS_SWIM_WIRE_LEAVE;
    case TS_SWIM_UP_SUSPECT:
    case TS_SWIM_UP_DEAD: return TS_SWIM_WIRE_ACCUSE;
    default: return 0;
    }
}

size_t ts_swim_wire_base_size(int msg_type) {
    switch (msg_type) {
    case TS_SWIM_PING: return TS_SWIM_WIRE_HEADER + 4 + TS_SWIM_ID_LEN + 1;
    case TS_SWIM_ACK: return TS_SWIM_WIRE_HEADER + 4 + 1 + 1;
    case TS_SWIM_NACK: return TS_SWIM_WIRE_HEADER + 4 + 1;
    case TS_SWIM_PING_REQ: return TS_SWIM_WIRE_HEADER + 4 + TS_SWIM_ID_LEN + TS_SWIM_WIRE_ADDR + 1;
    case TS_SWIM_GOSSIP: return TS_SWIM_WIRE_HEADER + 1;
    default: return 0;
    }
}

size_t ts_swim_wire_msg_size(const ts_swim_msg_t *m) {
    size_t n = ts_swim_wire_base_size(m->type);
    if (n == 0 || m->n_updates > TS_SWIM_MAX_UPDATES)
        return 0;
    for (int i = 0; i < m->n_updates; i++) {
        size_t u = ts_swim_wire_update_size(&m->updates[i]);
        if (u == 0)
            return 0;
        n += u;
    }
    return n;
}

int ts_swim_wire_encode(const ts_swim_msg_t *m, uint8_t *buf, size_t cap, size_t *len) {
    if (!m || !buf || !len)
        return TS_EINVAL;
    size_t need = ts_swim_wire_msg_size(m);
    if (need == 0 || (m->type == TS_SWIM_ACK && (m->flags & ~TS_SWIM_ACK_WHO_ARE_YOU)))
        return TS_EINVAL;
    if (need > cap || need > TS_SWIM_PLAIN_MAX)
        return TS_ERANGE;
    wcur_t w = {buf, buf + cap, 0};
    put_u8(&w, TS_SWIM_WIRE_VERSION);
    put_u8(&w, m->type);
    put(&w, m->from, TS_SWIM_ID_LEN);
    switch (m->type) {
    case TS_SWIM_PING:
        put_u32(&w, m->seq);
        put(&w, m->target, TS_SWIM_ID_LEN);
        break;
    case TS_SWIM_ACK:
        put_u32(&w, m->seq);
        put_u8(&w, m->flags);
        break;
    case TS_SWIM_NACK: put_u32(&w, m->seq); break;
    case TS_SWIM_PING_REQ:
        put_u32(&w, m->seq);
        put(&w, m->target, TS_SWIM_ID_LEN);
        put_addr(&w, &m->target_addr);
        break;
    default: break; /* gossip: no body */
    }
    put_u8(&w, m->n_updates);
    for (int i = 0; i < m->n_updates; i++) {
        int rc = put_update(&w, &m->updates[i]);
        if (rc != TS_OK)
            return rc;
    }
    if (w.overflow || (size_t)(w.p - buf) != need)
        return TS_ERANGE; /* cannot happen: need was computed from the same sizes */
    *len = need;
    return TS_OK;
}

int ts_swim_wire_decode(const uint8_t *buf, size_t len, ts_swim_msg_t *m) {
    if (!m)
        return TS_EINVAL;
    memset(m, 0, sizeof *m);
    if (!buf || len == 0)
        return TS_ECORRUPT;
    if (buf[0] != TS_SWIM_WIRE_VERSION)
        return TS_ENOTSUP;
    if (len > TS_SWIM_PLAIN_MAX)
        return TS_ECORRUPT;
    rcur_t r = {buf + 1, buf + len, 0};
    m->type = get_u8(&r);
    get(&r, m->from, TS_SWIM_ID_LEN);
    switch (m->type) {
    case TS_SWIM_PING:
        m->seq = get_u32(&r);
        get(&r, m->target, TS_SWIM_ID_LEN);
        break;
    case TS_SWIM_ACK:
        m->seq = get_u32(&r);
        m->flags = get_u8(&r);
        if (m->flags & ~TS_SWIM_ACK_WHO_ARE_YOU)
            r.bad = 1; /* unknown flags: a later version's */
        break;
    case TS_SWIM_NACK: m->seq = get_u32(&r); break;
    case TS_SWIM_PING_REQ:
        m->seq = get_u32(&r);
        get(&r, m->target, TS_SWIM_ID_LEN);
        get_addr(&r, &m->target_addr);
        break;
    case TS_SWIM_GOSSIP: break;
    default: r.bad = 1; break;
    }
    uint8_t n = get_u8(&r);
    if (n > TS_SWIM_MAX_UPDATES)
        r.bad = 1;
    for (int i = 0; i < n && !r.bad; i++)
        get_update(&r, get_u8(&r), &m->updates[i]);
    if (r.bad || r.p != r.end) {
        memset(m, 0, sizeof *m);
        return TS_ECORRUPT;
    }
    m->n_updates = n;
    return TS_OK;
}

/* ---- push-pull states -------------------------------------------------------------------- */

/* A member entry is consistent when its state is known, a LEFT member carries its leave claim
 * and any other its alive claim, and the state's incarnation is not older than the claim's. */
static int entry_ok(const ts_swim_member_info_t *e) {
    if (e->state < TS_SWIM_ALIVE || e->state > TS_SWIM_LEFT)
        return 0;
    int want = e->state == TS_SWIM_LEFT ? TS_SWIM_CLAIM_LEAVE : TS_SWIM_CLAIM_ALIVE;
    return e->claim.kind == want && e->incarnation >= e->claim.incarnation;
}

/* The header of a push-pull message: version, type (must be want), sender. TS_ENOTSUP for
 * another version, TS_ECORRUPT for another type or a short input. */
static int get_header(rcur_t *r, uint8_t want, uint8_t from[TS_SWIM_ID_LEN]) {
    uint8_t version = get_u8(r);
    if (!r->bad && version != TS_SWIM_WIRE_VERSION)
        return TS_ENOTSUP;
    uint8_t type = get_u8(r);
    get(r, from, TS_SWIM_ID_LEN);
    return r->bad || type != want ? TS_ECORRUPT : TS_OK;
}

/* The entries of a state or a diff: per member, state (1), state incarnation (4), and its claim
 * encoded as an alive or leave update. */
static int put_entries(wcur_t *w, const ts_swim_member_info_t *entries, uint32_t n) {
    put_u32(w, n);
    for (uint32_t i = 0; i < n; i++) {
        const ts_swim_member_info_t *e = &entries[i];
        ts_swim_update_t u = {.type = e->claim.kind == TS_SWIM_CLAIM_LEAVE ? TS_SWIM_UP_LEAVE
                                                                           : TS_SWIM_UP_ALIVE};
        u.u.claim = e->claim;
        put_u8(w, e->state);
        put_u32(w, e->incarnation);
        int rc = put_update(w, &u);
        if (rc != TS_OK)
            return rc;
    }
    return TS_OK;
}

/* Reads the count and the entries to the end of the input; TS_ERANGE for more than max,
 * TS_ECORRUPT for anything malformed (out then zeroed). */
static int get_entries(rcur_t *r, ts_swim_member_info_t *out, uint32_t max, uint32_t *n) {
    uint32_t count = get_u32(r);
    if (r->bad)
        return TS_ECORRUPT;
    if (count > max)
        return TS_ERANGE;
    /* every entry takes at least 1 + 4 + a leave's bytes: a count the input cannot hold is
     * corrupt before anything is decoded */
    if (count > (size_t)(r->end - r->p) / (1 + 4 + TS_SWIM_WIRE_LEAVE))
        return TS_ECORRUPT;
    for (uint32_t i = 0; i < count && !r->bad; i++) {
        ts_swim_member_info_t *e = &out[i];
        memset(e, 0, sizeof *e);
        e->state = get_u8(r);
        e->incarnation = get_u32(r);
        uint8_t t = get_u8(r);
        if (t != TS_SWIM_UP_ALIVE && t != TS_SWIM_UP_LEAVE) {
            r->bad = 1;
            break;
        }
        ts_swim_update_t u;
        get_update(r, t, &u);
        e->claim = u.u.claim;
        if (!r->bad && !entry_ok(e))
            r->bad = 1;
    }
    if (r->bad || r->p != r->end) {
        memset(out, 0, sizeof *out * count);
        return TS_ECORRUPT;
    }
    *n = count;
    return TS_OK;
}

static size_t entries_size(const ts_swim_member_info_t *entries, uint32_t n) {
    size_t size = 4;
    for (uint32_t i = 0; i < n; i++)
        size += 1 + 4 +
                (entries[i].claim.kind == TS_SWIM_CLAIM_LEAVE ? TS_SWIM_WIRE_LEAVE
                                                              : TS_SWIM_WIRE_ALIVE);
    return size;
}

/* A state or a diff, need bytes: version, type, sender, what sits between the sender and the
 * entries (a state's join byte, a diff's mask), then the entries. */
static int encode_members(uint8_t type, const uint8_t from[TS_SWIM_ID_LEN], const uint8_t *mid,
                          size_t mid_len, const ts_swim_member_info_t *entries, uint32_t n,
                          size_t need, uint8_t *buf, size_t cap, size_t *len) {
    if (need > cap)
        return TS_ERANGE;
    wcur_t w = {buf, buf + cap, 0};
    put_u8(&w, TS_SWIM_WIRE_VERSION);
    put_u8(&w, type);
    put(&w, from, TS_SWIM_ID_LEN);
    put(&w, mid, mid_len);
    int rc = put_entries(&w, entries, n);
    if (rc != TS_OK)
        return rc;
    if (w.overflow || (size_t)(w.p - buf) != need)
        return TS_ERANGE;
    *len = need;
    return TS_OK;
}

size_t ts_swim_wire_state_size(const ts_swim_member_info_t *entries, uint32_t n) {
    return TS_SWIM_WIRE_STATE_HEADER - 4 + entries_size(entries, n);
}

int ts_swim_wire_encode_state(const uint8_t from[TS_SWIM_ID_LEN], bool join,
                              const ts_swim_member_info_t *entries, uint32_t n, uint8_t *buf,
                              size_t cap, size_t *len) {
    if (!from || (!entries && n > 0) || !buf || !len)
        return TS_EINVAL;
    for (uint32_t i = 0; i < n; i++)
        if (!entry_ok(&entries[i]))
            return TS_EINVAL;
    uint8_t join_byte = join ? 1 : 0;
    return encode_members(TYPE_STATE, from, &join_byte, 1, entries, n,
                          ts_swim_wire_state_size(entries, n), buf, cap, len);
}

int ts_swim_wire_decode_state(const uint8_t *buf, size_t len, uint8_t from[TS_SWIM_ID_LEN],
                              bool *join, ts_swim_member_info_t *out, uint32_t max, uint32_t *n) {
    if (!buf || !from || !join || (!out && max > 0) || !n)
        return TS_EINVAL;
    *n = 0;
    rcur_t r = {buf, buf + len, 0};
    int rc = get_header(&r, TYPE_STATE, from);
    if (rc != TS_OK)
        return rc;
    uint8_t join_byte = get_u8(&r);
    if (r.bad || join_byte > 1)
        return TS_ECORRUPT;
    rc = get_entries(&r, out, max, n);
    if (rc != TS_OK)
        return rc;
    *join = join_byte == 1;
    return TS_OK;
}

/* ---- push-pull by digests ---------------------------------------------------------------- */

int ts_swim_wire_tcp_type(const uint8_t *buf, size_t len) {
    if (!buf || len < 2 || buf[0] != TS_SWIM_WIRE_VERSION)
        return 0;
    return buf[1] == TYPE_STATE || buf[1] == TYPE_DIGEST || buf[1] == TYPE_DIFF ? buf[1] : 0;
}

int ts_swim_wire_encode_digest(const uint8_t from[TS_SWIM_ID_LEN], const ts_swim_digest_t *d,
                               uint8_t *buf, size_t cap, size_t *len) {
    if (!from || !d || !buf || !len)
        return TS_EINVAL;
    if (cap < TS_SWIM_WIRE_DIGEST)
        return TS_ERANGE;
    wcur_t w = {buf, buf + cap, 0};
    put_u8(&w, TS_SWIM_WIRE_VERSION);
    put_u8(&w, TYPE_DIGEST);
    put(&w, from, TS_SWIM_ID_LEN);
    put_u16(&w, TS_SWIM_DIGEST_BUCKETS);
    for (uint32_t i = 0; i < TS_SWIM_DIGEST_BUCKETS; i++)
        put_u64(&w, d->bucket[i]);
    *len = TS_SWIM_WIRE_DIGEST;
    return w.overflow ? TS_ERANGE : TS_OK;
}

int ts_swim_wire_decode_digest(const uint8_t *buf, size_t len, uint8_t from[TS_SWIM_ID_LEN],
                               ts_swim_digest_t *d) {
    if (!buf || !from || !d)
        return TS_EINVAL;
    memset(d, 0, sizeof *d);
    rcur_t r = {buf, buf + len, 0};
    int rc = get_header(&r, TYPE_DIGEST, from);
    if (rc == TS_ENOTSUP)
        return rc;
    uint16_t buckets = get_u16(&r);
    for (uint32_t i = 0; i < TS_SWIM_DIGEST_BUCKETS; i++)
        d->bucket[i] = get_u64(&r);
    if (rc != TS_OK || r.bad || buckets != TS_SWIM_DIGEST_BUCKETS || r.p != r.end) {
        memset(d, 0, sizeof *d);
        memset(from, 0, TS_SWIM_ID_LEN);
        return TS_ECORRUPT;
    }
    return TS_OK;
}

static bool in_mask(const uint8_t mask[TS_SWIM_DIGEST_MASK_BYTES], const uint8_t *id) {
    uint32_t b = ts_swim_digest_bucket(id);
    return (mask[b / 8] >> (b % 8)) & 1u;
}

size_t ts_swim_wire_diff_size(const ts_swim_member_info_t *entries, uint32_t n) {
    return TS_SWIM_WIRE_DIFF_HEADER - 4 + entries_size(entries, n);
}

int ts_swim_wire_encode_diff(const uint8_t from[TS_SWIM_ID_LEN],
                             const uint8_t mask[TS_SWIM_DIGEST_MASK_BYTES],
                             const ts_swim_member_info_t *entries, uint32_t n, uint8_t *buf,
                             size_t cap, size_t *len) {
    if (!from || !mask || (!entries && n > 0) || !buf || !len)
        return TS_EINVAL;
    for (uint32_t i = 0; i < n; i++)
        if (!entry_ok(&entries[i]) || !in_mask(mask, entries[i].claim.id))
            return TS_EINVAL;
    return encode_members(TYPE_DIFF, from, mask, TS_SWIM_DIGEST_MASK_BYTES, entries, n,
                          ts_swim_wire_diff_size(entries, n), buf, cap, len);
}

int ts_swim_wire_decode_diff(const uint8_t *buf, size_t len, uint8_t from[TS_SWIM_ID_LEN],
                             uint8_t mask[TS_SWIM_DIGEST_MASK_BYTES], ts_swim_member_info_t *out,
                             uint32_t max, uint32_t *n) {
    if (!buf || !from || !mask || (!out && max > 0) || !n)
        return TS_EINVAL;
    *n = 0;
    memset(mask, 0, TS_SWIM_DIGEST_MASK_BYTES);
    rcur_t r = {buf, buf + len, 0};
    int rc = get_header(&r, TYPE_DIFF, from);
    if (rc != TS_OK)
        return rc;
    get(&r, mask, TS_SWIM_DIGEST_MASK_BYTES);
    if (r.bad) {
        memset(mask, 0, TS_SWIM_DIGEST_MASK_BYTES);
        return TS_ECORRUPT;
    }
    uint32_t count = 0;
    rc = get_entries(&r, out, max, &count);
    for (uint32_t i = 0; rc == TS_OK && i < count; i++)
        if (!in_mask(mask, out[i].claim.id)) {
            /* a member outside the buckets the diff says it answers */
            memset(out, 0, sizeof *out * count);
            rc = TS_ECORRUPT;
        }
    if (rc != TS_OK) {
        memset(mask, 0, TS_SWIM_DIGEST_MASK_BYTES);
        return rc;
    }
    *n = count;
    return TS_OK;
}

/* ---- signed bytes ------------------------------------------------------------------------ */

size_t ts_swim_claim_signed_bytes(const ts_swim_claim_t *c, uint8_t buf[TS_SWIM_SIGNED_MAX]) {
    if (c->kind != TS_SWIM_CLAIM_ALIVE && c->kind != TS_SWIM_CLAIM_LEAVE)
        return 0;
    wcur_t w = {buf, buf + TS_SWIM_SIGNED_MAX, 0};
    put(&w, c->kind == TS_SWIM_CLAIM_ALIVE ? TAG_ALIVE : TAG_LEAVE, 20);
    put_claim_body(&w, c);
    return w.overflow ? 0 : (size_t)(w.p - buf);
}
