/*
 * frame.h — the wire's framing, as a pure codec: bytes in, messages out, no I/O (architecture.md
 * §5, docs/protocol.md).
 *
 * A TCP connection carries two nested length-prefixed layers:
 *
 *   TCP bytes ──► [len16 ‖ Noise message] [len16 ‖ Noise message] …       Noise-message layer
 *                         │ decrypted by net/noise (not here)
 *                         ▼
 *   plaintext ──► [len32 ‖ Envelope] [len32 ‖ Envelope] …                  application layer
 *
 * Both lengths are big-endian and count the bytes after the prefix. A Noise message is 1..65535
 * bytes. An application frame is 1..max_frame bytes and its bytes run across the plaintexts of
 * as many Noise messages as it needs; the two layers' boundaries need not line up. One reader
 * type, ts_frame_reader_t, reassembles either layer from pieces of any size (one byte at a time
 * works). UDP gossip datagrams are not Envelopes (net/swim_wire.h encodes them; net/gossip.c
 * seals them).
 *
 * Memory. A reader grows its buffer only as bytes of a message actually arrive — never to the
 * length a prefix merely announces — and refuses a length over its limit before allocating
 * anything, so it holds at most min(limit, what was received) bytes plus a constant. A message
 * that arrives whole inside one input piece is returned in place, without a copy.
 *
 * Envelopes (proto/tessera.proto) are decoded by protobuf-c through an allocator with a budget
 * of TS_FRAME_DECODE_FACTOR × frame length + TS_FRAME_DECODE_SLACK bytes, so a hostile frame
 * cannot make the decoder allocate much more than the frame itself; decoding then checks every
 * validity rule of docs/protocol.md (ts_frame_check_envelope).
 *
 * What it is not: the Noise handshake and transport (net/noise), sockets (libuv), the gossip
 * protocol, or the request/response bookkeeping of RPC. Nothing here blocks, and nothing here
 * keeps global state.
 *
 * Errors. Every function that can fail returns 0 or a negative TS_E* code and writes a sentence
 * into err (may be NULL). A reader that met a protocol error stays failed: the connection must
 * be closed, since the byte stream cannot be resynchronised.
 */
#ifndef TS_FRAME_H
#define TS_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/tensor.h"
#include "proto/tessera.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- limits of the wire (docs/protocol.md, "Limits") ------------------------------------- */

#define TS_FRAME_NOISE_MAX 65535u /* bytes in one Noise message */
#define TS_FRAME_NOISE_TAG 16u    /* ChaChaPoly tag in each transport message */
#define TS_FRAME_NOISE_PLAINTEXT_MAX (TS_FRAME_NOISE_MAX - TS_FRAME_NOISE_TAG) /* 65519 */
#define TS_FRAME_MAX_DEFAULT (64u << 20) /* max_frame: 64 MiB */
#define TS_FRAME_MAX_LIMIT (1u << 30)    /* the largest max_frame a reader accepts */
#define TS_FRAME_APP_HEADER 4u           /* bytes of the application length prefix */
#define TS_FRAME_NOISE_HEADER 2u         /* bytes of the Noise length prefix */

#define TS_FRAME_ID_BYTES 32u                /* node ids, partition ids, weights and chunk hashes */
#define TS_FRAME_SIGNATURE_BYTES 64u         /* Ed25519 */
#define TS_FRAME_MAX_DIMS 4                  /* of a Tensor */
#define TS_FRAME_CENTROID_MAX 4096           /* elements of an advert's centroid */
#define TS_FRAME_DEVICE_MAX 127              /* bytes of an advert's capacity.device */
#define TS_FRAME_ADDR_MAX 255                /* bytes of one "host:port" (as store/peers.h) */
#define TS_FRAME_MESSAGE_MAX 1024            /* bytes of an Error's message */
#define TS_FRAME_CIRCUIT_BYTES 16            /* a relay circuit's token (RelayEvent.circuit) */
#define TS_FRAME_DATAGRAM_MAX 2048           /* bytes of a relayed gossip datagram */
#define TS_FRAME_SIGNED_BODY_MAX (64u << 10) /* bytes of the body of a signed statement */
#define TS_FRAME_CHUNK_MIN (4u << 10)        /* a manifest's chunk_size, at least */
#define TS_FRAME_CHUNK_MAX (16u << 20)       /* and at most; also the most bytes in a Chunk */
#define TS_FRAME_WEIGHTS_MAX ((uint64_t)1 << 40) /* a weights file's total_size, at most */
#define TS_FRAME_MEMORY_MAX ((uint64_t)1 << 50)  /* capacity.model_bytes, row_bytes: 1 PiB */
#define TS_FRAME_CFG_SCALE_MAX 100.0f            /* |cfg_scale| */

