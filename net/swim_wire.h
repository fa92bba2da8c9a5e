/*
 * swim_wire.h — the bytes of gossip: a compact, bounded, versioned binary encoding of the
 * structs in swim.h.
 *
 * Five things are encoded here: a UDP datagram (ts_swim_msg_t, at most TS_SWIM_PLAIN_MAX bytes
 * before the transport seals it), a push-pull full state (a list of ts_swim_member_info_t, sent
 * over the secure TCP link), push-pull's digest and diff (the same link), and the bytes a
 * claim's signature covers. The layouts are in
 * docs/protocol.md ("Gossip packets"); all integers are big-endian; every field has a fixed
 * size, so an encoding is canonical: bytes that decode re-encode to the same bytes.
 *
 * Decoding never trusts a length: a truncated, overlong or malformed input is TS_ECORRUPT, an
 * input of another wire version TS_ENOTSUP, and neither writes a half-filled struct that could
 * be mistaken for a message (the output is zeroed first).
 */
#ifndef TS_SWIM_WIRE_H
#define TS_SWIM_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "net/swim.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_SWIM_WIRE_VERSION 1

/* Encoded sizes. A datagram is a header (version, type, sender id), a type-specific body, a
 * count byte and the updates; each update is a type byte and a fixed body. */
#define TS_SWIM_WIRE_HEADER 34 /* 1 version + 1 type + 32 sender id */
#define TS_SWIM_WIRE_ADDR 18   /* 16 ip + 2 port */
#define TS_SWIM_WIRE_ALIVE 159 /* 1 + 32 id + 4 inc + 18 addr + 8 advert ver + 32 hash + 64 sig */
#define TS_SWIM_WIRE_ACCUSE 69 /* 1 + 32 id + 4 inc + 32 from (suspect, dead) */
#define TS_SWIM_WIRE_LEAVE 101 /* 1 + 32 id + 4 inc + 64 sig */
#define TS_SWIM_WIRE_STATE_HEADER 39 /* 1 version + 1 type + 32 sender + 1 join + 4 count */

/* The bytes a claim's signature covers: a 20-byte domain tag ("tessera/swim/alive/1" or
 * "tessera/swim/leave/1"), then the claim's fields as encoded on the wire, without sig. */
#define TS_SWIM_SIGNED_MAX 114

/* The encoded size of one update (0 for an unknown type). */
size_t ts_swim_wire_update_size(const ts_swim_update_t *u);
/* The encoded size of a message's header, body and count byte, without updates (0 for an
 * unknown type). */
size_t ts_swim_wire_base_size(int msg_type);
/* The encoded size of the whole message (0 if it has an unknown type or too many updates). */
size_t ts_swim_wire_msg_size(const ts_swim_msg_t *m);

/* Encodes m into buf[0..cap); *len is the size. TS_EINVAL for an unknown message or update
 * type, more than TS_SWIM_MAX_UPDATES updates, a claim whose kind does not match its update
 * type, or unknown ACK flags; TS_ERANGE when the encoding exceeds cap or TS_SWIM_PLAIN_MAX.
 * On error buf's contents are unspecified. */
int ts_swim_wire_encode(const ts_swim_msg_t *m, uint8_t *buf, size_t cap, size_t *len);
/* Decodes a datagram. TS_ENOTSUP for another wire version, TS_ECORRUPT for anything that is not
 * exactly one well-formed message. On error *m is zeroed. */
int ts_swim_wire_decode(const uint8_t *buf, size_t len, ts_swim_msg_t *m);

/* A push-pull full state: sender id, whether the sender is joining, n members. */
size_t ts_swim_wire_state_size(const ts_swim_member_info_t *entries, uint32_t n);
/* TS_EINVAL for an entry whose state or claim kind is invalid (LEFT ⇔ a leave claim), or whose
 * state incarnation is below its claim's; TS_ERANGE when it does not fit in cap. */
int ts_swim_wire_encode_state(const uint8_t from[TS_SWIM_ID_LEN], bool join,
                              const ts_swim_member_info_t *entries, uint32_t n, uint8_t *buf,
                              size_t cap, size_t *len);
/* Decodes at most max entries (TS_ERANGE for more: the receiver bounds what it accepts before
 * anything is read). change_ms is not on the wire and decodes as 0. TS_ECORRUPT / TS_ENOTSUP as
 * for datagrams. */
int ts_swim_wire_decode_state(const uint8_t *buf, size_t len, uint8_t from[TS_SWIM_ID_LEN],
                              bool *join, ts_swim_member_info_t *out, uint32_t max, uint32_t *n);

/* Push-pull by digests (swim.h). A digest: sender id and a hash per bucket, always
 * TS_SWIM_WIRE_DIGEST bytes. A diff: sender id, the mask of buckets it answers, and the sender's
 * members in those buckets, laid out as in a state. */
#define TS_SWIM_WIRE_DIGEST (1 + 1 + TS_SWIM_ID_LEN + 2 + 8 * TS_SWIM_DIGEST_BUCKETS)
#define TS_SWIM_WIRE_DIFF_HEADER (1 + 1 + TS_SWIM_ID_LEN + TS_SWIM_DIGEST_MASK_BYTES + 4)

/* What an encoded push-pull message is: 6 a full state, 7 a digest, 8 a diff; 0 when it is
 * none of these or of another wire version (the decoders say which). */
int ts_swim_wire_tcp_type(const uint8_t *buf, size_t len);
/* TS_ERANGE when cap is below TS_SWIM_WIRE_DIGEST. */
int ts_swim_wire_encode_digest(const uint8_t from[TS_SWIM_ID_LEN], const ts_swim_digest_t *d,
                               uint8_t *buf, size_t cap, size_t *len);
/* TS_ENOTSUP for another wire version; TS_ECORRUPT for anything but exactly one digest of
 * TS_SWIM_DIGEST_BUCKETS buckets (d and from then zeroed). */
int ts_swim_wire_decode_digest(const uint8_t *buf, size_t len, uint8_t from[TS_SWIM_ID_LEN],
                               ts_swim_digest_t *d);
size_t ts_swim_wire_diff_size(const ts_swim_member_info_t *entries, uint32_t n);
/* TS_EINVAL as for a state, and for an entry outside the mask's buckets; TS_ERANGE when it
 * does not fit in cap. */
int ts_swim_wire_encode_diff(const uint8_t from[TS_SWIM_ID_LEN],
                             const uint8_t mask[TS_SWIM_DIGEST_MASK_BYTES],
                             const ts_swim_member_info_t *entries, uint32_t n, uint8_t *buf,
                             size_t cap, size_t *len);
/* At most max entries (TS_ERANGE for more); TS_ECORRUPT for a malformed diff or an entry
 * outside the mask (mask and out then zeroed), TS_ENOTSUP for another wire version. */
int ts_swim_wire_decode_diff(const uint8_t *buf, size_t len, uint8_t from[TS_SWIM_ID_LEN],
                             uint8_t mask[TS_SWIM_DIGEST_MASK_BYTES], ts_swim_member_info_t *out,
                             uint32_t max, uint32_t *n);

/* The signed bytes of c into buf (TS_SWIM_SIGNED_MAX bytes); returns their length, or 0 for a
 * claim of unknown kind. */
size_t ts_swim_claim_signed_bytes(const ts_swim_claim_t *c, uint8_t buf[TS_SWIM_SIGNED_MAX]);

#ifdef __cplusplus
}
#endif

#endif
