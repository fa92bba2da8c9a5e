/*
 * test_frame.c — the wire's framing and Envelope codec (net/frame.h).
 *
 * Covers: the length prefixes' bytes; the readers of both layers — a stream of every kind of
 * envelope fed whole, one byte at a time and in random pieces, a large frame split across many
 * Noise messages, a truncated stream that keeps waiting, zero and oversize lengths refused
 * before anything is allocated (counted by a wrapped malloc, see below), a buffer that grows
 * only with what arrives and is released after a large frame, a failed allocation that can be
 * retried; envelopes — a round trip of every body kind (decoded and re-encoded byte for byte),
 * golden bytes that pin field numbers, unknown and missing bodies, the request id and deadline
 * rules, garbage and every truncation refused; the validity rules of tensors (shape, size,
 * overflow, dtype, non-finite values of each float dtype) and of each message; the decode
 * budget, measured on hostile encodings that would expand and on large legitimate ones; the
 * signed bodies; ts_tensor_t ↔ wire; the message tables of docs/protocol.md against the
 * compiled schema (every message, field, number, type and enum value, both ways); and a
 * deterministic fuzz loop of random mutations of valid frames and of raw streams, which must
 * never crash, leak or break the rules (run it under the sanitizer build too).
 *
 * Not covered here: the Noise handshake and transport (test_noise), sockets, gossip.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/frame.h"
#include "tests/testutil.h"

/* ---- a counting allocator ------------------------------------------------------------------
 *
 * tests/CMakeLists.txt links this test with -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc, so
 * every such call made from net/ or from this file comes here first. (protobuf-c's own calls,
 * inside its shared library, are not wrapped; net/ makes all of decoding's allocations itself,
 * through its budget allocator.) g_fail_in makes the n-th next allocation fail. */

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);

static struct { size_t calls, total, largest; } g_alloc;
static int g_fail_in; /* 0: never; n: the n-th next allocation returns NULL */

static int count_alloc(size_t n) {
    g_alloc.calls++;
    g_alloc.total += n;
    if (n > g_alloc.largest)
        g_alloc.largest = n;
    return g_fail_in > 0 && --g_fail_in == 0;
}

void *__wrap_malloc(size_t n) { return count_alloc(n) ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t n, size_t size) {
    return count_alloc(n * size) ? NULL : __real_calloc(n, size);
}
void *__wrap_realloc(void *p, size_t n) { return count_alloc(n) ? NULL : __real_realloc(p, n); }

static void alloc_reset(void) {
    memset(&g_alloc, 0, sizeof g_alloc);
    g_fail_in = 0;
}

/* ---- small helpers ------------------------------------------------------------------------ */

#define SET(m, f, v) ((m).has_##f = 1, (m).f = (v))
#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static ProtobufCBinaryData bin(const void *p, size_t n) {
    return (ProtobufCBinaryData){n, (uint8_t *)p};
}

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Packs m into buf (cap bytes) without any check. */
static ProtobufCBinaryData pack_into(const void *m, uint8_t *buf, size_t cap) {
    size_t n = protobuf_c_message_get_packed_size(m);
    assert_true(n <= cap);
    assert_int_equal(protobuf_c_message_pack(m, buf), n);
    return bin(buf, n);
}

/* Packs m into a malloc'd buffer without any check (how a broken or hostile peer sends). */
static uint8_t *pack_raw(const void *m, size_t *len) {
    *len = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(*len ? *len : 1);
    assert_non_null(buf);
    assert_int_equal(protobuf_c_message_pack(m, buf), *len);
    return buf;
}

/* Packs e unchecked and decodes it as a receiver would; returns the code, err says why. */
static int decode_raw(const Tessera__Envelope *e, unsigned flags, char *err, size_t errlen) {
    size_t n;
    uint8_t *buf = pack_raw(e, &n);
    Tessera__Envelope *d = NULL;
    int rc = ts_frame_decode_envelope(buf, n, flags, &d, err, errlen);
    if (rc == TS_OK)
        assert_non_null(d);
    else
        assert_null(d);
    ts_frame_free(d);
    free(buf);
    return rc;
}

/* A varint and a field tag, for writing encodings by hand. */
static size_t put_varint(uint8_t *p, uint64_t v) {
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}
static size_t put_tag(uint8_t *p, unsigned field, unsigned wire) {
    return put_varint(p, (uint64_t)field << 3 | wire);
}

/* ---- one valid message of every kind ------------------------------------------------------ */

typedef struct {
    uint8_t node_a[32], node_b[32], hash[32], hash2[32], sig[64];
    float xt[2 * 1 * 4 * 4], vel[2 * 1 * 4 * 4];
    int64_t img_shape[4], centroid_shape[1];
    uint16_t centroid[16];
    float t[2];
    int32_t labels[2];
    char addr0[32], addr1[32], message[64];
    uint8_t chunk_data[100], state_bytes[80];
    uint8_t advert_bytes[16384];
    Tessera__Tensor x_t, velocity, centroid_t;
    Tessera__ModelConfig model;
    Tessera__Capacity capacity;
    Tessera__Load load;
    Tessera__AdvertBody advert_body;
    Tessera__Advert advert;
    Tessera__Ping ping;
    Tessera__Ack ack;
    Tessera__MemberState member[2];
    Tessera__MemberState *members[2];
    Tessera__PushPull push_pull;
    Tessera__AdvertRequest advert_request;
    Tessera__DenoiseRequest denoise_request;
    Tessera__Timings timings;
    Tessera__DenoiseResponse denoise_response;
    Tessera__WeightsManifestRequest manifest_request;
    ProtobufCBinaryData chunk_hashes[3];
    Tessera__WeightsManifest manifest;
    Tessera__ChunkRequest chunk_request;
    Tessera__Chunk chunk;
    Tessera__StatusRequest status_request;
    Tessera__DialBackRequest dial_back_request;
    Tessera__DialBackResponse dial_back_response;
    Tessera__Advert *adverts[1];
    Tessera__ClusterExperts cluster;
    Tessera__ClusterExperts *clusters[1];
    Tessera__ClusterRef uncovered;
    Tessera__ClusterRef *uncovereds[1];
    Tessera__Aggregates aggregates;
    Tessera__TrainingStatus own_training;
    Tessera__StatusResponse status_response;
    Tessera__Error error;
    Tessera__Busy busy;
    Tessera__Cancel cancel;
    Tessera__DenoiseResponse signed_answer;
    Tessera__Accusation accusation;
    Tessera__AccusationVerdict verdict;
    Tessera__Envelope env;
} samples_t;

static samples_t S;

/* Packs the advert's body into it (call again after changing the body). */
static void samples_sign(void) {
    S.advert.body = pack_into(&S.advert_body, S.advert_bytes, sizeof S.advert_bytes);
}

static void samples_init(void) {
    memset(&S, 0, sizeof S);
    memset(S.node_a, 0x11, 32);
    memset(S.node_b, 0x22, 32);
    memset(S.hash, 0x33, 32);
    memset(S.hash2, 0x35, 32);
    memset(S.sig, 0x44, 64);
    tu_rng_t r = {7};
    for (size_t i = 0; i < N_OF(S.xt); i++) {
        S.xt[i] = tu_rng_uniform(&r, -1.0f, 1.0f);
        S.vel[i] = tu_rng_uniform(&r, -2.0f, 2.0f);
    }
    for (size_t i = 0; i < N_OF(S.centroid); i++)
        S.centroid[i] = (uint16_t)(0x3C00 + i); /* F16 values just above 1 */
    for (size_t i = 0; i < sizeof S.chunk_data; i++)
        S.chunk_data[i] = (uint8_t)(i * 7);
    for (size_t i = 0; i < sizeof S.state_bytes; i++)
        S.state_bytes[i] = (uint8_t)(i * 13 + 1);
    S.img_shape[0] = 2, S.img_shape[1] = 1, S.img_shape[2] = 4, S.img_shape[3] = 4;
    S.centroid_shape[0] = 16;
    S.t[0] = 0.25f, S.t[1] = 1.0f;
    S.labels[0] = 3, S.labels[1] = 10; /* 10: the null class of a 10-class expert */
    strcpy(S.addr0, "10.0.0.1:7946");
    strcpy(S.addr1, "[fd00::1]:7946");
    strcpy(S.message, "no expert 3333… here");

    Tessera__Tensor *ts[] = {&S.x_t, &S.velocity, &S.centroid_t};
    for (size_t i = 0; i < N_OF(ts); i++)
        tessera__tensor__init(ts[i]);
    SET(S.x_t, dtype, TESSERA__DTYPE__DTYPE_F32);
    S.x_t.n_shape = 4, S.x_t.shape = S.img_shape;
    SET(S.x_t, data, bin(S.xt, sizeof S.xt));
    S.velocity = S.x_t;
    SET(S.velocity, data, bin(S.vel, sizeof S.vel));
    SET(S.centroid_t, dtype, TESSERA__DTYPE__DTYPE_F16);
    S.centroid_t.n_shape = 1, S.centroid_t.shape = S.centroid_shape;
    SET(S.centroid_t, data, bin(S.centroid, sizeof S.centroid));

    tessera__model_config__init(&S.model);
    SET(S.model, input_size, 28);
    SET(S.model, patch_size, 4);
    SET(S.model, in_channels, 1);
    SET(S.model, hidden_size, 128);
    SET(S.model, depth, 4);
    SET(S.model, num_heads, 4);
    SET(S.model, num_classes, 10);
    SET(S.model, mlp_ratio, 4);
    tessera__capacity__init(&S.capacity);
    SET(S.capacity, items_per_s, 850.0f);
    SET(S.capacity, max_batch, 64);
    SET(S.capacity, max_rows, 128);
    SET(S.capacity, model_bytes, (uint64_t)5 << 20); /* within 2^50: accepted */
    SET(S.capacity, row_bytes, (uint64_t)1 << 20);
    SET(S.capacity, queue_limit, 512);
    tessera__load__init(&S.load);
    SET(S.load, queue_depth, 12);
    SET(S.load, item_latency_us, 1180);
    SET(S.load, requests_per_s, 3.5f);
    tessera__advert_body__init(&S.advert_body);
    SET(S.advert_body, version, 5);
    SET(S.advert_body, partition_id, bin(S.hash, 32));
    SET(S.advert_body, num_clusters, 8);
    SET(S.advert_body, cluster, 3);
    SET(S.advert_body, weights_hash, bin(S.hash2, 32));
    S.advert_body.model = &S.model;
    SET(S.advert_body, objective, TESSERA__OBJECTIVE__OBJECTIVE_VELOCITY);
    S.advert_body.centroid = &S.centroid_t;
    S.advert_body.capacity = &S.capacity;
    S.advert_body.load = &S.load;

    tessera__advert__init(&S.advert);
    SET(S.advert, node_id, bin(S.node_a, 32));
    S.advert.has_body = 1;
    SET(S.advert, signature, bin(S.sig, 64));
    samples_sign();

    tessera__ping__init(&S.ping);
    SET(S.ping, target_id, bin(S.node_b, 32));
    tessera__ack__init(&S.ack);

    for (int i = 0; i < 2; i++) {
        tessera__member_state__init(&S.member[i]);
        S.members[i] = &S.member[i];
    }
    SET(S.member[0], node_id, bin(S.node_a, 32));
    SET(S.member[0], status, TESSERA__MEMBER_STATUS__MEMBER_ALIVE);
    SET(S.member[0], incarnation, 3);
    SET(S.member[0], last_change_age_ms, 61000);
    S.member[0].addr = S.addr0;
    SET(S.member[0], advert_version, 5);
    SET(S.member[1], node_id, bin(S.node_b, 32));
    SET(S.member[1], status, TESSERA__MEMBER_STATUS__MEMBER_DEAD);
    SET(S.member[1], incarnation, 9);
    S.member[1].addr = S.addr1;
    tessera__push_pull__init(&S.push_pull);
    SET(S.push_pull, state, bin(S.state_bytes, sizeof S.state_bytes));

    tessera__advert_request__init(&S.advert_request);
    SET(S.advert_request, node_id, bin(S.node_a, 32));
    SET(S.advert_request, min_version, 5);

    tessera__denoise_request__init(&S.denoise_request);
    SET(S.denoise_request, expert_id, bin(S.hash2, 32));
    S.denoise_request.x_t = &S.x_t;
    S.denoise_request.n_t = 2, S.denoise_request.t = S.t;
    S.denoise_request.n_class_labels = 2, S.denoise_request.class_labels = S.labels;
    SET(S.denoise_request, cfg_scale, 1.5f);
    tessera__timings__init(&S.timings);
    SET(S.timings, queue_us, 420);
    SET(S.timings, compute_us, 9100);
    SET(S.timings, batch_size, 24);
    tessera__denoise_response__init(&S.denoise_response);
    S.denoise_response.velocity = &S.velocity;
    S.denoise_response.timings = &S.timings;

    tessera__weights_manifest_request__init(&S.manifest_request);
    SET(S.manifest_request, weights_hash, bin(S.hash2, 32));
    for (int i = 0; i < 3; i++)
        S.chunk_hashes[i] = bin(i == 1 ? S.hash : S.node_b, 32);
    tessera__weights_manifest__init(&S.manifest);
    SET(S.manifest, weights_hash, bin(S.hash2, 32));
    SET(S.manifest, total_size, (5u << 20) / 2); /* 2.5 MiB: three chunks of 1 MiB */
    SET(S.manifest, chunk_size, 1u << 20);
    S.manifest.n_chunk_hashes = 3, S.manifest.chunk_hashes = S.chunk_hashes;
    SET(S.manifest, dtype, TESSERA__DTYPE__DTYPE_F32);
    tessera__chunk_request__init(&S.chunk_request);
    SET(S.chunk_request, chunk_hash, bin(S.hash, 32));
    tessera__chunk__init(&S.chunk);
    SET(S.chunk, chunk_hash, bin(S.hash, 32));
    SET(S.chunk, data, bin(S.chunk_data, sizeof S.chunk_data));

    tessera__status_request__init(&S.status_request);
    tessera__dial_back_request__init(&S.dial_back_request);
    S.dial_back_request.addr = "10.0.0.9:7420";
    tessera__dial_back_response__init(&S.dial_back_response);
    SET(S.dial_back_response, reachable, 1);
    S.dial_back_response.message = "reached";
    SET(S.status_request, include_adverts, 0);
    tessera__cluster_experts__init(&S.cluster);
    SET(S.cluster, partition_id, bin(S.hash, 32));
    SET(S.cluster, cluster, 3);
    SET(S.cluster, live_experts, 2);
    S.clusters[0] = &S.cluster;
    tessera__cluster_ref__init(&S.uncovered);
    SET(S.uncovered, partition_id, bin(S.hash, 32));
    SET(S.uncovered, cluster, 0);
    SET(S.uncovered, training_experts, 1);
    S.uncovereds[0] = &S.uncovered;
    tessera__aggregates__init(&S.aggregates);
    S.aggregates.n_clusters = 1, S.aggregates.clusters = S.clusters;
    S.aggregates.n_uncovered = 1, S.aggregates.uncovered = S.uncovereds;
    SET(S.aggregates, total_capacity, 1700.0f);
    SET(S.aggregates, request_rate, 7.0f);
    SET(S.aggregates, live_members, 2);
    S.adverts[0] = &S.advert;
    tessera__status_response__init(&S.status_response);
    SET(S.status_response, node_id, bin(S.node_b, 32));
    S.status_response.n_members = 2, S.status_response.members = S.members;
    S.status_response.n_adverts = 1, S.status_response.adverts = S.adverts;
    S.status_response.load = &S.load;
    S.status_response.aggregates = &S.aggregates;
    tessera__training_status__init(&S.own_training);
    SET(S.own_training, step, 41);
    SET(S.own_training, steps, 10000);
    SET(S.own_training, loss, 0.5f);
    SET(S.own_training, steps_per_s, 1.25f);
    SET(S.own_training, partition_id, bin(S.hash, 32));
    SET(S.own_training, cluster, 3);
    SET(S.own_training, served, 0);
    S.status_response.training = &S.own_training;

    tessera__error__init(&S.error);
    SET(S.error, code, TESSERA__ERROR_CODE__ERROR_NOT_FOUND);
    S.error.message = S.message;
    tessera__busy__init(&S.busy);
    SET(S.busy, retry_after_ms, 250);
    tessera__cancel__init(&S.cancel);
    SET(S.cancel, request_id, 41);

    S.signed_answer = S.denoise_response;
    SET(S.signed_answer, signature, bin(S.sig, 64));
    S.signed_answer.device_class = "cpu/haswell/n2/fused";
    SET(S.signed_answer, precision, TESSERA__DTYPE__DTYPE_F32);
    tessera__accusation__init(&S.accusation);
    SET(S.accusation, accused, bin(S.node_b, 32));
    SET(S.accusation, request_id, 77);
    S.accusation.request = &S.denoise_request;
    S.accusation.answer = &S.signed_answer;
    tessera__accusation_verdict__init(&S.verdict);
    SET(S.verdict, upheld, 1);
    S.verdict.reason = "its answer is wrong";
}