/* protobuf-c's allocations while decoding a frame of n bytes stay within
 * FACTOR · n + SLACK bytes (counted cumulatively, freed memory included); past that the frame
 * is refused with TS_ERANGE. A legitimate encoding needs under half of this (tests/test_frame.c
 * measures it); an encoding built to blow up — thousands of empty sub-messages or unpacked
 * repeated scalars, each a few bytes on the wire and a struct in memory — hits the budget. */
#define TS_FRAME_DECODE_FACTOR 8u
#define TS_FRAME_DECODE_SLACK (64u << 10)

/* The context of a signed advert: the signature is Ed25519 over
 * context ‖ 0x00 ‖ node_id (32 bytes) ‖ body, by the key node_id. The advert's hash, which the
 * node's gossip claim announces, is BLAKE2b-256 of body. */
#define TS_FRAME_CONTEXT_ADVERT "tessera/advert/1"

/* ---- length prefixes (writing) ------------------------------------------------------------ */

/* Writes the 2-byte big-endian prefix of a Noise message of len bytes into out.
 * TS_ERANGE unless 1 ≤ len ≤ TS_FRAME_NOISE_MAX. */
int ts_frame_put_noise_len(uint8_t out[TS_FRAME_NOISE_HEADER], size_t len);
/* Writes the 4-byte big-endian prefix of an application frame of len bytes into out.
 * TS_ERANGE unless 1 ≤ len ≤ max_frame. */
int ts_frame_put_app_len(uint8_t out[TS_FRAME_APP_HEADER], size_t len, uint32_t max_frame);

/* ---- readers: reassembling length-prefixed messages -------------------------------------- */

typedef struct ts_frame_reader {
    uint32_t max;     /* longest message accepted */
    uint8_t hdr_size; /* TS_FRAME_NOISE_HEADER or TS_FRAME_APP_HEADER */
    uint8_t hdr_have; /* prefix bytes read of the current message */
    uint8_t hdr[TS_FRAME_APP_HEADER];
    uint32_t len; /* the current message's length, once its prefix is complete */
    size_t have;  /* its bytes buffered so far */
    uint8_t *buf; /* malloc'd, cap bytes; grows with what arrives */
    size_t cap;
    int delivered; /* buf holds the message returned by the last feed */
    int failed;    /* the sticky protocol error, or 0 */
} ts_frame_reader_t;

/* A reader of Noise messages (2-byte prefixes, 1..65535 bytes). */
void ts_frame_reader_init_noise(ts_frame_reader_t *r);
/* A reader of application frames (4-byte prefixes, 1..max_frame bytes). TS_EINVAL unless
 * 1 ≤ max_frame ≤ TS_FRAME_MAX_LIMIT; r is then zeroed (ts_frame_reader_free is harmless) and
 * every feed fails with TS_EINVAL. */
int ts_frame_reader_init_app(ts_frame_reader_t *r, uint32_t max_frame);
/* Releases the buffer; r may be initialised again. NULL-safe. */
void ts_frame_reader_free(ts_frame_reader_t *r);

/* Consumes bytes from in[0, len) until one message is complete or the input is used up, and
 * sets *used to the bytes consumed. When a message is complete, *msg and *msg_len describe it
 * (the prefix excluded) and the bytes after it are left unconsumed: call again with the rest.
 * Otherwise *msg is NULL and *used is len. *msg points either into in (when the message lay
 * whole inside it) or into the reader's buffer; either way it is valid until the next call on
 * r, and no longer than in is.
 *
 * Errors, which end the stream for good (every later call returns the same code):
 *   TS_ECORRUPT  a zero length prefix (a message is never empty);
 *   TS_ERANGE    a length prefix over the reader's limit, refused before any allocation.
 * TS_ENOMEM (buffer growth failed) is not sticky: *used bytes were consumed, and the call may be
 * retried with the rest.
 * TS_EINVAL for NULL arguments (in may be NULL when len is 0). */
int ts_frame_reader_feed(ts_frame_reader_t *r, const uint8_t *in, size_t len, size_t *used,
                         const uint8_t **msg, size_t *msg_len, char *err, size_t errlen);

/* Writing a body in place, for a caller that produces bytes (decrypts them) rather than holding
 * them: it writes them straight into the reader's buffer instead of into a buffer of its own
 * that feed would copy from. When r is inside a message's body (its prefix complete) and at
 * least n (≥ 1) of its bytes are still to come, ts_frame_reader_body_space makes room for n
 * more bytes (growing the buffer as feed would) and returns where they go; the caller writes
 * exactly n bytes there, then calls ts_frame_reader_commit. Otherwise it returns NULL and the
 * caller feeds the bytes as usual: between messages, when n runs past the message, after a
 * failure, or when memory ran out. The caller must already hold the n bytes' worth of input
 * (the ciphertext they come from), so that the buffer still grows only with what arrived. */
uint8_t *ts_frame_reader_body_space(ts_frame_reader_t *r, size_t n);
/* Counts the n bytes written at ts_frame_reader_body_space(r, n). When they complete the
 * message, *msg and *msg_len describe it, as ts_frame_reader_feed's would (valid until the next
 * call on r); otherwise *msg is NULL. */
void ts_frame_reader_commit(ts_frame_reader_t *r, size_t n, const uint8_t **msg, size_t *msg_len);

/* 1 when r is between messages (no partial prefix or body pending): an end of stream now is a
 * clean close, otherwise it truncated a message. */
int ts_frame_reader_idle(const ts_frame_reader_t *r);
/* Heap bytes r holds now (its buffer's capacity). */
size_t ts_frame_reader_held(const ts_frame_reader_t *r);

/* ---- envelopes ------------------------------------------------------------------------------ */

/* Checks that are optional because they read every element of every tensor. */
#define TS_FRAME_CHECK_FINITE 1u /* every F32/F16/BF16 tensor value is finite, else TS_ENONFINITE */

/* Validates env (ts_frame_check_envelope with flags), then encodes it as one whole application
 * frame — 4-byte prefix and Envelope — into *out (malloc'd, *out_len bytes; the caller frees).
 * TS_ERANGE when the Envelope would be longer than max_frame; TS_EINVAL when a message in it
 * carries an unknown field numbered 0 or over 2^29 − 1 (no decoder would accept the bytes). */
int ts_frame_encode_envelope(const Tessera__Envelope *env, unsigned flags, uint32_t max_frame,
                             uint8_t **out, size_t *out_len, char *err, size_t errlen);

/* Parses data[0, len) — one application frame without its prefix — under the decode budget, and checks it (ts_frame_check_envelope with flags). On
 * success *out is the Envelope (free with ts_frame_free); on failure *out is NULL and:
 *   TS_ECORRUPT  not a protobuf Envelope (an unknown field numbered 0 or over 2^29 − 1, at
 *                any depth, included), or one that breaks a validity rule;
 *   TS_ERANGE    the encoding would exceed the decode budget, or a value is out of range;
 *   TS_ENOTSUP   the body is of a kind this version does not know (a newer peer);
 *   TS_ESHAPE, TS_EDTYPE, TS_ENONFINITE  a tensor's shape, dtype or values are bad;
 *   TS_ENOMEM    memory ran out (not the peer's fault).
 * To answer a request whose envelope parses but fails a rule, use ts_frame_unpack_envelope and
 * ts_frame_check_envelope separately: the parsed envelope carries the request id. */