/* Every body kind, with its name and role: q request, r response, o one-way, e error. */
static const struct {
    Tessera__Envelope__BodyCase c;
    const char *name;
    char role;
} BODIES[] = {
    {TESSERA__ENVELOPE__BODY_PING, "ping", 'q'},
    {TESSERA__ENVELOPE__BODY_ACK, "ack", 'r'},
    {TESSERA__ENVELOPE__BODY_PUSH_PULL, "push_pull", 'q'},
    {TESSERA__ENVELOPE__BODY_ADVERT_REQUEST, "advert_request", 'q'},
    {TESSERA__ENVELOPE__BODY_ADVERT, "advert", 'r'},
    {TESSERA__ENVELOPE__BODY_DENOISE_REQUEST, "denoise_request", 'q'},
    {TESSERA__ENVELOPE__BODY_DENOISE_RESPONSE, "denoise_response", 'r'},
    {TESSERA__ENVELOPE__BODY_WEIGHTS_MANIFEST_REQUEST, "weights_manifest_request", 'q'},
    {TESSERA__ENVELOPE__BODY_WEIGHTS_MANIFEST, "weights_manifest", 'r'},
    {TESSERA__ENVELOPE__BODY_CHUNK_REQUEST, "chunk_request", 'q'},
    {TESSERA__ENVELOPE__BODY_CHUNK, "chunk", 'r'},
    {TESSERA__ENVELOPE__BODY_STATUS_REQUEST, "status_request", 'q'},
    {TESSERA__ENVELOPE__BODY_STATUS_RESPONSE, "status_response", 'r'},
    {TESSERA__ENVELOPE__BODY_DIAL_BACK_REQUEST, "dial_back_request", 'q'},
    {TESSERA__ENVELOPE__BODY_DIAL_BACK_RESPONSE, "dial_back_response", 'r'},
    {TESSERA__ENVELOPE__BODY_ERROR, "error", 'e'},
    {TESSERA__ENVELOPE__BODY_BUSY, "busy", 'r'},
    {TESSERA__ENVELOPE__BODY_CANCEL, "cancel", 'o'},
    {TESSERA__ENVELOPE__BODY_ACCUSATION, "accusation", 'q'},
    {TESSERA__ENVELOPE__BODY_ACCUSATION_VERDICT, "accusation_verdict", 'r'},
};

/* S.env holding the sample body of kind c, with the header its role needs. */
static Tessera__Envelope *sample(Tessera__Envelope__BodyCase c) {
    Tessera__Envelope *e = &S.env;
    tessera__envelope__init(e);
    e->body_case = c;
    switch (c) {
    case TESSERA__ENVELOPE__BODY_PING: e->ping = &S.ping; break;
    case TESSERA__ENVELOPE__BODY_ACK: e->ack = &S.ack; break;
    case TESSERA__ENVELOPE__BODY_PUSH_PULL: e->push_pull = &S.push_pull; break;
    case TESSERA__ENVELOPE__BODY_ADVERT_REQUEST: e->advert_request = &S.advert_request; break;
    case TESSERA__ENVELOPE__BODY_ADVERT: e->advert = &S.advert; break;
    case TESSERA__ENVELOPE__BODY_DENOISE_REQUEST: e->denoise_request = &S.denoise_request; break;
    case TESSERA__ENVELOPE__BODY_DENOISE_RESPONSE: e->denoise_response = &S.denoise_response; break;
    case TESSERA__ENVELOPE__BODY_WEIGHTS_MANIFEST_REQUEST:
        e->weights_manifest_request = &S.manifest_request;
        break;
    case TESSERA__ENVELOPE__BODY_WEIGHTS_MANIFEST: e->weights_manifest = &S.manifest; break;
    case TESSERA__ENVELOPE__BODY_CHUNK_REQUEST: e->chunk_request = &S.chunk_request; break;
    case TESSERA__ENVELOPE__BODY_CHUNK: e->chunk = &S.chunk; break;
    case TESSERA__ENVELOPE__BODY_STATUS_REQUEST: e->status_request = &S.status_request; break;
    case TESSERA__ENVELOPE__BODY_STATUS_RESPONSE: e->status_response = &S.status_response; break;
    case TESSERA__ENVELOPE__BODY_DIAL_BACK_REQUEST:
        e->dial_back_request = &S.dial_back_request;
        break;
    case TESSERA__ENVELOPE__BODY_DIAL_BACK_RESPONSE:
        e->dial_back_response = &S.dial_back_response;
        break;
    case TESSERA__ENVELOPE__BODY_ERROR: e->error = &S.error; break;
    case TESSERA__ENVELOPE__BODY_BUSY: e->busy = &S.busy; break;
    case TESSERA__ENVELOPE__BODY_CANCEL: e->cancel = &S.cancel; break;
    case TESSERA__ENVELOPE__BODY_ACCUSATION: e->accusation = &S.accusation; break;
    case TESSERA__ENVELOPE__BODY_ACCUSATION_VERDICT: e->accusation_verdict = &S.verdict; break;
    default: fail_msg("no sample for body %d", (int)c);
    }
    for (size_t i = 0; i < N_OF(BODIES); i++) {
        if (BODIES[i].c != c)
            continue;
        if (BODIES[i].role != 'o')
            SET(*e, request_id, 0x1122334455667788u); /* a varint of every length */
        if (BODIES[i].role == 'q')
            SET(*e, deadline_ms, 1500);
    }
    return e;
}

/* The whole application frame of a valid sample (malloc'd). */
static uint8_t *sample_frame(Tessera__Envelope__BodyCase c, size_t *len) {
    samples_init();
    uint8_t *frame;
    char err[256] = "";
    TU_CHECK_RC_MSG(ts_frame_encode_envelope(sample(c), TS_FRAME_CHECK_FINITE, TS_FRAME_MAX_DEFAULT,
                                             &frame, len, err, sizeof err),
                    TS_OK, err);
    return frame;
}

/* Every sample's frame, back to back; offs[i] is where frame i starts (N_OF(BODIES) + 1
 * entries, the last the total length). */
static uint8_t *sample_stream(size_t *offs) {
    size_t total = 0, cap = 1 << 16;
    uint8_t *stream = malloc(cap);
    assert_non_null(stream);
    for (size_t i = 0; i < N_OF(BODIES); i++) {
        size_t n;
        uint8_t *f = sample_frame(BODIES[i].c, &n);
        assert_true(total + n <= cap);
        memcpy(stream + total, f, n);
        offs[i] = total;
        total += n;
        free(f);
    }
    offs[N_OF(BODIES)] = total;
    return stream;
}

/* ---- length prefixes ---------------------------------------------------------------------- */

static void test_prefixes(void **state) {
    (void)state;
    uint8_t b[4];
    TU_CHECK_OK(ts_frame_put_noise_len(b, 0x1234));
    assert_int_equal(b[0], 0x12);
    assert_int_equal(b[1], 0x34);
    TU_CHECK_OK(ts_frame_put_noise_len(b, 65535));
    assert_int_equal(b[0], 0xFF);
    assert_int_equal(b[1], 0xFF);
    TU_CHECK_RC(ts_frame_put_noise_len(b, 65536), TS_ERANGE);
    TU_CHECK_RC(ts_frame_put_noise_len(b, 0), TS_ERANGE);

    TU_CHECK_OK(ts_frame_put_app_len(b, 0x01020304, TS_FRAME_MAX_DEFAULT));
    assert_int_equal(be32(b), 0x01020304);
    TU_CHECK_OK(ts_frame_put_app_len(b, 100, 100));
    assert_int_equal(be32(b), 100);
    TU_CHECK_RC(ts_frame_put_app_len(b, 101, 100), TS_ERANGE);
    TU_CHECK_RC(ts_frame_put_app_len(b, 0, 100), TS_ERANGE);
    TU_CHECK_RC(ts_frame_put_app_len(NULL, 1, 100), TS_EINVAL);
    assert_int_equal(TS_FRAME_NOISE_PLAINTEXT_MAX, 65519);
}

/* ---- readers ------------------------------------------------------------------------------ */

/* Feeds in[0, len) to r in pieces of 1..max_piece bytes (1: byte at a time; 0: all at once),
 * calling got(ctx, msg, n) for every message; returns the messages read. Fails the test on
 * any error. */
typedef void (*got_fn)(void *ctx, const uint8_t *msg, size_t n);
static size_t feed_all(ts_frame_reader_t *r, const uint8_t *in, size_t len, size_t max_piece,
                       tu_rng_t *rng, got_fn got, void *ctx) {
    size_t pos = 0, count = 0;
    char err[256] = "";
    while (pos < len) {
        size_t piece = len - pos;
        if (max_piece > 0) {
            size_t want = 1 + (size_t)(tu_rng_next(rng) % max_piece);
            if (want < piece)
                piece = want;
        }
        const uint8_t *p = in + pos;
        size_t left = piece;
        while (left > 0) {
            size_t used;
            const uint8_t *msg;
            size_t n;
            TU_CHECK_RC_MSG(ts_frame_reader_feed(r, p, left, &used, &msg, &n, err, sizeof err),
                            TS_OK, err);
            assert_true(used <= left);
            if (msg) {
                assert_true(ts_frame_reader_idle(r));
                got(ctx, msg, n);
                count++;
            } else {
                assert_int_equal(used, left); /* no message: everything was taken */
            }
            p += used;
            left -= used;
        }
        pos += piece;
    }
    return count;
}

/* Checks that the frames come back in order and equal to the stream's. */
typedef struct {
    const uint8_t *stream;
    const size_t *offs;
    size_t next;
} expect_t;

static void got_frame(void *ctx, const uint8_t *msg, size_t n) {
    expect_t *x = ctx;
    assert_true(x->next < N_OF(BODIES));
    const uint8_t *want = x->stream + x->offs[x->next];
    assert_int_equal(n, be32(want));
    assert_memory_equal(msg, want + 4, n);
    Tessera__Envelope *e;
    char err[256] = "";
    TU_CHECK_RC_MSG(ts_frame_decode_envelope(msg, n, TS_FRAME_CHECK_FINITE, &e, err, sizeof err),
                    TS_OK, err);
    assert_int_equal(e->body_case, BODIES[x->next].c);
    ts_frame_free(e);
    x->next++;
}

static void test_reader_every_piece_size(void **state) {
    (void)state;
    size_t offs[N_OF(BODIES) + 1];
    uint8_t *stream = sample_stream(offs);
    size_t total = offs[N_OF(BODIES)];
    tu_rng_t rng = {11};
    /* 0: all at once; 1: a byte at a time; then random pieces, small and large */
    const size_t pieces[] = {0, 1, 2, 3, 7, 64, 1000};
    for (size_t k = 0; k < N_OF(pieces); k++) {
        ts_frame_reader_t r;
        TU_CHECK_OK(ts_frame_reader_init_app(&r, TS_FRAME_MAX_DEFAULT));
        expect_t x = {stream, offs, 0};
        assert_int_equal(feed_all(&r, stream, total, pieces[k], &rng, got_frame, &x), N_OF(BODIES));
        assert_true(ts_frame_reader_idle(&r));
        assert_true(ts_frame_reader_held(&r) <= 4096);
        ts_frame_reader_free(&r);
    }
    free(stream);
}

/* A frame that arrives whole in one piece is handed back in place, with no allocation. */
static void test_reader_in_place(void **state) {
    (void)state;
    size_t n;
    uint8_t *frame = sample_frame(TESSERA__ENVELOPE__BODY_DENOISE_REQUEST, &n);
    ts_frame_reader_t r;
    TU_CHECK_OK(ts_frame_reader_init_app(&r, TS_FRAME_MAX_DEFAULT));
    const uint8_t *msg;
    size_t used, len;
    alloc_reset();
    TU_CHECK_OK(ts_frame_reader_feed(&r, frame, n, &used, &msg, &len, NULL, 0));
    assert_int_equal(g_alloc.calls, 0);
    assert_ptr_equal(msg, frame + 4);
    assert_int_equal(len, n - 4);
    assert_int_equal(used, n);
    /* the prefix alone, then the body in one piece: still in place */
    TU_CHECK_OK(ts_frame_reader_feed(&r, frame, 4, &used, &msg, &len, NULL, 0));
    assert_null(msg);
    assert_false(ts_frame_reader_idle(&r));
    TU_CHECK_OK(ts_frame_reader_feed(&r, frame + 4, n - 4, &used, &msg, &len, NULL, 0));
    assert_ptr_equal(msg, frame + 4);
    assert_int_equal(g_alloc.calls, 0);
    assert_int_equal(ts_frame_reader_held(&r), 0);
    ts_frame_reader_free(&r);
    free(frame);
}

/* Writing a body in place (ts_frame_reader_body_space / _commit), mixed with feeding, as the
 * connection does when it decrypts straight into the reader: the bytes come out the same,
 * nothing is offered outside a body or past its end, and the buffer grows only as far as what
 * was committed needs (at most doubling), never to the announced length. */
static void test_reader_body_space(void **state) {
    (void)state;
    enum { LEN = 100000, PIECE = 7000 };
    uint8_t *want = malloc(LEN), hdr[4];
    for (size_t i = 0; i < LEN; i++)
        want[i] = (uint8_t)(i * 31 + 7);
    ts_frame_reader_t r;
    TU_CHECK_OK(ts_frame_reader_init_app(&r, 1u << 20));
    const uint8_t *msg;
    size_t used, len;
    assert_null(ts_frame_reader_body_space(&r, 1)); /* between messages */
    TU_CHECK_OK(ts_frame_put_app_len(hdr, LEN, 1u << 20));
    TU_CHECK_OK(ts_frame_reader_feed(&r, hdr, 3, &used, &msg, &len, NULL, 0));
    assert_null(ts_frame_reader_body_space(&r, 1)); /* the prefix is not complete */
    /* the prefix and a first piece fed, the rest written in place */
    uint8_t first[4 + 10];
    memcpy(first, hdr + 3, 1);
    memcpy(first + 1, want, 10);
    TU_CHECK_OK(ts_frame_reader_feed(&r, first, 11, &used, &msg, &len, NULL, 0));
    assert_null(msg);
    assert_null(ts_frame_reader_body_space(&r, 0));
    assert_null(ts_frame_reader_body_space(&r, LEN - 10 + 1)); /* past the message's end */
    size_t have = 10;
    while (have < LEN) {
        size_t n = LEN - have < PIECE ? LEN - have : PIECE;
        uint8_t *dst = ts_frame_reader_body_space(&r, n);
        assert_non_null(dst);
        size_t held = ts_frame_reader_held(&r);
        assert_true(held >= have + n && held <= LEN);
        if (held > 4096)
            assert_true(held <= 2 * (have + n));
        memcpy(dst, want + have, n);
        ts_frame_reader_commit(&r, n, &msg, &len);
        have += n;
        if (have < LEN)
            assert_null(msg);
    }
    assert_non_null(msg);
    assert_int_equal(len, LEN);
    assert_memory_equal(msg, want, LEN);
    assert_true(ts_frame_reader_idle(&r));
    assert_null(ts_frame_reader_body_space(&r, 1)); /* delivered: between messages again */
    /* the next message goes through feed as usual, in place, and the large buffer goes */
    uint8_t small[4 + 3] = {0, 0, 0, 3, 'a', 'b', 'c'};
    TU_CHECK_OK(ts_frame_reader_feed(&r, small, sizeof small, &used, &msg, &len, NULL, 0));
    assert_ptr_equal(msg, small + 4);
    assert_int_equal(ts_frame_reader_held(&r), 0);
    /* a failed reader offers nothing */
    uint8_t zero[4] = {0};
    TU_CHECK_RC(ts_frame_reader_feed(&r, zero, 4, &used, &msg, &len, NULL, 0), TS_ECORRUPT);
    assert_null(ts_frame_reader_body_space(&r, 1));
    ts_frame_reader_free(&r);
    free(want);
}