int ts_frame_decode_envelope(const uint8_t *data, size_t len, unsigned flags,
                             Tessera__Envelope **out, char *err, size_t errlen);
/* The parse step alone (TS_ECORRUPT, TS_ERANGE, TS_ENOMEM as above): on success *out is the
 * Envelope, unchecked (free with ts_frame_free); on failure *out is NULL. */
int ts_frame_unpack_envelope(const uint8_t *data, size_t len, Tessera__Envelope **out, char *err,
                             size_t errlen);
/* The check step alone: every rule of docs/protocol.md that a single envelope can be checked
 * against (not those that need context, such as whether a response matches its request or a
 * shape fits an expert). The body of a signed advert is bytes here; it is checked by
 * ts_frame_decode_advert_body after its signature has been verified. A hand-built env must be
 * made of initialised protobuf-c structs with no NULL where a count says there are elements;
 * a NULL body is TS_EINVAL. */
int ts_frame_check_envelope(const Tessera__Envelope *env, unsigned flags, char *err, size_t errlen);

/* Decodes and checks the body of a signed advert (after its signature checked out). On success
 * *out is the body (free with ts_frame_free); errors as ts_frame_decode_envelope. */
int ts_frame_decode_advert_body(const ProtobufCBinaryData *body, unsigned flags,
                                Tessera__AdvertBody **out, char *err, size_t errlen);
/* The checks alone, for a body about to be serialized and signed. */
int ts_frame_check_advert_body(const Tessera__AdvertBody *b, unsigned flags, char *err,
                               size_t errlen);

/* Frees a message returned by a ts_frame_unpack_* or ts_frame_decode_* function. NULL-safe. */
void ts_frame_free(void *msg);

/* The body field's name ("denoise_request"), "none" when unset, "unknown" otherwise. */
const char *ts_frame_body_name(Tessera__Envelope__BodyCase c);

/* ---- tensors ------------------------------------------------------------------------------- */

/* Masks of dtypes for ts_frame_check_tensor. */
#define TS_FRAME_DTYPE_BIT(d) (1u << (unsigned)(d))
#define TS_FRAME_DTYPES_FLOAT                                                                      \
    (TS_FRAME_DTYPE_BIT(TESSERA__DTYPE__DTYPE_F32) |                                               \
     TS_FRAME_DTYPE_BIT(TESSERA__DTYPE__DTYPE_F16) |                                               \
     TS_FRAME_DTYPE_BIT(TESSERA__DTYPE__DTYPE_BF16))

/* Checks a wire tensor: a known dtype in allowed (a TS_FRAME_DTYPE_BIT mask),
 * 1..4 dims each ≥ 1, no overflow, product × dtype size = data bytes, and with
 * TS_FRAME_CHECK_FINITE finite values. what names it in err ("denoise_request.x_t"). */
int ts_frame_check_tensor(const Tessera__Tensor *w, unsigned allowed, unsigned flags,
                          const char *what, char *err, size_t errlen);

/* Points w at t's shape and data, without copying: w stays valid while t is alive and
 * unchanged. t must be a CPU tensor of F32, F16 or BF16 (TS_EDTYPE, TS_EDEVICE otherwise).
 * The wire is little-endian: TS_ENOTSUP on a big-endian host. */
int ts_frame_tensor_set(Tessera__Tensor *w, const ts_tensor_t *t);
/* Makes *t a non-owning CPU view of a checked wire tensor's data (valid while w is). TS_EINVAL
 * for a tensor that fails ts_frame_check_tensor; TS_ENOTSUP on a big-endian host. */
int ts_frame_tensor_view(const Tessera__Tensor *w, ts_tensor_t *t);

#ifdef __cplusplus
}
#endif

#endif