/* A truncated stream keeps waiting, at any cut; the missing bytes complete it. */
static void test_reader_truncated_waits(void **state) {
    (void)state;
    size_t n;
    uint8_t *frame = sample_frame(TESSERA__ENVELOPE__BODY_STATUS_RESPONSE, &n);
    for (size_t cut = 1; cut < n; cut++) {
        ts_frame_reader_t r;
        TU_CHECK_OK(ts_frame_reader_init_app(&r, TS_FRAME_MAX_DEFAULT));
        const uint8_t *msg;
        size_t used, len;
        TU_CHECK_OK(ts_frame_reader_feed(&r, frame, cut, &used, &msg, &len, NULL, 0));
        assert_null(msg);
        assert_int_equal(used, cut);
        assert_false(ts_frame_reader_idle(&r)); /* an end of stream here truncates a frame */
        TU_CHECK_OK(ts_frame_reader_feed(&r, frame + cut, 0, &used, &msg, &len, NULL, 0));
        assert_null(msg);
        TU_CHECK_OK(ts_frame_reader_feed(&r, frame + cut, n - cut, &used, &msg, &len, NULL, 0));
        assert_non_null(msg);
        assert_int_equal(len, n - 4);
        assert_memory_equal(msg, frame + 4, len);
        ts_frame_reader_free(&r);
    }
    /* the Noise layer: half a prefix waits too */
    ts_frame_reader_t r;
    ts_frame_reader_init_noise(&r);
    const uint8_t two[] = {0x00, 0x03, 'a', 'b', 'c'};
    const uint8_t *msg;
    size_t used, len;
    TU_CHECK_OK(ts_frame_reader_feed(&r, two, 1, &used, &msg, &len, NULL, 0));
    assert_null(msg);
    assert_false(ts_frame_reader_idle(&r));
    TU_CHECK_OK(ts_frame_reader_feed(&r, two + 1, 4, &used, &msg, &len, NULL, 0));
    assert_non_null(msg);
    assert_int_equal(len, 3);
    assert_memory_equal(msg, "abc", 3);
    ts_frame_reader_free(&r);
    free(frame);
}

/* An oversize length is refused when its prefix is complete, before any allocation. */
static void test_reader_oversize_refused_before_allocating(void **state) {
    (void)state;
    const struct {
        uint32_t max;
        uint32_t len;
    } cases[] = {
        {1u << 20, (1u << 20) + 1},
        {TS_FRAME_MAX_DEFAULT, TS_FRAME_MAX_DEFAULT + 1},
        {TS_FRAME_MAX_DEFAULT, 0xFFFFFFFFu},
        {1, 2},
    };
    for (size_t i = 0; i < N_OF(cases); i++) {
        ts_frame_reader_t r;
        TU_CHECK_OK(ts_frame_reader_init_app(&r, cases[i].max));
        uint8_t in[8] = {0};
        TU_CHECK_OK(ts_frame_put_app_len(in, cases[i].len, 0xFFFFFFFFu));
        const uint8_t *msg;
        size_t used, len;
        char err[256] = "";
        alloc_reset();
        /* three prefix bytes are fine: the length is not known yet */
        TU_CHECK_OK(ts_frame_reader_feed(&r, in, 3, &used, &msg, &len, err, sizeof err));
        TU_CHECK_RC_MSG(ts_frame_reader_feed(&r, in + 3, 5, &used, &msg, &len, err, sizeof err),
                        TS_ERANGE, err);
        TU_CHECK_CONTAINS(err, "longer than the limit");
        TU_CHECK_CONTAINS(err, "application frame");
        assert_int_equal(used, 1); /* it stopped at the prefix's last byte */
        assert_null(msg);
        assert_int_equal(g_alloc.calls, 0);
        assert_int_equal(ts_frame_reader_held(&r), 0);
        assert_false(ts_frame_reader_idle(&r));
        /* the error sticks: the stream cannot be resynchronised */
        TU_CHECK_RC(ts_frame_reader_feed(&r, in, 8, &used, &msg, &len, err, sizeof err), TS_ERANGE);
        TU_CHECK_CONTAINS(err, "already failed");
        ts_frame_reader_free(&r);
    }
    /* exactly max_frame is accepted */
    ts_frame_reader_t r;
    TU_CHECK_OK(ts_frame_reader_init_app(&r, 5));
    const uint8_t ok[] = {0, 0, 0, 5, 1, 2, 3, 4, 5};
    const uint8_t *msg;
    size_t used, len;
    TU_CHECK_OK(ts_frame_reader_feed(&r, ok, sizeof ok, &used, &msg, &len, NULL, 0));
    assert_int_equal(len, 5);
    ts_frame_reader_free(&r);
    /* bad limits */
    TU_CHECK_RC(ts_frame_reader_init_app(&r, 0), TS_EINVAL);
    TU_CHECK_RC(ts_frame_reader_feed(&r, ok, sizeof ok, &used, &msg, &len, NULL, 0), TS_EINVAL);
    TU_CHECK_RC(ts_frame_reader_init_app(&r, TS_FRAME_MAX_LIMIT + 1), TS_EINVAL);
}

static void test_reader_zero_length(void **state) {
    (void)state;
    const uint8_t zeros[4] = {0};
    const uint8_t *msg;
    size_t used, len;
    char err[256] = "";
    ts_frame_reader_t r;
    TU_CHECK_OK(ts_frame_reader_init_app(&r, TS_FRAME_MAX_DEFAULT));
    TU_CHECK_RC_MSG(ts_frame_reader_feed(&r, zeros, 4, &used, &msg, &len, err, sizeof err),
                    TS_ECORRUPT, err);
    TU_CHECK_CONTAINS(err, "zero-length application frame");
    ts_frame_reader_free(&r);
    ts_frame_reader_init_noise(&r);
    TU_CHECK_RC_MSG(ts_frame_reader_feed(&r, zeros, 2, &used, &msg, &len, err, sizeof err),
                    TS_ECORRUPT, err);
    TU_CHECK_CONTAINS(err, "zero-length Noise message");
    ts_frame_reader_free(&r);
}

/* The buffer grows with what arrives, never to the announced length; a large buffer is let go
 * after its frame, a small one kept for the next. */
static void test_reader_memory_follows_arrivals(void **state) {
    (void)state;
    const uint32_t big = TS_FRAME_MAX_DEFAULT;
    ts_frame_reader_t r;
    TU_CHECK_OK(ts_frame_reader_init_app(&r, big));
    uint8_t prefix[4];
    TU_CHECK_OK(ts_frame_put_app_len(prefix, big, big));
    const uint8_t *msg;
    size_t used, len;
    alloc_reset();
    TU_CHECK_OK(ts_frame_reader_feed(&r, prefix, 4, &used, &msg, &len, NULL, 0));
    uint8_t ten[10] = {0};
    TU_CHECK_OK(ts_frame_reader_feed(&r, ten, sizeof ten, &used, &msg, &len, NULL, 0));
    assert_true(ts_frame_reader_held(&r) <= 4096);
    assert_true(g_alloc.largest <= 4096);
    size_t piece = 48 << 10, received = sizeof ten;
    uint8_t *chunk = calloc(1, piece);
    assert_non_null(chunk);
    for (int i = 0; i < 40; i++) { /* ~1.9 MiB of the announced 64 MiB */
        TU_CHECK_OK(ts_frame_reader_feed(&r, chunk, piece, &used, &msg, &len, NULL, 0));
        assert_null(msg);
        received += piece;
        assert_true(ts_frame_reader_held(&r) <= 2 * received);
        assert_true(ts_frame_reader_held(&r) >= received);
    }
    assert_true(g_alloc.largest <= 2 * received);
    ts_frame_reader_free(&r);
    assert_int_equal(ts_frame_reader_held(&r), 0);

    /* a 200 KiB frame, buffered: held until the next call, then released */
    TU_CHECK_OK(ts_frame_reader_init_app(&r, big));
    const size_t mid = 200 << 10;
    uint8_t *frame = calloc(1, 4 + mid);
    assert_non_null(frame);
    TU_CHECK_OK(ts_frame_put_app_len(frame, mid, big));
    TU_CHECK_OK(ts_frame_reader_feed(&r, frame, 4 + mid / 2, &used, &msg, &len, NULL, 0));
    TU_CHECK_OK(ts_frame_reader_feed(&r, frame + 4 + mid / 2, mid / 2, &used, &msg, &len, NULL, 0));
    assert_non_null(msg);
    assert_int_equal(len, mid);
    assert_true(ts_frame_reader_held(&r) >= mid);
    TU_CHECK_OK(ts_frame_reader_feed(&r, NULL, 0, &used, &msg, &len, NULL, 0));
    assert_int_equal(ts_frame_reader_held(&r), 0);
    /* a small one, buffered: its buffer is reused */
    const uint8_t small[] = {0, 0, 0, 3, 'x', 'y', 'z'};
    TU_CHECK_OK(ts_frame_reader_feed(&r, small, 5, &used, &msg, &len, NULL, 0));
    TU_CHECK_OK(ts_frame_reader_feed(&r, small + 5, 2, &used, &msg, &len, NULL, 0));
    assert_memory_equal(msg, "xyz", 3);
    size_t held = ts_frame_reader_held(&r);
    assert_true(held > 0 && held <= 4096);
    alloc_reset();
    TU_CHECK_OK(ts_frame_reader_feed(&r, small, 5, &used, &msg, &len, NULL, 0));
    TU_CHECK_OK(ts_frame_reader_feed(&r, small + 5, 2, &used, &msg, &len, NULL, 0));
    assert_memory_equal(msg, "xyz", 3);
    assert_int_equal(g_alloc.calls, 0);
    ts_frame_reader_free(&r);
    free(frame);
    free(chunk);
}

/* A failed allocation is reported, consumes nothing it could not keep, and can be retried. */
static void test_reader_out_of_memory_retry(void **state) {
    (void)state;
    const uint8_t frame[] = {0, 0, 0, 4, 'a', 'b', 'c', 'd'};
    ts_frame_reader_t r;
    TU_CHECK_OK(ts_frame_reader_init_app(&r, 100));
    const uint8_t *msg;
    size_t used, len;
    char err[256] = "";
    alloc_reset();
    g_fail_in = 1;
    TU_CHECK_RC_MSG(ts_frame_reader_feed(&r, frame, 6, &used, &msg, &len, err, sizeof err),
                    TS_ENOMEM, err);
    TU_CHECK_CONTAINS(err, "out of memory");
    assert_int_equal(used, 4); /* the prefix was taken, the body bytes were not */
    TU_CHECK_OK(ts_frame_reader_feed(&r, frame + used, sizeof frame - used, &used, &msg, &len, err,
                                     sizeof err));
    assert_non_null(msg);
    assert_memory_equal(msg, "abcd", 4);
    ts_frame_reader_free(&r);
}

/* A large frame whose bytes run across many Noise messages of random sizes, the TCP stream fed
 * in random pieces (some a byte at a time) through both readers. */
typedef struct {
    ts_frame_reader_t app;
    size_t noise_msgs, frames;
    const uint8_t *const *want;
    const size_t *want_len;
} two_layer_t;

static void got_app_frame(void *ctx, const uint8_t *msg, size_t n) {
    two_layer_t *t = ctx;
    assert_int_equal(n, t->want_len[t->frames]);
    assert_memory_equal(msg, t->want[t->frames], n);
    t->frames++;
}

static void got_noise_msg(void *ctx, const uint8_t *msg, size_t n) {
    two_layer_t *t = ctx;
    t->noise_msgs++;
    tu_rng_t unused = {0};
    feed_all(&t->app, msg, n, 0, &unused, got_app_frame, t);
}

static void test_frame_across_noise_messages(void **state) {
    (void)state;
    /* three frames: a small one, a 1 MiB + 123 byte chunk, a small one */
    samples_init();
    size_t big_len = (1u << 20) + 123;
    uint8_t *big = malloc(big_len);
    assert_non_null(big);
    tu_rng_t rng = {5};
    for (size_t i = 0; i < big_len; i++)
        big[i] = (uint8_t)tu_rng_next(&rng);
    uint8_t *f[3];
    size_t fl[3];
    f[0] = sample_frame(TESSERA__ENVELOPE__BODY_PING, &fl[0]);
    samples_init();
    SET(S.chunk, data, bin(big, big_len));
    char err[256] = "";
    TU_CHECK_RC_MSG(ts_frame_encode_envelope(sample(TESSERA__ENVELOPE__BODY_CHUNK), 0,
                                             TS_FRAME_MAX_DEFAULT, &f[1], &fl[1], err, sizeof err),
                    TS_OK, err);
    f[2] = sample_frame(TESSERA__ENVELOPE__BODY_ACK, &fl[2]);
    size_t plain_len = fl[0] + fl[1] + fl[2];
    uint8_t *plain = malloc(plain_len);
    assert_non_null(plain);
    memcpy(plain, f[0], fl[0]);
    memcpy(plain + fl[0], f[1], fl[1]);
    memcpy(plain + fl[0] + fl[1], f[2], fl[2]);

    /* cut the plaintext into Noise payloads of random sizes (a few tiny, most large, some the
     * largest allowed) and prefix each with its 2-byte length, as the transport would after
     * encryption */
    size_t cap = 3 * plain_len; /* at worst a 2-byte prefix per plaintext byte */
    uint8_t *tcp = malloc(cap);
    assert_non_null(tcp);
    size_t tcp_len = 0, pos = 0, pieces = 0;
    while (pos < plain_len) {
        uint64_t pick = tu_rng_next(&rng) % 8;
        size_t n = pick == 0   ? 1 + (size_t)(tu_rng_next(&rng) % 7)
                   : pick == 1 ? TS_FRAME_NOISE_PLAINTEXT_MAX
                               : 1 + (size_t)(tu_rng_next(&rng) % TS_FRAME_NOISE_PLAINTEXT_MAX);
        if (n > plain_len - pos)
            n = plain_len - pos;
        TU_CHECK_OK(ts_frame_put_noise_len(tcp + tcp_len, n));
        memcpy(tcp + tcp_len + 2, plain + pos, n);
        tcp_len += 2 + n;
        pos += n;
        pieces++;
    }
    assert_true(pieces >= 16);

    const uint8_t *want[3] = {f[0] + 4, f[1] + 4, f[2] + 4};
    const size_t want_len[3] = {fl[0] - 4, fl[1] - 4, fl[2] - 4};
    const size_t max_piece[] = {0, 1, 5000, 70000};
    for (size_t k = 0; k < N_OF(max_piece); k++) {
        two_layer_t t = {.want = want, .want_len = want_len};
        TU_CHECK_OK(ts_frame_reader_init_app(&t.app, TS_FRAME_MAX_DEFAULT));
        ts_frame_reader_t noise;
        ts_frame_reader_init_noise(&noise);
        feed_all(&noise, tcp, tcp_len, max_piece[k], &rng, got_noise_msg, &t);
        assert_int_equal(t.noise_msgs, pieces);
        assert_int_equal(t.frames, 3);
        assert_true(ts_frame_reader_held(&noise) <= TS_FRAME_NOISE_MAX);
        assert_true(ts_frame_reader_idle(&noise) && ts_frame_reader_idle(&t.app));
        ts_frame_reader_free(&noise);
        ts_frame_reader_free(&t.app);
    }
    Tessera__Envelope *e;
    TU_CHECK_RC_MSG(ts_frame_decode_envelope(want[1], want_len[1], 0, &e, err, sizeof err), TS_OK,
                    err);
    assert_int_equal(e->chunk->data.len, big_len);
    assert_memory_equal(e->chunk->data.data, big, big_len);
    ts_frame_free(e);
    for (int i = 0; i < 3; i++)
        free(f[i]);
    free(plain);
    free(tcp);
    free(big);
}

/* ---- envelopes ---------------------------------------------------------------------------- */

/* Every body kind: encode, decode, encode again gives the same bytes (so every field
 * survived), and the name and role rules hold. */
static void test_round_trip_every_body(void **state) {
    (void)state;
    for (size_t i = 0; i < N_OF(BODIES); i++) {
        size_t n;
        uint8_t *frame = sample_frame(BODIES[i].c, &n);
        assert_int_equal(be32(frame), n - 4);
        Tessera__Envelope *d;
        char err[256] = "";
        TU_CHECK_RC_MSG(
            ts_frame_decode_envelope(frame + 4, n - 4, TS_FRAME_CHECK_FINITE, &d, err, sizeof err),
            TS_OK, err);
        assert_int_equal(d->body_case, BODIES[i].c);
        assert_string_equal(ts_frame_body_name(d->body_case), BODIES[i].name);
        assert_int_equal(d->has_request_id, BODIES[i].role != 'o');
        assert_int_equal(d->has_deadline_ms, BODIES[i].role == 'q');
        uint8_t *again;
        size_t n2;
        TU_CHECK_OK(ts_frame_encode_envelope(d, TS_FRAME_CHECK_FINITE, TS_FRAME_MAX_DEFAULT, &again,
                                             &n2, err, sizeof err));
        assert_int_equal(n2, n);
        assert_memory_equal(again, frame, n);
        ts_frame_free(d);
        free(again);
        free(frame);
    }
    assert_string_equal(ts_frame_body_name(TESSERA__ENVELOPE__BODY__NOT_SET), "none");
    assert_string_equal(ts_frame_body_name((Tessera__Envelope__BodyCase)1), "unknown");
    assert_string_equal(ts_frame_body_name((Tessera__Envelope__BodyCase)99), "unknown");
}

/* Field values come back as sent (a few, where a codec bug would hide). */
static void test_round_trip_values(void **state) {
    (void)state;
    size_t n;
    uint8_t *frame = sample_frame(TESSERA__ENVELOPE__BODY_DENOISE_REQUEST, &n);
    Tessera__Envelope *d;
    TU_CHECK_OK(ts_frame_decode_envelope(frame + 4, n - 4, 0, &d, NULL, 0));
    assert_int_equal(d->request_id, 0x1122334455667788u);
    assert_int_equal(d->deadline_ms, 1500);
    const Tessera__DenoiseRequest *q = d->denoise_request;
    assert_memory_equal(q->expert_id.data, S.hash2, 32);
    assert_int_equal(q->x_t->n_shape, 4);
    assert_memory_equal(q->x_t->shape, S.img_shape, sizeof S.img_shape);
    assert_memory_equal(q->x_t->data.data, S.xt, sizeof S.xt);
    assert_memory_equal(q->t, S.t, sizeof S.t);
    assert_memory_equal(q->class_labels, S.labels, sizeof S.labels);
    assert_true(q->cfg_scale == 1.5f);
    ts_frame_free(d);
    free(frame);

    /* a status request that does not mention include_members reads as the default, true */
    samples_init();
    Tessera__Envelope *e = sample(TESSERA__ENVELOPE__BODY_STATUS_REQUEST);
    uint8_t *f2;
    TU_CHECK_OK(ts_frame_encode_envelope(e, 0, TS_FRAME_MAX_DEFAULT, &f2, &n, NULL, 0));
    TU_CHECK_OK(ts_frame_decode_envelope(f2 + 4, n - 4, 0, &d, NULL, 0));
    assert_false(d->status_request->has_include_members);
    assert_true(d->status_request->include_members);
    assert_true(d->status_request->has_include_adverts);
    assert_false(d->status_request->include_adverts);
    ts_frame_free(d);
    free(f2);
}

/* Exact bytes: these pin the field numbers of the header and of a few bodies. */
static void test_golden_bytes(void **state) {
    (void)state;
    samples_init();
    Tessera__Envelope *e = sample(TESSERA__ENVELOPE__BODY_PING);
    SET(*e, request_id, 1);
    SET(*e, deadline_ms, 1500);
    uint8_t *f;
    size_t n;
    TU_CHECK_OK(ts_frame_encode_envelope(e, 0, TS_FRAME_MAX_DEFAULT, &f, &n, NULL, 0));
    uint8_t want[4 + 42] = {0,    0,    0,    42, /* application prefix */
                            0x08, 0x01,           /* 1 request_id: 1 */
                            0x10, 0xDC, 0x0B,     /* 2 deadline_ms: 1500 */
                            0x82, 0x01, 0x22,     /* 16 ping, 34 bytes */
                            0x0A, 0x20};          /* 1 target_id, 32 bytes */
    memset(want + 4 + 10, 0x22, 32);
    assert_int_equal(n, sizeof want);
    assert_memory_equal(f, want, sizeof want);
    free(f);

    e = sample(TESSERA__ENVELOPE__BODY_ERROR);
    SET(*e, request_id, 9);
    S.error.message = "x";
    TU_CHECK_OK(ts_frame_encode_envelope(e, 0, TS_FRAME_MAX_DEFAULT, &f, &n, NULL, 0));
    const uint8_t want_err[] = {0,    0,    0,    10, 0x08, 0x09, /* request_id 9 */
                                0x82, 0x04, 0x05,                 /* 64 error, 5 bytes */
                                0x08, 0x04,                       /* code: NOT_FOUND */
                                0x12, 0x01, 'x'};                 /* message */
    assert_int_equal(n, sizeof want_err);
    assert_memory_equal(f, want_err, sizeof want_err);
    free(f);

    /* a tensor: dtype 1, packed shape 2, data 3 */
    Tessera__Tensor t;
    float one = 1.0f;
    int64_t shape[1] = {1};
    tessera__tensor__init(&t);
    SET(t, dtype, TESSERA__DTYPE__DTYPE_F32);
    t.n_shape = 1, t.shape = shape;
    SET(t, data, bin(&one, 4));
    uint8_t buf[32];
    ProtobufCBinaryData b = pack_into(&t, buf, sizeof buf);
    const uint8_t want_t[] = {0x08, 0x01, 0x12, 0x01, 0x01, 0x1A, 0x04, 0x00, 0x00, 0x80, 0x3F};
    assert_int_equal(b.len, sizeof want_t);
    assert_memory_equal(b.data, want_t, sizeof want_t);
}

static void test_unknown_and_missing_body(void **state) {
    (void)state;
    uint8_t buf[16];
    size_t n = 0;
    n += put_tag(buf + n, 1, 0); /* request_id 5 */
    n += put_varint(buf + n, 5);
    n += put_tag(buf + n, 100, 2); /* a body kind from a later version */
    n += put_varint(buf + n, 0);
    Tessera__Envelope *e;
    char err[256] = "";
    TU_CHECK_RC_MSG(ts_frame_decode_envelope(buf, n, 0, &e, err, sizeof err), TS_ENOTSUP, err);
    TU_CHECK_CONTAINS(err, "field 100");
    assert_null(e);
    /* parsed alone, it still tells whom to answer */
    TU_CHECK_OK(ts_frame_unpack_envelope(buf, n, &e, err, sizeof err));
    assert_int_equal(e->request_id, 5);
    TU_CHECK_RC(ts_frame_check_envelope(e, 0, err, sizeof err), TS_ENOTSUP);
    ts_frame_free(e);

    /* a later version's header field is no body */
    n = 0;
    n += put_tag(buf + n, 1, 0);
    n += put_varint(buf + n, 5);
    n += put_tag(buf + n, 5, 0);
    n += put_varint(buf + n, 1);
    TU_CHECK_RC(ts_frame_decode_envelope(buf, n, 0, &e, err, sizeof err), TS_ECORRUPT);
    TU_CHECK_CONTAINS(err, "no body");

    /* a header and nothing else; and nothing at all */
    TU_CHECK_RC(ts_frame_decode_envelope(buf, 2, 0, &e, err, sizeof err), TS_ECORRUPT);
    TU_CHECK_CONTAINS(err, "no body");
    TU_CHECK_RC(ts_frame_decode_envelope(NULL, 0, 0, &e, err, sizeof err), TS_ECORRUPT);
    TU_CHECK_RC(ts_frame_decode_envelope(NULL, 3, 0, &e, err, sizeof err), TS_EINVAL);

    /* a hand-built envelope naming a body it does not have */
    samples_init();
    Tessera__Envelope *s = sample(TESSERA__ENVELOPE__BODY_ACK);
    s->ack = NULL;
    uint8_t *f;
    TU_CHECK_RC(ts_frame_encode_envelope(s, 0, TS_FRAME_MAX_DEFAULT, &f, &n, err, sizeof err),
                TS_EINVAL);
    assert_null(f);
}

/* Field numbers outside protobuf's 1..2^29 − 1, which protobuf-c 1.4.1 keeps as unknown fields
 * when the tag is an overlong varint, are refused at every nesting level; unknown fields with
 * valid numbers are still ignored, and survive a re-encoding that decodes again. */
static void expect_field_number_refused(const uint8_t *b, size_t n, const char *path) {
    char err[256] = "";
    Tessera__Envelope *e = (Tessera__Envelope *)&e; /* must come back NULL */
    TU_CHECK_RC_MSG(ts_frame_decode_envelope(b, n, 0, &e, err, sizeof err), TS_ECORRUPT, err);
    assert_null(e);
    TU_CHECK_CONTAINS(err, path);
    TU_CHECK_CONTAINS(err, "not a valid protobuf");
    /* a parse error, not a rule broken: the connection closes (§3.4) */
    e = (Tessera__Envelope *)&e;
    TU_CHECK_RC(ts_frame_unpack_envelope(b, n, &e, err, sizeof err), TS_ECORRUPT);
    assert_null(e);
}

static void test_field_numbers(void **state) {
    (void)state;
    char err[256] = "";
    /* tests/fuzz: fuzz_envelope's crash-5f742231e1e6ff731f493bcfb58b023ee2307e1b
     * (base64 igEDigAACBCKAQOKAACKAQOCAAA=), byte for byte. It used to decode and check out as
     * an ack, and its re-encoding was refused. */
    static const uint8_t crash[] = {
        0x8a, 0x01, 0x03, 0x8a, 0x00, 0x00, /* ack { field 1 {} }, tag 0x0a as 0x8a 0x00 */
        0x08, 0x10,                         /* request_id 16 */
        0x8a, 0x01, 0x03, 0x8a, 0x00, 0x00, /* ack again: merged into the first */
        0x8a, 0x01, 0x03, 0x82, 0x00, 0x00, /* ack { field 0 as bytes, empty } */
    };
    expect_field_number_refused(crash, sizeof crash, "envelope.ack holds a field numbered 0");

    uint8_t b[96];
    size_t n = 0;
    /* the minimal form: request_id 1, ack { field 0 } */
    n += put_tag(b + n, 1, 0);
    n += put_varint(b + n, 1);
    n += put_tag(b + n, 17, 2);
    n += put_varint(b + n, 3);
    b[n++] = 0x82, b[n++] = 0x00, b[n++] = 0x00;
    expect_field_number_refused(b, n, "envelope.ack holds a field numbered 0");
    /* the same message with field 1000 instead is a later version's field: ignored */
    n -= 3;
    b[n - 1] = 3; /* ack's length */
    n += put_tag(b + n, 1000, 2);
    n += put_varint(b + n, 0);
    assert_int_equal(n, 8);
    Tessera__Envelope *e;
    TU_CHECK_RC_MSG(ts_frame_decode_envelope(b, n, 0, &e, err, sizeof err), TS_OK, err);
    assert_int_equal(e->ack->base.n_unknown_fields, 1);
    assert_int_equal(e->ack->base.unknown_fields[0].tag, 1000);
    uint8_t *f;
    size_t fn;
    TU_CHECK_OK(ts_frame_encode_envelope(e, 0, TS_FRAME_MAX_DEFAULT, &f, &fn, err, sizeof err));
    ts_frame_free(e);
    TU_CHECK_RC_MSG(ts_frame_decode_envelope(f + 4, fn - 4, 0, &e, err, sizeof err), TS_OK, err);
    assert_int_equal(e->ack->base.unknown_fields[0].tag, 1000);
    ts_frame_free(e);
    free(f);

    /* field 0 at the top level: an overlong varint tag, wire type 0, then a valid ack */
    n = 0;
    b[n++] = 0x80, b[n++] = 0x00, b[n++] = 0x07;
    n += put_tag(b + n, 1, 0);
    n += put_varint(b + n, 1);
    n += put_tag(b + n, 17, 2);
    n += put_varint(b + n, 0);
    expect_field_number_refused(b, n, "envelope holds a field numbered 0");

    /* field 2^29 (one past the largest): five bytes of tag, which protobuf-c reads whole */
    n = 0;
    b[n++] = 0x80, b[n++] = 0x80, b[n++] = 0x80, b[n++] = 0x80, b[n++] = 0x10, b[n++] = 0x00;
    n += put_tag(b + n, 1, 0);
    n += put_varint(b + n, 1);
    n += put_tag(b + n, 17, 2);
    n += put_varint(b + n, 0);
    expect_field_number_refused(b, n, "envelope holds a field numbered 536870912");

    /* deeper: a member of a status answer holding field 0 —
     * status_response { node_id, members { field 0 } } */
    n = 0;
    n += put_tag(b + n, 1, 0);
    n += put_varint(b + n, 1);
    n += put_tag(b + n, 57, 2);
    n += put_varint(b + n, 2 + 32 + 2 + 3);
    n += put_tag(b + n, 1, 2);
    n += put_varint(b + n, 32);
    memset(b + n, 0xab, 32);
    n += 32;
    n += put_tag(b + n, 2, 2);
    n += put_varint(b + n, 3);
    b[n++] = 0x82, b[n++] = 0x00, b[n++] = 0x00;
    expect_field_number_refused(b, n,
                                "envelope.status_response.members[0] holds a field numbered 0");

    /* the body of a signed advert is walked too */
    samples_init();
    uint8_t body[512];
    assert_true(S.advert.body.len + 3 <= sizeof body);
    memcpy(body, S.advert.body.data, S.advert.body.len);
    memcpy(body + S.advert.body.len, "\x82\x00\x00", 3);
    ProtobufCBinaryData bd = {S.advert.body.len + 3, body};
    Tessera__AdvertBody *a = (Tessera__AdvertBody *)&a;
    TU_CHECK_RC(ts_frame_decode_advert_body(&bd, 0, &a, err, sizeof err), TS_ECORRUPT);
    assert_null(a);
    TU_CHECK_CONTAINS(err, "field numbered 0");
    bd.len -= 3; /* and the body without it is fine */
    TU_CHECK_RC_MSG(ts_frame_decode_advert_body(&bd, 0, &a, err, sizeof err), TS_OK, err);
    ts_frame_free(a);

    /* a hand-built envelope carrying field 0 is not encoded into bytes nobody could decode */
    samples_init();
    Tessera__Envelope *s = sample(TESSERA__ENVELOPE__BODY_ACK);
    ProtobufCMessageUnknownField uf = {0, PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED, 0, NULL};
    s->ack->base.n_unknown_fields = 1;
    s->ack->base.unknown_fields = &uf;
    f = (uint8_t *)&f;
    TU_CHECK_RC(ts_frame_encode_envelope(s, 0, TS_FRAME_MAX_DEFAULT, &f, &fn, err, sizeof err),
                TS_EINVAL);
    assert_null(f);
    TU_CHECK_CONTAINS(err, "envelope.ack holds a field numbered 0");
    s->ack->base.n_unknown_fields = 0;
    s->ack->base.unknown_fields = NULL;
}

static void test_header_rules(void **state) {
    (void)state;
    char err[256] = "";
    Tessera__Envelope *e;

    samples_init();
    e = sample(TESSERA__ENVELOPE__BODY_PING);
    e->has_request_id = 0;
    TU_CHECK_RC(decode_raw(e, 0, err, sizeof err), TS_ECORRUPT);
    TU_CHECK_CONTAINS(err, "ping needs a non-zero request_id");
    SET(*e, request_id, 0); /* present and zero is the same */
    TU_CHECK_RC(decode_raw(e, 0, err, sizeof err), TS_ECORRUPT);

    e = sample(TESSERA__ENVELOPE__BODY_CHUNK);
    e->request_id = 0;
    TU_CHECK_RC(decode_raw(e, 0, err, sizeof err), TS_ECORRUPT);
    TU_CHECK_CONTAINS(err, "chunk needs a non-zero request_id");

    e = sample(TESSERA__ENVELOPE__BODY_CANCEL);
    SET(*e, request_id, 3);
    TU_CHECK_RC(decode_raw(e, 0, err, sizeof err), TS_ECORRUPT);
    TU_CHECK_CONTAINS(err, "one-way");

    e = sample(TESSERA__ENVELOPE__BODY_ACK);
    SET(*e, deadline_ms, 10);
    TU_CHECK_RC(decode_raw(e, 0, err, sizeof err), TS_ECORRUPT);
    TU_CHECK_CONTAINS(err, "must not carry a deadline");

    e = sample(TESSERA__ENVELOPE__BODY_DENOISE_REQUEST);
    e->has_deadline_ms = 0;
    TU_CHECK_RC(decode_raw(e, 0, err, sizeof err), TS_ECORRUPT);
    TU_CHECK_CONTAINS(err, "denoise_request needs a deadline_ms");

    /* an error may answer no request in particular */
    e = sample(TESSERA__ENVELOPE__BODY_ERROR);
    e->has_request_id = 0;
    TU_CHECK_RC_MSG(decode_raw(e, 0, err, sizeof err), TS_OK, err);
    /* other requests may leave the deadline to the receiver */
    e = sample(TESSERA__ENVELOPE__BODY_STATUS_REQUEST);
    e->has_deadline_ms = 0;
    TU_CHECK_RC_MSG(decode_raw(e, 0, err, sizeof err), TS_OK, err);
}

/* Bytes that are not an Envelope, and every truncation of one that is. */
static void test_garbage_and_truncations(void **state) {
    (void)state;
    const struct {
        uint8_t b[8];
        size_t n;
    } junk[] = {
        {{0xFF}, 1},             /* an unfinished tag */
        {{0x08}, 1},             /* a tag without its varint */
        {{0x0A, 0x05, 0x01}, 3}, /* field 1 as bytes, longer than what follows */
        {{0x0F, 0x00}, 2},       /* wire type 7 */
        {{0x08, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}, 8}, /* a varint that never ends */
        {{0x82, 0x01, 0x7F, 0x00}, 4},                         /* a ping of 127 bytes, 1 there */
    };
    char err[256] = "";
    Tessera__Envelope *e;
    for (size_t i = 0; i < N_OF(junk); i++) {
        TU_CHECK_RC_MSG(ts_frame_decode_envelope(junk[i].b, junk[i].n, 0, &e, err, sizeof err),
                        TS_ECORRUPT, err);
        assert_null(e);
    }
    TU_CHECK_CONTAINS(err, "not a valid protobuf");
    for (size_t b = 0; b < N_OF(BODIES); b++) {
        size_t n;
        uint8_t *frame = sample_frame(BODIES[b].c, &n);
        for (size_t cut = 0; cut < n - 4; cut++) {
            int rc = ts_frame_decode_envelope(frame + 4, cut, 0, &e, err, sizeof err);
            if (rc == TS_OK)
                fail_msg("%s cut to %zu of %zu bytes was accepted", BODIES[b].name, cut, n - 4);
            assert_null(e);
        }
        free(frame);
    }
}

/* ---- tensors ------------------------------------------------------------------------------ */

static void test_tensor_rules(void **state) {
    (void)state;
    char err[256] = "";
    const unsigned F = TS_FRAME_CHECK_FINITE;
    Tessera__Envelope *e;
    int64_t shape5[5] = {1, 2, 1, 4, 4};

    samples_init();
    e = sample(TESSERA__ENVELOPE__BODY_DENOISE_REQUEST);
    S.x_t.n_shape = 5, S.x_t.shape = shape5;
    TU_CHECK_RC(decode_raw(e, 0, err, sizeof err), TS_ESHAPE);
    TU_CHECK_CONTAINS(err, "denoise_request.x_t has 5 dimensions");

    samples_init();
    e = sample(TESSERA__ENVELOPE__BODY_DENOISE_REQUEST);
    S.img_shape[2] = 0, S.img_shape[3] = 32; /* same element count */
    TU_CHECK_RC(decode_raw(e, 0, err, sizeof err), TS_ESHAPE);
    TU_CHECK_CONTAINS(err, "dimension 2 is 0");
    S.img_shape[2] = -4, S.img_shape[3] = -4;
    TU_CHECK_RC(decode_raw(e, 0, err, sizeof err), TS_ESHAPE);
    TU_CHECK_CONTAINS(err, "dimension 2 is -4");

    samples_init();
    e = sample(TESSERA__ENVELOPE__BODY_DENOISE_REQUEST);
    S.img_shape[1] = (int64_t)1 << 62, S.img_shape[2] = (int64_t)1 << 62;
    TU_CHECK_RC(decode_raw(e, 0, err, sizeof err), TS_ERANGE);
    TU_CHECK_CONTAINS(err, "overflows");
    S.img_shape[1] = 1, S.img_shape[2] = (int64_t)1 << 61; /* fits size_t, × 4 bytes does not */
    TU_CHECK_RC(decode_raw(e, 0, err, sizeof err), TS_ERANGE);

    samples_init();
    e = sample(TESSERA__ENVELOPE__BODY_DENOISE_REQUEST);
    S.x_t.data.len -= 4;
    TU_CHECK_RC(decode_raw(e, 0, err, sizeof err), TS_ESHAPE);
    TU_CHECK_CONTAINS(err, "shape needs 32 × 4 bytes, data holds 124");
    S.x_t.has_data = 0;
    TU_CHECK_RC(decode_raw(e, 0, err, sizeof err), TS_ESHAPE);

    samples_init();
    e = sample(TESSERA__ENVELOPE__BODY_DENOISE_REQUEST);
    S.x_t.has_dtype = 0;
    TU_CHECK_RC(decode_raw(e, 0, err, sizeof err), TS_ECORRUPT);
    TU_CHECK_CONTAINS(err, "x_t.dtype is missing");
    SET(S.x_t, dtype, (Tessera__DType)9);
    TU_CHECK_RC(decode_raw(e, 0, err, sizeof err), TS_EDTYPE);
    SET(S.x_t, dtype, TESSERA__DTYPE__DTYPE_F16); /* twice the elements for the same bytes */
    TU_CHECK_RC(decode_raw(e, 0, err, sizeof err), TS_ESHAPE);

    samples_init();
    e = sample(TESSERA__ENVELOPE__BODY_DENOISE_REQUEST);
    S.x_t.n_shape = S.velocity.n_shape = 3; /* the two share img_shape */
    S.img_shape[0] = 2, S.img_shape[1] = 4, S.img_shape[2] = 4;
    TU_CHECK_RC(decode_raw(e, 0, err, sizeof err), TS_ESHAPE);
    TU_CHECK_CONTAINS(err, "not 4 (B, C, H, W)");
    e = sample(TESSERA__ENVELOPE__BODY_DENOISE_RESPONSE);
    TU_CHECK_RC(decode_raw(e, 0, err, sizeof err), TS_ESHAPE);
    TU_CHECK_CONTAINS(err, "denoise_response.velocity has 3 dimensions");
    samples_init();
    S.denoise_response.velocity = NULL;
    TU_CHECK_RC(decode_raw(sample(TESSERA__ENVELOPE__BODY_DENOISE_RESPONSE), 0, err, sizeof err),
                TS_ECORRUPT);
    TU_CHECK_CONTAINS(err, "velocity is missing");
    /* a signed answer's parts: a 64-byte signature, a bounded device class, a float precision */
    samples_init();
    static uint8_t sig[65];
    static char cls[TS_FRAME_DEVICE_MAX + 2];
    memset(cls, 'c', sizeof cls - 1);
    S.denoise_response.has_signature = 1;
    S.denoise_response.signature.data = sig;
    S.denoise_response.signature.len = 64;
    S.denoise_response.device_class = cls + 2; /* TS_FRAME_DEVICE_MAX − 1 bytes */
    S.denoise_response.has_precision = 1;
    S.denoise_response.precision = TESSERA__DTYPE__DTYPE_BF16;
    e = sample(TESSERA__ENVELOPE__BODY_DENOISE_RESPONSE);
    TU_CHECK_RC_MSG(decode_raw(e, 0, err, sizeof err), TS_OK, err);
    S.denoise_response.signature.len = 65;
    TU_CHECK_RC(decode_raw(e, 0, err, sizeof err), TS_ECORRUPT);
    TU_CHECK_CONTAINS(err, "denoise_response.signature is 65 bytes, not 64");
    S.denoise_response.signature.len = 64;
    S.denoise_response.device_class = cls;
    TU_CHECK_RC(decode_raw(e, 0, err, sizeof err), TS_ECORRUPT);
    TU_CHECK_CONTAINS(err, "device_class is longer than");
    S.denoise_response.device_class = cls + 2;
    S.denoise_response.precision = TESSERA__DTYPE__DTYPE_UNSPECIFIED;
    TU_CHECK_RC(decode_raw(e, 0, err, sizeof err), TS_ECORRUPT);
    TU_CHECK_CONTAINS(err, "is not F32, BF16 or F16");
    samples_init();

    /* non-finite values: only when asked for, and named by index */
    samples_init();
    e = sample(TESSERA__ENVELOPE__BODY_DENOISE_REQUEST);
    S.xt[5] = NAN;
    TU_CHECK_RC(decode_raw(e, F, err, sizeof err), TS_ENONFINITE);
    TU_CHECK_CONTAINS(err, "denoise_request.x_t: element 5 is NaN or infinite");
    TU_CHECK_RC_MSG(decode_raw(e, 0, err, sizeof err), TS_OK, err);
    S.xt[5] = 0.0f, S.xt[31] = -INFINITY;
    TU_CHECK_RC(decode_raw(e, F, err, sizeof err), TS_ENONFINITE);
    TU_CHECK_CONTAINS(err, "element 31");
    S.xt[31] = 3.4028235e38f; /* the largest finite float is fine */
    TU_CHECK_RC_MSG(decode_raw(e, F, err, sizeof err), TS_OK, err);
}

/* The non-finite check of each dtype, bit pattern by bit pattern (little-endian bytes). */
static void test_tensor_nonfinite_each_dtype(void **state) {
    (void)state;
    const struct {
        Tessera__DType d;
        uint32_t bits;
        int finite;
    } cases[] = {
        {TESSERA__DTYPE__DTYPE_F32, 0x7F800000u, 0}, /* +Inf */
        {TESSERA__DTYPE__DTYPE_F32, 0xFF800000u, 0}, /* −Inf */
        {TESSERA__DTYPE__DTYPE_F32, 0x7FC00000u, 0}, /* quiet NaN */
        {TESSERA__DTYPE__DTYPE_F32, 0xFF800001u, 0}, /* negative signalling NaN */
        {TESSERA__DTYPE__DTYPE_F32, 0x7F7FFFFFu, 1}, /* largest finite */
        {TESSERA__DTYPE__DTYPE_F32, 0x00000001u, 1}, /* smallest subnormal */
        {TESSERA__DTYPE__DTYPE_F16, 0x7C00u, 0},     /* +Inf */
        {TESSERA__DTYPE__DTYPE_F16, 0xFE00u, 0},     /* −NaN */
        {TESSERA__DTYPE__DTYPE_F16, 0x7C01u, 0},     /* NaN */
        {TESSERA__DTYPE__DTYPE_F16, 0x7BFFu, 1},     /* 65504 */
        {TESSERA__DTYPE__DTYPE_F16, 0xFBFFu, 1},     /* −65504 */
        {TESSERA__DTYPE__DTYPE_BF16, 0x7F80u, 0},    /* +Inf */
        {TESSERA__DTYPE__DTYPE_BF16, 0xFFC0u, 0},    /* −NaN */
        {TESSERA__DTYPE__DTYPE_BF16, 0x7F81u, 0},    /* NaN */
        {TESSERA__DTYPE__DTYPE_BF16, 0x7F7Fu, 1},    /* largest finite */
        {TESSERA__DTYPE__DTYPE_BF16, 0x3F80u, 1},    /* 1.0 */
    };
    for (size_t i = 0; i < N_OF(cases); i++) {
        size_t es = cases[i].d == TESSERA__DTYPE__DTYPE_F32 ? 4 : 2;
        uint8_t data[3 * 4] = {0}; /* three elements, the odd one last */
        for (size_t b = 0; b < es; b++)
            data[2 * es + b] = (uint8_t)(cases[i].bits >> (8 * b));
        int64_t shape[1] = {3};
        Tessera__Tensor t;
        tessera__tensor__init(&t);
        SET(t, dtype, cases[i].d);
        t.n_shape = 1, t.shape = shape;
        SET(t, data, bin(data, 3 * es));
        char err[256] = "";
        int want = cases[i].finite ? TS_OK : TS_ENONFINITE;
        int rc = ts_frame_check_tensor(&t, TS_FRAME_DTYPES_FLOAT, TS_FRAME_CHECK_FINITE, "t", err,
                                       sizeof err);
        if (rc != want)
            fail_msg("case %zu (dtype %d, bits 0x%X): got %d, want %d (%s)", i, (int)cases[i].d,
                     (unsigned)cases[i].bits, rc, want, err);
        if (!cases[i].finite)
            TU_CHECK_CONTAINS(err, "t: element 2");
        TU_CHECK_OK(ts_frame_check_tensor(&t, TS_FRAME_DTYPES_FLOAT, 0, "t", err, sizeof err));
        /* a dtype outside the allowed set */
        TU_CHECK_RC(ts_frame_check_tensor(&t, TS_FRAME_DTYPE_BIT(cases[i].d == 1 ? 2 : 1), 0, "t",
                                          err, sizeof err),
                    TS_EDTYPE);
    }
}

/* ts_tensor_t → wire → frame → wire → ts_tensor_t view. */
static void test_tensor_set_and_view(void **state) {
    (void)state;
    ts_tensor_t a;
    tu_alloc_f32(&a, 4, TS_SHAPE(3, 1, 2, 5));
    tu_rng_t rng = {3};
    tu_fill_uniform(&rng, &a, -1.0f, 1.0f);
    samples_init();
    Tessera__Tensor w;
    TU_CHECK_OK(ts_frame_tensor_set(&w, &a));
    S.denoise_request.x_t = &w;
    float t3[3] = {0.0f, 0.5f, 1.0f};
    int32_t y3[3] = {0, 1, 2};
    S.denoise_request.n_t = 3, S.denoise_request.t = t3;
    S.denoise_request.n_class_labels = 3, S.denoise_request.class_labels = y3;
    uint8_t *f;
    size_t n;
    char err[256] = "";
    TU_CHECK_RC_MSG(ts_frame_encode_envelope(sample(TESSERA__ENVELOPE__BODY_DENOISE_REQUEST),
                                             TS_FRAME_CHECK_FINITE, TS_FRAME_MAX_DEFAULT, &f, &n,
                                             err, sizeof err),
                    TS_OK, err);
    Tessera__Envelope *d;
    TU_CHECK_OK(ts_frame_decode_envelope(f + 4, n - 4, TS_FRAME_CHECK_FINITE, &d, NULL, 0));
    ts_tensor_t v;
    TU_CHECK_OK(ts_frame_tensor_view(d->denoise_request->x_t, &v));
    assert_true(ts_tensor_same_shape(&v, &a));
    assert_int_equal(v.dtype, TS_F32);
    assert_int_equal(v.owns, 0);
    assert_memory_equal(v.data, a.data, ts_tensor_nbytes(&a));
    /* the other dtypes map both ways */
    const ts_dtype_t dts[] = {TS_F16, TS_BF16};
    for (size_t i = 0; i < N_OF(dts); i++) {
        ts_tensor_t h;
        TU_CHECK_OK(ts_tensor_alloc(&h, dts[i], TS_CPU, 2, TS_SHAPE(2, 3)));
        TU_CHECK_OK(ts_frame_tensor_set(&w, &h));
        assert_int_equal(w.data.len, 12);
        ts_tensor_t back;
        TU_CHECK_OK(ts_frame_tensor_view(&w, &back));
        assert_int_equal(back.dtype, dts[i]);
        ts_tensor_free(&h);
    }
    /* I32 is no float; a broken wire tensor makes no view */
    ts_tensor_t idx;
    TU_CHECK_OK(ts_tensor_alloc(&idx, TS_I32, TS_CPU, 1, TS_SHAPE(4)));
    TU_CHECK_RC(ts_frame_tensor_set(&w, &idx), TS_EDTYPE);
    ts_tensor_free(&idx);
    TU_CHECK_OK(ts_frame_tensor_set(&w, &a));
    w.data.len--;
    TU_CHECK_RC(ts_frame_tensor_view(&w, &v), TS_EINVAL);
    ts_frame_free(d);
    free(f);
    ts_tensor_free(&a);
}

/* ---- the rules of each message ------------------------------------------------------------ */

/* Each case breaks one rule of one sample; decoding it must fail with code and mention what. */
typedef struct {
    const char *what;
    Tessera__Envelope__BodyCase body;
    void (*breaks)(void);
    int code;
} rule_case_t;

static void br_ping_target(void) { S.ping.target_id.len = 31; }
static void br_ping_no_target(void) { S.ping.has_target_id = 0; }
static void br_sig_short(void) { S.advert.signature.len = 63; }
static void br_sig_missing(void) { S.advert.has_signature = 0; }
static void br_advert_id(void) { S.advert.node_id.len = 33; }
static void br_body_empty(void) { S.advert.body.len = 0; }
static uint8_t g_huge_body[TS_FRAME_SIGNED_BODY_MAX + 1];
static void br_body_huge(void) { S.advert.body = bin(g_huge_body, sizeof g_huge_body); }
static void br_push_pull_state(void) { S.push_pull.has_state = 0; }
static void br_push_pull_empty(void) { S.push_pull.state.len = 0; }
static void br_member_status(void) { S.member[1].status = (Tessera__MemberStatus)9; }
static void br_member_id(void) { S.member[0].has_node_id = 0; }
static void br_member_incarnation(void) { S.member[1].has_incarnation = 0; }
static void br_member_addr(void) { S.member[0].addr = "10.0.0.1"; }
static void br_member_port(void) { S.member[1].addr = "[fd00::1]:0"; }
static void br_advert_request_id(void) { S.advert_request.has_node_id = 0; }
static void br_dial_back_addr(void) { S.dial_back_request.addr = "nohost"; }
static void br_dial_back_none(void) { S.dial_back_request.addr = NULL; }
static void br_dial_back_reachable(void) { S.dial_back_response.has_reachable = 0; }
static void br_expert_id(void) { S.denoise_request.expert_id.len = 64; }
static void br_t_count(void) { S.denoise_request.n_t = 1; }
static void br_t_range(void) { S.t[1] = 1.0001f; }
static void br_t_nan(void) { S.t[0] = NAN; }
static void br_labels_count(void) { S.denoise_request.n_class_labels = 3; }
static void br_label_negative(void) { S.labels[1] = -1; }
static void br_cfg_missing(void) { S.denoise_request.has_cfg_scale = 0; }
static void br_cfg_inf(void) { S.denoise_request.cfg_scale = INFINITY; }
static void br_cfg_big(void) { S.denoise_request.cfg_scale = 101.0f; }
static void br_manifest_count(void) { S.manifest.n_chunk_hashes = 2; }
static void br_manifest_hash(void) { S.chunk_hashes[2].len = 31; }
static void br_manifest_chunk_size(void) { S.manifest.chunk_size = 100; }
static void br_manifest_total(void) { S.manifest.total_size = 0; }
static void br_manifest_dtype(void) { S.manifest.has_dtype = 0; }
static void br_chunk_empty(void) { S.chunk.data.len = 0; }
static void br_chunk_hash(void) { S.chunk.has_chunk_hash = 0; }
static void br_chunk_request_hash(void) { S.chunk_request.chunk_hash.len = 0; }
static void br_manifest_request_hash(void) { S.manifest_request.has_weights_hash = 0; }
static void br_status_node(void) { S.status_response.has_node_id = 0; }
static void br_status_cluster_zero(void) { S.cluster.live_experts = 0; }
static void br_status_uncovered(void) { S.uncovered.has_cluster = 0; }
static void br_status_capacity(void) { S.aggregates.total_capacity = -1.0f; }
static void br_status_training_step(void) { S.own_training.step = 10001; }
static void br_status_training_rate(void) { S.own_training.steps_per_s = -1.0f; }
static void br_status_training_partition(void) { S.own_training.partition_id.len = 5; }
static void br_status_advert_sig(void) { S.advert.signature.len = 0; }
static void br_load_rate(void) { S.load.requests_per_s = NAN; }
static void br_error_code(void) { S.error.has_code = 0; }
static void br_error_utf8(void) { S.error.message = "overlong \xC0\xAF slash"; }
static void br_error_surrogate(void) { S.error.message = "\xED\xA0\x80"; }
static void br_error_truncated_utf8(void) { S.error.message = "caf\xC3"; }
static char g_long_message[TS_FRAME_MESSAGE_MAX + 2];
static void br_error_long(void) {
    memset(g_long_message, 'a', TS_FRAME_MESSAGE_MAX + 1);
    S.error.message = g_long_message;
}
static void br_busy(void) { S.busy.has_retry_after_ms = 0; }
static void br_cancel(void) { S.cancel.request_id = 0; }
static void br_accused(void) { S.accusation.accused.len = 31; }
static void br_accusation_id(void) { S.accusation.has_request_id = 0; }
static void br_accusation_unsigned(void) { S.signed_answer.has_signature = 0; }
static void br_accusation_no_request(void) { S.accusation.request = NULL; }
static void br_accusation_no_class(void) { S.signed_answer.device_class = NULL; }
static void br_accusation_bad_request(void) { S.denoise_request.has_cfg_scale = 0; }
static void br_verdict(void) { S.verdict.has_upheld = 0; }

static const rule_case_t RULES[] = {
    {"accusation.accused is 31 bytes", TESSERA__ENVELOPE__BODY_ACCUSATION, br_accused, TS_ECORRUPT},
    {"accusation.request_id is missing", TESSERA__ENVELOPE__BODY_ACCUSATION, br_accusation_id,
     TS_ECORRUPT},
    {"accusation.answer lacks its signature", TESSERA__ENVELOPE__BODY_ACCUSATION,
     br_accusation_unsigned, TS_ECORRUPT},
    {"accusation.answer lacks its signature, device_class", TESSERA__ENVELOPE__BODY_ACCUSATION,
     br_accusation_no_class, TS_ECORRUPT},
    {"accusation.request is missing", TESSERA__ENVELOPE__BODY_ACCUSATION, br_accusation_no_request,
     TS_ECORRUPT},
    {"denoise_request.cfg_scale is missing", TESSERA__ENVELOPE__BODY_ACCUSATION,
     br_accusation_bad_request, TS_ECORRUPT},
    {"accusation_verdict.upheld is missing", TESSERA__ENVELOPE__BODY_ACCUSATION_VERDICT, br_verdict,
     TS_ECORRUPT},
    {"ping.target_id is 31 bytes", TESSERA__ENVELOPE__BODY_PING, br_ping_target, TS_ECORRUPT},
    {"ping.target_id is missing", TESSERA__ENVELOPE__BODY_PING, br_ping_no_target, TS_ECORRUPT},
    {"advert.signature is 63 bytes", TESSERA__ENVELOPE__BODY_ADVERT, br_sig_short, TS_ECORRUPT},
    {"advert.signature is missing", TESSERA__ENVELOPE__BODY_ADVERT, br_sig_missing, TS_ECORRUPT},
    {"advert.node_id is 33 bytes", TESSERA__ENVELOPE__BODY_ADVERT, br_advert_id, TS_ECORRUPT},
    {"advert.body is missing", TESSERA__ENVELOPE__BODY_ADVERT, br_body_empty, TS_ECORRUPT},
    {"advert.body is 65537 bytes", TESSERA__ENVELOPE__BODY_ADVERT, br_body_huge, TS_ERANGE},
    {"push_pull.state is missing", TESSERA__ENVELOPE__BODY_PUSH_PULL, br_push_pull_state,
     TS_ECORRUPT},
    {"push_pull.state is missing", TESSERA__ENVELOPE__BODY_PUSH_PULL, br_push_pull_empty,
     TS_ECORRUPT},
    {"status_response.members[1].status 9", TESSERA__ENVELOPE__BODY_STATUS_RESPONSE,
     br_member_status, TS_ECORRUPT},
    {"status_response.members[0].node_id is missing", TESSERA__ENVELOPE__BODY_STATUS_RESPONSE,
     br_member_id, TS_ECORRUPT},
    {"status_response.members[1].incarnation is missing", TESSERA__ENVELOPE__BODY_STATUS_RESPONSE,
     br_member_incarnation, TS_ECORRUPT},
    {"status_response.members[0].addr \"10.0.0.1\" is not a host:port",
     TESSERA__ENVELOPE__BODY_STATUS_RESPONSE, br_member_addr, TS_ECORRUPT},
    {"status_response.members[1].addr \"[fd00::1]:0\"", TESSERA__ENVELOPE__BODY_STATUS_RESPONSE,
     br_member_port, TS_ECORRUPT},
    {"advert_request.node_id is missing", TESSERA__ENVELOPE__BODY_ADVERT_REQUEST,
     br_advert_request_id, TS_ECORRUPT},
    {"dial_back_request.addr is missing or not host:port",
     TESSERA__ENVELOPE__BODY_DIAL_BACK_REQUEST, br_dial_back_addr, TS_ECORRUPT},
    {"dial_back_request.addr is missing", TESSERA__ENVELOPE__BODY_DIAL_BACK_REQUEST,
     br_dial_back_none, TS_ECORRUPT},
    {"dial_back_response.reachable", TESSERA__ENVELOPE__BODY_DIAL_BACK_RESPONSE,
     br_dial_back_reachable, TS_ECORRUPT},
    {"denoise_request.expert_id is 64 bytes", TESSERA__ENVELOPE__BODY_DENOISE_REQUEST, br_expert_id,
     TS_ECORRUPT},
    {"denoise_request.t has 1 values for a batch of 2", TESSERA__ENVELOPE__BODY_DENOISE_REQUEST,
     br_t_count, TS_ESHAPE},
    {"denoise_request.t[1] is 1.0001", TESSERA__ENVELOPE__BODY_DENOISE_REQUEST, br_t_range,
     TS_ERANGE},
    {"denoise_request.t[0] is nan", TESSERA__ENVELOPE__BODY_DENOISE_REQUEST, br_t_nan, TS_ERANGE},
    {"class_labels has 3 values", TESSERA__ENVELOPE__BODY_DENOISE_REQUEST, br_labels_count,
     TS_ESHAPE},
    {"class_labels[1] is -1", TESSERA__ENVELOPE__BODY_DENOISE_REQUEST, br_label_negative,
     TS_ERANGE},
    {"denoise_request.cfg_scale is missing", TESSERA__ENVELOPE__BODY_DENOISE_REQUEST,
     br_cfg_missing, TS_ECORRUPT},
    {"cfg_scale is inf", TESSERA__ENVELOPE__BODY_DENOISE_REQUEST, br_cfg_inf, TS_ERANGE},
    {"cfg_scale is 101", TESSERA__ENVELOPE__BODY_DENOISE_REQUEST, br_cfg_big, TS_ERANGE},
    {"lists 2 chunk hashes; 2621440 bytes in chunks of 1048576 need 3",
     TESSERA__ENVELOPE__BODY_WEIGHTS_MANIFEST, br_manifest_count, TS_ECORRUPT},
    {"chunk_hashes[2] is 31 bytes", TESSERA__ENVELOPE__BODY_WEIGHTS_MANIFEST, br_manifest_hash,
     TS_ECORRUPT},
    {"chunk_size 100 is outside", TESSERA__ENVELOPE__BODY_WEIGHTS_MANIFEST, br_manifest_chunk_size,
     TS_ERANGE},
    {"total_size 0 is outside", TESSERA__ENVELOPE__BODY_WEIGHTS_MANIFEST, br_manifest_total,
     TS_ERANGE},
    {"weights_manifest.dtype is missing", TESSERA__ENVELOPE__BODY_WEIGHTS_MANIFEST,
     br_manifest_dtype, TS_ECORRUPT},
    {"chunk.data is missing", TESSERA__ENVELOPE__BODY_CHUNK, br_chunk_empty, TS_ECORRUPT},
    {"chunk.chunk_hash is missing", TESSERA__ENVELOPE__BODY_CHUNK, br_chunk_hash, TS_ECORRUPT},
    {"chunk_request.chunk_hash is 0 bytes", TESSERA__ENVELOPE__BODY_CHUNK_REQUEST,
     br_chunk_request_hash, TS_ECORRUPT},
    {"weights_manifest_request.weights_hash is missing",
     TESSERA__ENVELOPE__BODY_WEIGHTS_MANIFEST_REQUEST, br_manifest_request_hash, TS_ECORRUPT},
    {"status_response.node_id is missing", TESSERA__ENVELOPE__BODY_STATUS_RESPONSE, br_status_node,
     TS_ECORRUPT},
    {"clusters[0].live_experts must be", TESSERA__ENVELOPE__BODY_STATUS_RESPONSE,
     br_status_cluster_zero, TS_ECORRUPT},
    {"uncovered[0].cluster is missing", TESSERA__ENVELOPE__BODY_STATUS_RESPONSE,
     br_status_uncovered, TS_ECORRUPT},
    {"aggregates.total_capacity is -1", TESSERA__ENVELOPE__BODY_STATUS_RESPONSE, br_status_capacity,
     TS_ERANGE},
    {"status_response.training needs step <= steps", TESSERA__ENVELOPE__BODY_STATUS_RESPONSE,
     br_status_training_step, TS_ECORRUPT},
    {"status_response.training.steps_per_s is -1", TESSERA__ENVELOPE__BODY_STATUS_RESPONSE,
     br_status_training_rate, TS_ERANGE},
    {"status_response.training.partition_id is 5 bytes", TESSERA__ENVELOPE__BODY_STATUS_RESPONSE,
     br_status_training_partition, TS_ECORRUPT},
    {"status_response.adverts[0].signature is 0 bytes", TESSERA__ENVELOPE__BODY_STATUS_RESPONSE,
     br_status_advert_sig, TS_ECORRUPT},
    {"status_response.load.requests_per_s", TESSERA__ENVELOPE__BODY_STATUS_RESPONSE, br_load_rate,
     TS_ERANGE},
    {"error.code is missing", TESSERA__ENVELOPE__BODY_ERROR, br_error_code, TS_ECORRUPT},
    {"error.message is not UTF-8", TESSERA__ENVELOPE__BODY_ERROR, br_error_utf8, TS_ECORRUPT},
    {"error.message is not UTF-8", TESSERA__ENVELOPE__BODY_ERROR, br_error_surrogate, TS_ECORRUPT},
    {"error.message is not UTF-8", TESSERA__ENVELOPE__BODY_ERROR, br_error_truncated_utf8,
     TS_ECORRUPT},
    {"error.message is 1025 bytes", TESSERA__ENVELOPE__BODY_ERROR, br_error_long, TS_ERANGE},
    {"busy.retry_after_ms is missing", TESSERA__ENVELOPE__BODY_BUSY, br_busy, TS_ECORRUPT},
    {"cancel.request_id is missing", TESSERA__ENVELOPE__BODY_CANCEL, br_cancel, TS_ECORRUPT},
};

static void test_message_rules(void **state) {
    (void)state;
    for (size_t i = 0; i < N_OF(RULES); i++) {
        samples_init();
        Tessera__Envelope *e = sample(RULES[i].body);
        char err[256] = "";
        TU_CHECK_RC_MSG(decode_raw(e, 0, err, sizeof err), TS_OK, err); /* valid before */
        RULES[i].breaks();
        int rc = decode_raw(e, 0, err, sizeof err);
        if (rc != RULES[i].code)
            fail_msg("rule %zu (%s): got %d (%s), want %d; err: %s", i, RULES[i].what, rc,
                     ts_strerror(rc), RULES[i].code, err);
        TU_CHECK_CONTAINS(err, RULES[i].what);
        /* the sender's side refuses the same envelope, and writes nothing */
        uint8_t *f = (uint8_t *)1;
        size_t n = 1;
        assert_int_equal(ts_frame_encode_envelope(e, 0, TS_FRAME_MAX_DEFAULT, &f, &n, NULL, 0),
                         RULES[i].code);
        assert_null(f);
        assert_int_equal(n, 0);
    }
    /* values accepted at the edges */
    samples_init();
    char err[256] = "";
    S.t[0] = 0.0f, S.t[1] = 1.0f, S.denoise_request.cfg_scale = -100.0f;
    S.labels[0] = 0;
    TU_CHECK_RC_MSG(decode_raw(sample(TESSERA__ENVELOPE__BODY_DENOISE_REQUEST), 0, err, sizeof err),
                    TS_OK, err);
    S.error.message = "ünïcødé ✓ 𝄞";
    SET(S.error, code, (Tessera__ErrorCode)99); /* a later version's code */
    TU_CHECK_RC_MSG(decode_raw(sample(TESSERA__ENVELOPE__BODY_ERROR), 0, err, sizeof err), TS_OK,
                    err);
    S.error.message = NULL;
    TU_CHECK_RC_MSG(decode_raw(sample(TESSERA__ENVELOPE__BODY_ERROR), 0, err, sizeof err), TS_OK,
                    err);
    S.manifest.total_size = 3u << 20; /* an exact multiple: still 3 chunks */
    TU_CHECK_RC_MSG(
        decode_raw(sample(TESSERA__ENVELOPE__BODY_WEIGHTS_MANIFEST), 0, err, sizeof err), TS_OK,
        err);
    S.member[0].addr = NULL; /* a member's address and advert version are optional */
    S.member[0].has_advert_version = 0;
    S.member[0].status = TESSERA__MEMBER_STATUS__MEMBER_LEFT;
    TU_CHECK_RC_MSG(decode_raw(sample(TESSERA__ENVELOPE__BODY_STATUS_RESPONSE), 0, err, sizeof err),
                    TS_OK, err);
}

static void test_encode_limits(void **state) {
    (void)state;
    samples_init();
    uint8_t *f = NULL;
    size_t n = 0;
    char err[256] = "";
    Tessera__Envelope *e = sample(TESSERA__ENVELOPE__BODY_CHUNK);
    size_t need = protobuf_c_message_get_packed_size(&e->base);
    TU_CHECK_RC(ts_frame_encode_envelope(e, 0, (uint32_t)need - 1, &f, &n, err, sizeof err),
                TS_ERANGE);
    TU_CHECK_CONTAINS(err, "more than max_frame");
    assert_null(f);
    TU_CHECK_OK(ts_frame_encode_envelope(e, 0, (uint32_t)need, &f, &n, err, sizeof err));
    assert_int_equal(n, need + 4);
    free(f);
    TU_CHECK_RC(ts_frame_encode_envelope(NULL, 0, 100, &f, &n, err, sizeof err), TS_EINVAL);
    TU_CHECK_RC(ts_frame_encode_envelope(e, 0, 100, NULL, &n, err, sizeof err), TS_EINVAL);
    TU_CHECK_RC(ts_frame_check_envelope((const Tessera__Envelope *)&S.ping, 0, err, sizeof err),
                TS_EINVAL);
}

/* ---- signed bodies ------------------------------------------------------------------------ */

static void test_signed_bodies(void **state) {
    (void)state;
    samples_init();
    char err[256] = "";
    Tessera__AdvertBody *ad;
    TU_CHECK_RC_MSG(
        ts_frame_decode_advert_body(&S.advert.body, TS_FRAME_CHECK_FINITE, &ad, err, sizeof err),
        TS_OK, err);
    assert_int_equal(ad->cluster, 3);
    assert_int_equal(ad->model->hidden_size, 128);
    assert_int_equal(ad->model->freq_dim, 256); /* absent: the schema's default */
    assert_memory_equal(ad->centroid->data.data, S.centroid, sizeof S.centroid);
    ts_frame_free(ad);

    /* one broken rule at a time */
    const struct {
        const char *what;
        int code;
    } cases[] = {
        {"advert body.cluster 8 is not below num_clusters 8", TS_ERANGE},
        {"advert body.model.depth is missing", TS_ECORRUPT},
        {"advert body.model.mlp_ratio is missing or zero", TS_ECORRUPT},
        {"advert body.objective 0", TS_ECORRUPT},
        {"advert body.centroid: dtype BF16", TS_EDTYPE},
        {"advert body.centroid must be one dimension", TS_ESHAPE},
        {"advert body.centroid must be one dimension of 1..4096", TS_ESHAPE},
        {"advert body.centroid: element 7 is NaN", TS_ENONFINITE},
        {"advert body.capacity.max_batch", TS_ECORRUPT},
        {"advert body.load is missing", TS_ECORRUPT},
        {"advert body.capacity.max_rows (63) is below max_batch (64)", TS_ECORRUPT},
        {"advert body.version is missing", TS_ECORRUPT},
        {"advert body.partition_id is 16 bytes", TS_ECORRUPT},
        {"advert body.capacity.model_bytes or row_bytes is over 2^50", TS_ECORRUPT},
        {"advert body.capacity.model_bytes or row_bytes is over 2^50", TS_ECORRUPT},
    };
    static uint16_t wide[4097];
    for (size_t i = 0; i < N_OF(cases); i++) {
        samples_init();
        int64_t two_d[2] = {4, 4};
        switch (i) {
        case 0: S.advert_body.cluster = 8; break;
        case 1: S.model.has_depth = 0; break;
        case 2: S.model.mlp_ratio = 0; break;
        case 3: S.advert_body.objective = TESSERA__OBJECTIVE__OBJECTIVE_UNSPECIFIED; break;
        case 4: S.centroid_t.dtype = TESSERA__DTYPE__DTYPE_BF16; break;
        case 5: S.centroid_t.n_shape = 2, S.centroid_t.shape = two_d; break;
        case 6:
            S.centroid_shape[0] = 4097;
            S.centroid_t.data = bin(wide, sizeof wide);
            break;
        case 7: S.centroid[7] = 0x7E00; break; /* F16 NaN */
        case 8: S.capacity.has_max_batch = 0; break;
        case 9: S.advert_body.load = NULL; break;
        case 10: S.capacity.has_max_rows = 1, S.capacity.max_rows = 63; break;
        case 11: S.advert_body.version = 0; break;
        case 12: S.advert_body.partition_id.len = 16; break;
        case 13: S.capacity.has_model_bytes = 1, S.capacity.model_bytes = (1ull << 50) + 1; break;
        case 14: S.capacity.has_row_bytes = 1, S.capacity.row_bytes = UINT64_MAX; break;
        }
        samples_sign();
        Tessera__AdvertBody *vo = NULL;
        int rc = ts_frame_decode_advert_body(&S.advert.body, TS_FRAME_CHECK_FINITE, &vo, err,
                                             sizeof err);
        if (rc != cases[i].code)
            fail_msg("case %zu (%s): got %d, want %d; err: %s", i, cases[i].what, rc, cases[i].code,
                     err);
        TU_CHECK_CONTAINS(err, cases[i].what);
        assert_null(vo);
    }
    /* not a body at all, and a body over the limit */
    ProtobufCBinaryData junk = bin("\xFF\xFF", 2);
    TU_CHECK_RC(ts_frame_decode_advert_body(&junk, 0, &ad, err, sizeof err), TS_ECORRUPT);
    ProtobufCBinaryData huge = bin(g_huge_body, sizeof g_huge_body);
    TU_CHECK_RC(ts_frame_decode_advert_body(&huge, 0, &ad, err, sizeof err), TS_ERANGE);
}

/* ---- the decode budget -------------------------------------------------------------------- */

/* An envelope whose body is field `field` holding n copies of `item` (itemlen bytes), with
 * request_id 1 and a deadline. */
static uint8_t *repeat_body(unsigned field, const uint8_t *item, size_t itemlen, size_t n,
                            size_t *len) {
    uint8_t *buf = malloc(32 + itemlen * n);
    assert_non_null(buf);
    size_t p = 0;
    p += put_tag(buf + p, 1, 0);
    p += put_varint(buf + p, 1);
    p += put_tag(buf + p, 2, 0);
    p += put_varint(buf + p, 1000);
    p += put_tag(buf + p, field, 2);
    p += put_varint(buf + p, itemlen * n);
    for (size_t i = 0; i < n; i++, p += itemlen)
        memcpy(buf + p, item, itemlen);
    *len = p;
    return buf;
}

/* Hostile encodings that expand far more than their size are refused within the budget. */
static void test_decode_budget_hostile(void **state) {
    (void)state;
    const struct {
        const char *what;
        unsigned field;
        uint8_t item[4];
        size_t itemlen;
    } cases[] = {
        {"empty member states", 57, {0x12, 0x00}, 2},   /* status_response.members: {} */
        {"unpacked class labels", 40, {0x20, 0x01}, 2}, /* denoise_request.class_labels: 1 */
        {"unknown fields", 16, {0xC0, 0x3E, 0x01}, 3},  /* ping: field 1000 = 1 */
        {"empty adverts", 57, {0x1A, 0x00}, 2},         /* status_response.adverts: {} */
    };
    for (size_t i = 0; i < N_OF(cases); i++) {
        size_t len;
        uint8_t *buf = repeat_body(cases[i].field, cases[i].item, cases[i].itemlen, 100000, &len);
        size_t budget = TS_FRAME_DECODE_FACTOR * len + TS_FRAME_DECODE_SLACK;
        Tessera__Envelope *e;
        char err[256] = "";
        alloc_reset();
        int rc = ts_frame_decode_envelope(buf, len, 0, &e, err, sizeof err);
        if (rc != TS_ERANGE)
            fail_msg("%s: got %d (%s), want TS_ERANGE", cases[i].what, rc, err);
        TU_CHECK_CONTAINS(err, "would allocate more than");
        assert_null(e);
        if (g_alloc.total > budget)
            fail_msg("%s: %zu bytes allocated for %zu on the wire, budget %zu", cases[i].what,
                     g_alloc.total, len, budget);
        free(buf);

        /* a few of the same are fine (within the slack), whatever else they break */
        buf = repeat_body(cases[i].field, cases[i].item, cases[i].itemlen, 10, &len);
        rc = ts_frame_decode_envelope(buf, len, 0, &e, err, sizeof err);
        assert_int_not_equal(rc, TS_ERANGE);
        ts_frame_free(e);
        free(buf);
    }
    /* out of memory inside protobuf-c is reported as such, not as a bad frame */
    size_t n;
    uint8_t *frame = sample_frame(TESSERA__ENVELOPE__BODY_STATUS_RESPONSE, &n);
    int failed = 0;
    for (int k = 1; k <= 12; k++) {
        Tessera__Envelope *e;
        char err[256] = "";
        alloc_reset();
        g_fail_in = k;
        int rc = ts_frame_decode_envelope(frame + 4, n - 4, 0, &e, err, sizeof err);
        g_fail_in = 0;
        if (g_alloc.calls < (size_t)k) { /* fewer allocations than k: it succeeded */
            TU_CHECK_RC_MSG(rc, TS_OK, err);
            ts_frame_free(e);
            continue;
        }
        TU_CHECK_RC_MSG(rc, TS_ENOMEM, err);
        assert_null(e);
        failed++;
    }
    assert_true(failed >= 6); /* a status response takes a dozen allocations or so */
    free(frame);
}

/* What legitimate frames cost: large status answers, manifests and tensors stay well inside
 * half the budget, which is what the header promises. */
static void test_decode_budget_legitimate(void **state) {
    (void)state;
    samples_init();
    enum { MEMBERS = 2000, HASHES = 20000 };
    Tessera__MemberState **many = malloc(MEMBERS * sizeof *many);
    Tessera__Advert **ads = malloc(MEMBERS * sizeof *ads);
    ProtobufCBinaryData *hashes = malloc(HASHES * sizeof *hashes);
    assert_true(many && ads && hashes);
    for (int i = 0; i < MEMBERS; i++) {
        many[i] = &S.member[i % 2];
        ads[i] = &S.advert;
    }
    for (int i = 0; i < HASHES; i++)
        hashes[i] = bin(S.hash, 32);
    S.status_response.n_members = MEMBERS, S.status_response.members = many;
    S.status_response.n_adverts = MEMBERS, S.status_response.adverts = ads;
    S.manifest.n_chunk_hashes = HASHES, S.manifest.chunk_hashes = hashes;
    SET(S.manifest, chunk_size, TS_FRAME_CHUNK_MIN);
    SET(S.manifest, total_size, (uint64_t)HASHES * TS_FRAME_CHUNK_MIN);
    enum { BIG = 4 << 20 };
    uint8_t *chunk = calloc(1, BIG);
    assert_non_null(chunk);
    SET(S.chunk, data, bin(chunk, BIG));
    float *ts = malloc(4096 * sizeof *ts);
    int32_t *ys = malloc(4096 * sizeof *ys);
    float *xs = calloc(4096 * 64, sizeof *xs);
    assert_true(ts && ys && xs);
    for (int i = 0; i < 4096; i++)
        ts[i] = 0.5f, ys[i] = i % 11;
    int64_t shape[4] = {4096, 1, 8, 8};
    S.x_t.shape = shape;
    S.x_t.data = bin(xs, 4096 * 64 * sizeof *xs);
    S.denoise_request.n_t = 4096, S.denoise_request.t = ts;
    S.denoise_request.n_class_labels = 4096, S.denoise_request.class_labels = ys;

    const Tessera__Envelope__BodyCase bodies[] = {
        TESSERA__ENVELOPE__BODY_STATUS_RESPONSE,  TESSERA__ENVELOPE__BODY_PUSH_PULL,
        TESSERA__ENVELOPE__BODY_WEIGHTS_MANIFEST, TESSERA__ENVELOPE__BODY_CHUNK,
        TESSERA__ENVELOPE__BODY_DENOISE_REQUEST,  TESSERA__ENVELOPE__BODY_PING};
    for (size_t i = 0; i < N_OF(bodies); i++) {
        uint8_t *f;
        size_t n;
        char err[256] = "";
        TU_CHECK_RC_MSG(ts_frame_encode_envelope(sample(bodies[i]), 0, TS_FRAME_MAX_DEFAULT, &f, &n,
                                                 err, sizeof err),
                        TS_OK, err);
        Tessera__Envelope *e;
        alloc_reset();
        TU_CHECK_RC_MSG(ts_frame_decode_envelope(f + 4, n - 4, 0, &e, err, sizeof err), TS_OK, err);
        size_t half = TS_FRAME_DECODE_FACTOR / 2 * (n - 4) + TS_FRAME_DECODE_SLACK / 2;
        print_message("  %-16s %9zu bytes on the wire, %9zu allocated (%.2f×)\n",
                      ts_frame_body_name(bodies[i]), n - 4, g_alloc.total,
                      (double)g_alloc.total / (double)(n - 4));
        if (g_alloc.total > half)
            fail_msg("%s: %zu bytes allocated for %zu on the wire, over half the budget",
                     ts_frame_body_name(bodies[i]), g_alloc.total, n - 4);
        ts_frame_free(e);
        free(f);
    }
    free(many);
    free(ads);
    free(hashes);
    free(chunk);
    free(ts);
    free(ys);
    free(xs);
}

/* ---- docs/protocol.md against the compiled schema ----------------------------------------- */

static const ProtobufCMessageDescriptor *const MESSAGES[] = {
    &tessera__tensor__descriptor,
    &tessera__model_config__descriptor,
    &tessera__capacity__descriptor,
    &tessera__load__descriptor,
    &tessera__ping__descriptor,
    &tessera__ack__descriptor,
    &tessera__member_state__descriptor,
    &tessera__push_pull__descriptor,
    &tessera__advert_request__descriptor,
    &tessera__advert__descriptor,
    &tessera__advert_body__descriptor,
    &tessera__training_status__descriptor,
    &tessera__denoise_request__descriptor,
    &tessera__timings__descriptor,
    &tessera__denoise_response__descriptor,
    &tessera__weights_manifest_request__descriptor,
    &tessera__weights_manifest__descriptor,
    &tessera__chunk_request__descriptor,
    &tessera__chunk__descriptor,
    &tessera__status_request__descriptor,
    &tessera__dial_back_request__descriptor,
    &tessera__dial_back_response__descriptor,
    &tessera__relay_reserve__descriptor,
    &tessera__relay_ended__descriptor,
    &tessera__relay_event__descriptor,
    &tessera__cluster_experts__descriptor,
    &tessera__cluster_ref__descriptor,
    &tessera__aggregates__descriptor,
    &tessera__status_response__descriptor,
    &tessera__ban__descriptor,
    &tessera__accusation__descriptor,
    &tessera__accusation_verdict__descriptor,
    &tessera__error__descriptor,
    &tessera__busy__descriptor,
    &tessera__cancel__descriptor,
    &tessera__envelope__descriptor,
};

static const ProtobufCEnumDescriptor *const ENUMS[] = {
    &tessera__dtype__descriptor,
    &tessera__objective__descriptor,
    &tessera__member_status__descriptor,
    &tessera__error_code__descriptor,
};

/* The type column of the docs for field f: "uint64", "repeated int64", "Tensor", "DType". */
static void field_type(const ProtobufCFieldDescriptor *f, char *out, size_t len) {
    const char *t = "?";
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32: t = "int32"; break;
    case PROTOBUF_C_TYPE_INT64: t = "int64"; break;
    case PROTOBUF_C_TYPE_UINT32: t = "uint32"; break;
    case PROTOBUF_C_TYPE_UINT64: t = "uint64"; break;
    case PROTOBUF_C_TYPE_FLOAT: t = "float"; break;
    case PROTOBUF_C_TYPE_BOOL: t = "bool"; break;
    case PROTOBUF_C_TYPE_STRING: t = "string"; break;
    case PROTOBUF_C_TYPE_BYTES: t = "bytes"; break;
    case PROTOBUF_C_TYPE_ENUM:
        t = ((const ProtobufCEnumDescriptor *)f->descriptor)->short_name;
        break;
    case PROTOBUF_C_TYPE_MESSAGE:
        t = ((const ProtobufCMessageDescriptor *)f->descriptor)->short_name;
        break;
    default: break;
    }
    snprintf(out, len, "%s%s", f->label == PROTOBUF_C_LABEL_REPEATED ? "repeated " : "", t);
}

/* Splits a table row "| a | `b` | c |" into up to max trimmed cells without backticks. */
static int split_row(char *line, char **cells, int max) {
    if (line[0] != '|')
        return 0;
    int n = 0;
    char *p = line + 1;
    while (n < max) {
        char *bar = strchr(p, '|');
        if (!bar)
            break;
        *bar = '\0';
        while (*p == ' ' || *p == '`')
            p++;
        char *end = bar;
        while (end > p && (end[-1] == ' ' || end[-1] == '`'))
            end--;
        *end = '\0';
        cells[n++] = p;
        p = bar + 1;
    }
    return n;
}

/* Every message and enum of the schema has a section "#### `Name`" in docs/protocol.md whose
 * table lists exactly its fields (number, name, type) or values (number, name); and the
 * schema's message list here matches proto/tessera.proto. */
static void test_docs_match_schema(void **state) {
    (void)state;
    size_t len;
    char *doc = (char *)tu_read_file(TS_PROTOCOL_MD, &len);
    doc[len] = '\0';
    enum { MAX_SEEN = 64 };
    size_t n_msgs = N_OF(MESSAGES), n_enums = N_OF(ENUMS);
    int found[N_OF(MESSAGES) + N_OF(ENUMS)] = {0};
    unsigned char seen[N_OF(MESSAGES) + N_OF(ENUMS)][MAX_SEEN];
    memset(seen, 0, sizeof seen);
    int cur = -1; /* the section being read: an index into MESSAGES, then ENUMS */
    char *save = NULL;
    for (char *line = strtok_r(doc, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "#", 1) == 0) {
            cur = -1;
            char name[64];
            if (sscanf(line, "#### `%63[A-Za-z0-9_]`", name) != 1)
                continue;
            for (size_t i = 0; i < n_msgs; i++)
                if (strcmp(MESSAGES[i]->short_name, name) == 0)
                    cur = (int)i;
            for (size_t i = 0; i < n_enums; i++)
                if (strcmp(ENUMS[i]->short_name, name) == 0)
                    cur = (int)(n_msgs + i);
            if (cur < 0)
                fail_msg("docs/protocol.md has a section for `%s`, which the schema lacks", name);
            if (found[cur]++)
                fail_msg("docs/protocol.md has two sections for `%s`", name);
            continue;
        }
        char *cells[4];
        int nc = split_row(line, cells, 4);
        if (cur < 0 || nc < 2 || cells[0][0] < '0' || cells[0][0] > '9')
            continue;
        int number = atoi(cells[0]);
        if ((size_t)cur < n_msgs) {
            const ProtobufCMessageDescriptor *m = MESSAGES[cur];
            const ProtobufCFieldDescriptor *f =
                protobuf_c_message_descriptor_get_field(m, (unsigned)number);
            if (!f || strcmp(f->name, cells[1]) != 0)
                fail_msg("docs: %s field %d is `%s`; the schema says %s", m->short_name, number,
                         cells[1], f ? f->name : "nothing");
            char type[64];
            field_type(f, type, sizeof type);
            if (nc < 3 || strcmp(type, cells[2]) != 0)
                fail_msg("docs: %s.%s has type `%s`; the schema says `%s`", m->short_name, f->name,
                         nc < 3 ? "" : cells[2], type);
            assert_true((size_t)(f - m->fields) < MAX_SEEN);
            seen[cur][f - m->fields] = 1;
        } else {
            const ProtobufCEnumDescriptor *en = ENUMS[(size_t)cur - n_msgs];
            const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(en, number);
            if (!v || strcmp(v->name, cells[1]) != 0)
                fail_msg("docs: %s value %d is `%s`; the schema says %s", en->short_name, number,
                         cells[1], v ? v->name : "nothing");
            assert_true((size_t)(v - en->values) < MAX_SEEN);
            seen[cur][v - en->values] = 1;
        }
    }
    for (size_t i = 0; i < n_msgs; i++) {
        if (!found[i])
            fail_msg("docs/protocol.md has no section \"#### `%s`\"", MESSAGES[i]->short_name);
        for (unsigned k = 0; k < MESSAGES[i]->n_fields; k++)
            if (!seen[i][k])
                fail_msg("docs: %s lacks field %u `%s`", MESSAGES[i]->short_name,
                         MESSAGES[i]->fields[k].id, MESSAGES[i]->fields[k].name);
    }
    for (size_t i = 0; i < n_enums; i++) {
        if (!found[n_msgs + i])
            fail_msg("docs/protocol.md has no section \"#### `%s`\"", ENUMS[i]->short_name);
        for (unsigned k = 0; k < ENUMS[i]->n_values; k++)
            if (!seen[n_msgs + i][k])
                fail_msg("docs: %s lacks value %d `%s`", ENUMS[i]->short_name,
                         ENUMS[i]->values[k].value, ENUMS[i]->values[k].name);
    }
    free(doc);

    /* and the lists above name every message and enum of proto/tessera.proto */
    char proto_path[512];
    snprintf(proto_path, sizeof proto_path, "%s", TS_PROTOCOL_MD);
    char *slash = strrchr(proto_path, '/');
    assert_non_null(slash);
    *slash = '\0';
    slash = strrchr(proto_path, '/');
    assert_non_null(slash);
    strcpy(slash, "/proto/tessera.proto");
    char *proto = (char *)tu_read_file(proto_path, &len);
    proto[len] = '\0';
    size_t declared = 0;
    save = NULL;
    for (char *line = strtok_r(proto, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char name[64];
        int is_msg = sscanf(line, "message %63[A-Za-z0-9_]", name) == 1;
        if (!is_msg && sscanf(line, "enum %63[A-Za-z0-9_]", name) != 1)
            continue;
        int listed = 0;
        for (size_t i = 0; is_msg && i < n_msgs; i++)
            listed |= strcmp(MESSAGES[i]->short_name, name) == 0;
        for (size_t i = 0; !is_msg && i < n_enums; i++)
            listed |= strcmp(ENUMS[i]->short_name, name) == 0;
        if (!listed)
            fail_msg("proto/tessera.proto declares %s, which test_frame.c does not list", name);
        declared++;
    }
    assert_int_equal(declared, n_msgs + n_enums);
    free(proto);
}

/* ---- fuzzing ------------------------------------------------------------------------------ */

/* One random mutation of buf[0, *len) in place (cap bytes available). */
static void mutate(tu_rng_t *r, uint8_t *buf, size_t *len, size_t cap) {
    size_t n = *len;
    size_t at = n ? (size_t)(tu_rng_next(r) % n) : 0;
    switch (tu_rng_next(r) % 8) {
    case 0: /* flip bits */
        for (int k = 1 + (int)(tu_rng_next(r) % 4); k > 0 && n; k--)
            buf[tu_rng_next(r) % n] ^= (uint8_t)(1u << (tu_rng_next(r) % 8));
        break;
    case 1: /* a random byte */
        if (n)
            buf[at] = (uint8_t)tu_rng_next(r);
        break;
    case 2: { /* a telling byte: varint continuation, extremes */
        static const uint8_t v[] = {0x00, 0x01, 0x7F, 0x80, 0xFF, 0x0A, 0x12};
        if (n)
            buf[at] = v[tu_rng_next(r) % sizeof v];
        break;
    }
    case 3: /* truncate */ *len = at; break;
    case 4: { /* insert random bytes */
        size_t k = 1 + (size_t)(tu_rng_next(r) % 8);
        if (n + k > cap)
            break;
        memmove(buf + at + k, buf + at, n - at);
        for (size_t i = 0; i < k; i++)
            buf[at + i] = (uint8_t)tu_rng_next(r);
        *len = n + k;
        break;
    }
    case 5: { /* delete a range */
        size_t k = 1 + (size_t)(tu_rng_next(r) % 16);
        if (at + k > n)
            k = n - at;
        memmove(buf + at, buf + at + k, n - at - k);
        *len = n - k;
        break;
    }
    case 6: { /* repeat a range (fields twice, oneofs twice) */
        size_t k = 1 + (size_t)(tu_rng_next(r) % 64);
        if (at + k > n)
            k = n - at;
        if (n + k > cap)
            break;
        memmove(buf + at + k, buf + at, n - at);
        *len = n + k;
        break;
    }
    default: /* a big varint where a length or count sits */
        if (n && at + 5 <= n) {
            const uint8_t big[5] = {0xFF, 0xFF, 0xFF, 0xFF, 0x0F};
            memcpy(buf + at, big, 5);
        }
        break;
    }
}

static int allowed_decode_rc(int rc) {
    return rc == TS_OK || rc == TS_ECORRUPT || rc == TS_ERANGE || rc == TS_ENOTSUP ||
           rc == TS_ESHAPE || rc == TS_EDTYPE || rc == TS_ENONFINITE;
}

/* Mutated frames of every kind: decoding answers with one of the codes it documents, and
 * whatever it accepts re-encodes and decodes again. */
static void test_fuzz_envelopes(void **state) {
    (void)state;
    tu_rng_t r = {20240611};
    size_t accepted = 0, rejected = 0;
    const int rounds = 1500;
    for (size_t b = 0; b < N_OF(BODIES); b++) {
        size_t n;
        uint8_t *frame = sample_frame(BODIES[b].c, &n);
        size_t cap = 2 * n + 64;
        uint8_t *buf = malloc(cap);
        assert_non_null(buf);
        for (int round = 0; round < rounds; round++) {
            size_t len = n - 4;
            memcpy(buf, frame + 4, len);
            for (int k = 1 + (int)(tu_rng_next(&r) % 3); k > 0; k--)
                mutate(&r, buf, &len, cap);
            Tessera__Envelope *e;
            char err[256] = "";
            int rc = ts_frame_decode_envelope(buf, len, TS_FRAME_CHECK_FINITE, &e, err, sizeof err);
            if (!allowed_decode_rc(rc))
                fail_msg("%s round %d: code %d (%s)", BODIES[b].name, round, rc, err);
            if (rc != TS_OK) {
                assert_null(e);
                rejected++;
                continue;
            }
            accepted++;
            uint8_t *again;
            size_t n2;
            TU_CHECK_RC_MSG(ts_frame_encode_envelope(e, TS_FRAME_CHECK_FINITE, TS_FRAME_MAX_DEFAULT,
                                                     &again, &n2, err, sizeof err),
                            TS_OK, err);
            Tessera__Envelope *e2;
            TU_CHECK_RC_MSG(ts_frame_decode_envelope(again + 4, n2 - 4, TS_FRAME_CHECK_FINITE, &e2,
                                                     err, sizeof err),
                            TS_OK, err);
            assert_int_equal(e2->body_case, e->body_case);
            ts_frame_free(e2);
            free(again);
            /* a signed body that decodes must obey its rules too */
            if (e->body_case == TESSERA__ENVELOPE__BODY_ADVERT) {
                Tessera__AdvertBody *ab;
                rc = ts_frame_decode_advert_body(&e->advert->body, TS_FRAME_CHECK_FINITE, &ab, err,
                                                 sizeof err);
                assert_true(allowed_decode_rc(rc));
                ts_frame_free(ab);
            }
            ts_frame_free(e);
        }
        free(buf);
        free(frame);
    }
    print_message("  %zu mutated envelopes accepted, %zu refused\n", accepted, rejected);
    /* mutations that hit only values keep some frames valid; most break something */
    assert_true(accepted > 0);
    assert_true(rejected > accepted / 4);
}

/* Random streams through both readers: every message respects the limit, memory stays
 * bounded, and a failure is one of the two protocol errors and sticks. */
static void test_fuzz_readers(void **state) {
    (void)state;
    tu_rng_t r = {99};
    size_t offs[N_OF(BODIES) + 1];
    uint8_t *stream = sample_stream(offs);
    size_t total = offs[N_OF(BODIES)];
    uint8_t *buf = malloc(total + 256);
    assert_non_null(buf);
    size_t msgs = 0, failures = 0;
    for (int round = 0; round < 400; round++) {
        size_t len = total;
        memcpy(buf, stream, total);
        for (int k = 1 + (int)(tu_rng_next(&r) % 4); k > 0; k--)
            mutate(&r, buf, &len, total + 256);
        uint32_t max = 64 + (uint32_t)(tu_rng_next(&r) % 4096);
        ts_frame_reader_t rd;
        if (round % 2)
            ts_frame_reader_init_noise(&rd);
        else
            TU_CHECK_OK(ts_frame_reader_init_app(&rd, max));
        size_t pos = 0;
        int failed = 0;
        while (pos < len) {
            size_t piece = 1 + (size_t)(tu_rng_next(&r) % 97);
            if (piece > len - pos)
                piece = len - pos;
            size_t used;
            const uint8_t *msg;
            size_t n;
            int rc = ts_frame_reader_feed(&rd, buf + pos, piece, &used, &msg, &n, NULL, 0);
            if (rc) {
                assert_true(rc == TS_ECORRUPT || rc == TS_ERANGE);
                assert_int_equal(ts_frame_reader_held(&rd), 0);
                assert_int_equal(ts_frame_reader_feed(&rd, buf, 1, &used, &msg, &n, NULL, 0), rc);
                failed = 1;
                break;
            }
            assert_true(ts_frame_reader_held(&rd) <= rd.max);
            if (msg) {
                assert_true(n >= 1 && n <= rd.max);
                msgs++;
                Tessera__Envelope *e;
                rc = ts_frame_decode_envelope(msg, n, TS_FRAME_CHECK_FINITE, &e, NULL, 0);
                assert_true(allowed_decode_rc(rc));
                ts_frame_free(e);
            }
            pos += used;
        }
        failures += (size_t)failed;
        ts_frame_reader_free(&rd);
    }
    print_message("  %zu messages read from mutated streams, %zu streams failed\n", msgs, failures);
    assert_true(msgs > 0 && failures > 0);
    free(buf);
    free(stream);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefixes),
        cmocka_unit_test(test_reader_every_piece_size),
        cmocka_unit_test(test_reader_in_place),
        cmocka_unit_test(test_reader_body_space),
        cmocka_unit_test(test_reader_truncated_waits),
        cmocka_unit_test(test_reader_oversize_refused_before_allocating),
        cmocka_unit_test(test_reader_zero_length),
        cmocka_unit_test(test_reader_memory_follows_arrivals),
        cmocka_unit_test(test_reader_out_of_memory_retry),
        cmocka_unit_test(test_frame_across_noise_messages),
        cmocka_unit_test(test_round_trip_every_body),
        cmocka_unit_test(test_round_trip_values),
        cmocka_unit_test(test_golden_bytes),
        cmocka_unit_test(test_unknown_and_missing_body),
        cmocka_unit_test(test_field_numbers),
        cmocka_unit_test(test_header_rules),
        cmocka_unit_test(test_garbage_and_truncations),
        cmocka_unit_test(test_tensor_rules),
        cmocka_unit_test(test_tensor_nonfinite_each_dtype),
        cmocka_unit_test(test_tensor_set_and_view),
        cmocka_unit_test(test_message_rules),
        cmocka_unit_test(test_encode_limits),
        cmocka_unit_test(test_signed_bodies),
        cmocka_unit_test(test_decode_budget_hostile),
        cmocka_unit_test(test_decode_budget_legitimate),
        cmocka_unit_test(test_docs_match_schema),
        cmocka_unit_test(test_fuzz_envelopes),
        cmocka_unit_test(test_fuzz_readers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
