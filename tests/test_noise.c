/*
 * test_noise.c — the Noise handshake and transport ciphers (net/noise.h).
 *
 *   - the public test vectors (cacophony's, in tests/vectors/noise/cacophony-xx.json, path
 *     given by CMake as TS_NOISE_VECTORS): for every vector (NN, XX, XXpsk3), each handshake
 *     message written by its sender equals the vector's ciphertext byte for byte and the other
 *     side reads the vector's payload back; the handshake hash on both sides; the remote static
 *     keys learned; and every transport message after Split, both ways. A missing file fails the
 *     test (the repository carries it): it never skips;
 *   - properties the vectors cannot show, checked against libsodium called directly: the nonce
 *     encoding at a counter that uses all 8 bytes, and Rekey's definition;
 *   - tampering: every byte of every XXpsk3 handshake message, flipped in turn, makes the reader
 *     fail, and the failed state is wiped and refuses further use; the same for a transport
 *     message, which also kills the transport in both directions;
 *   - a wrong psk fails at the responder's last read, a different prologue at its first;
 *   - a replayed or reordered transport message fails;
 *   - nonce exhaustion: the last nonce works, then TS_ERANGE, and nothing is written;
 *   - limits (65535-byte messages), in-place encryption, misuse (out of turn, options that do not
 *     fit the pattern, a transport never split), a small-order ephemeral key, and Split wiping
 *     the handshake.
 */
#define _POSIX_C_SOURCE 200809L

#include "tests/testutil.h"

#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "net/noise.h"

#ifndef TS_NOISE_VECTORS
#error "TS_NOISE_VECTORS (the path of cacophony-xx.json) must be defined by the build"
#endif

#define MAXMSG TS_NOISE_MAX_MESSAGE

/* Buffers for one message and one payload, large enough for anything a test makes. */
static uint8_t g_msg[MAXMSG + 64], g_out[MAXMSG + 64], g_want[MAXMSG + 64], g_pay[MAXMSG + 64];

/* Fails unless got[0..got_len) equals want[0..want_len), naming what was compared, the lengths
 * and the first byte that differs. */
static void check_bytes(const uint8_t *got, size_t got_len, const uint8_t *want, size_t want_len,
                        const char *fmt, ...) TU_PRINTF(5, 6);
static void check_bytes(const uint8_t *got, size_t got_len, const uint8_t *want, size_t want_len,
                        const char *fmt, ...) {
    size_t i = 0;
    while (i < got_len && i < want_len && got[i] == want[i])
        i++;
    if (i == got_len && i == want_len)
        return;
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    print_error("%s: got %zu bytes, want %zu; first difference at byte %zu\n", what, got_len,
                want_len, i);
    fail();
}

/* A copy of the handshake state with `failed` cleared is all zeros: everything was wiped. */
static int handshake_is_wiped(const ts_noise_handshake_t *hs) {
    ts_noise_handshake_t copy = *hs;
    copy.failed = 0;
    return hs->failed && sodium_is_zero((const unsigned char *)&copy, sizeof copy);
}

/* ---- the public vectors --------------------------------------------------------------------- */

/* The hex string field `key` of v decoded into out (at most cap bytes); fails the test when it is
 * missing or not hex. Returns the length. */
static size_t hex_field(json_t *v, const char *key, uint8_t *out, size_t cap, int vector) {
    const char *hex = json_string_value(json_object_get(v, key));
    size_t len = 0;
    if (!hex || sodium_hex2bin(out, cap, hex, strlen(hex), NULL, &len, NULL) != 0) {
        print_error("vector %d: field \"%s\" is missing or not hex\n", vector, key);
        fail();
    }
    return len;
}

/* The single psk of array field `key`, or NULL when the vector has none. */
static const uint8_t *psk_field(json_t *v, const char *key, uint8_t out[TS_NOISE_PSKLEN],
                                int vector) {
    json_t *arr = json_object_get(v, key);
    if (!arr)
        return NULL;
    if (!json_is_array(arr) || json_array_size(arr) != 1) {
        print_error("vector %d: \"%s\" must hold exactly one psk\n", vector, key);
        fail();
    }
    const char *hex = json_string_value(json_array_get(arr, 0));
    size_t len = 0;
    if (!hex || sodium_hex2bin(out, TS_NOISE_PSKLEN, hex, strlen(hex), NULL, &len, NULL) != 0 ||
        len != TS_NOISE_PSKLEN) {
        print_error("vector %d: \"%s\" is not a 32-byte hex psk\n", vector, key);
        fail();
    }
    return out;
}

/* One side's options and keys, read from the vector's init_* or resp_* fields. */
typedef struct {
    uint8_t prologue[256], s_priv[TS_NOISE_DHLEN], e_priv[TS_NOISE_DHLEN], psk[TS_NOISE_PSKLEN];
    int has_s;
    ts_noise_handshake_opts_t o;
} side_t;

static void side_from_vector(side_t *sd, json_t *v, const char *who, ts_noise_pattern_t pattern,
                             int vector) {
    char key[32];
    memset(sd, 0, sizeof *sd);
    sd->o.pattern = pattern;
    sd->o.initiator = strcmp(who, "init") == 0;
    snprintf(key, sizeof key, "%s_prologue", who);
    sd->o.prologue_len = hex_field(v, key, sd->prologue, sizeof sd->prologue, vector);
    sd->o.prologue = sd->prologue;
    snprintf(key, sizeof key, "%s_ephemeral", who);
    assert_int_equal(hex_field(v, key, sd->e_priv, sizeof sd->e_priv, vector), TS_NOISE_DHLEN);
    snprintf(key, sizeof key, "%s_static", who);
    if (json_object_get(v, key)) {
        assert_int_equal(hex_field(v, key, sd->s_priv, sizeof sd->s_priv, vector), TS_NOISE_DHLEN);
        sd->has_s = 1;
        sd->o.s_priv = sd->s_priv;
    }
    snprintf(key, sizeof key, "%s_psks", who);
    sd->o.psk = psk_field(v, key, sd->psk, vector);
}

static void run_vector(json_t *v, int vector, int *seen) {
    const char *name = json_string_value(json_object_get(v, "protocol_name"));
    int pattern = -1;
    for (int p = 0; name && p < TS_NOISE_PATTERN_COUNT; p++)
        if (strcmp(name, ts_noise_protocol_name((ts_noise_pattern_t)p)) == 0)
            pattern = p;
    if (pattern < 0) {
        print_error("vector %d: protocol \"%s\" is not one this implementation speaks\n", vector,
                    name ? name : "(missing)");
        fail();
    }
    seen[pattern]++;

    side_t sd[2]; /* 0: initiator, 1: responder */
    side_from_vector(&sd[0], v, "init", (ts_noise_pattern_t)pattern, vector);
    side_from_vector(&sd[1], v, "resp", (ts_noise_pattern_t)pattern, vector);
    ts_noise_handshake_t hs[2];
    ts_noise_transport_t tr[2];
    for (int i = 0; i < 2; i++) {
        TU_CHECK_OK(ts_noise_handshake_init(&hs[i], &sd[i].o));
        TU_CHECK_OK(ts_noise_handshake_set_ephemeral_for_test(&hs[i], sd[i].e_priv));
    }

    json_t *msgs = json_object_get(v, "messages");
    assert_true(json_is_array(msgs));
    size_t n_msgs = json_array_size(msgs);
    int split = 0, transport_msgs = 0;
    for (size_t m = 0; m < n_msgs; m++) {
        json_t *jm = json_array_get(msgs, m);
        size_t pay_len = hex_field(jm, "payload", g_pay, sizeof g_pay, vector);
        size_t want_len = hex_field(jm, "ciphertext", g_want, sizeof g_want, vector);
        int w = (int)(m % 2), r = 1 - w; /* the initiator writes the even messages */
        size_t len = 0, got = 0;
        if (!split) {
            assert_int_equal(ts_noise_handshake_action(&hs[w]), TS_NOISE_WRITE);
            assert_int_equal(ts_noise_handshake_action(&hs[r]), TS_NOISE_READ);
            TU_CHECK_OK(ts_noise_handshake_write_message(&hs[w], g_pay, pay_len, g_msg,
                                                         sizeof g_msg, &len));
            check_bytes(g_msg, len, g_want, want_len, "%s message %zu (handshake)", name, m);
            TU_CHECK_OK(ts_noise_handshake_read_message(&hs[r], g_want, want_len, g_out,
                                                        sizeof g_out, &got));
            check_bytes(g_out, got, g_pay, pay_len, "%s message %zu read back", name, m);
            if (ts_noise_handshake_action(&hs[0]) == TS_NOISE_SPLIT) {
                assert_int_equal(ts_noise_handshake_action(&hs[1]), TS_NOISE_SPLIT);
                TU_CHECK_OK(ts_noise_handshake_split(&hs[0], &tr[0]));
                TU_CHECK_OK(ts_noise_handshake_split(&hs[1], &tr[1]));
                split = 1;
            }
        } else {
            TU_CHECK_OK(
                ts_noise_transport_encrypt(&tr[w], g_pay, pay_len, g_msg, sizeof g_msg, &len));
            check_bytes(g_msg, len, g_want, want_len, "%s message %zu (transport)", name, m);
            TU_CHECK_OK(
                ts_noise_transport_decrypt(&tr[r], g_want, want_len, g_out, sizeof g_out, &got));
            check_bytes(g_out, got, g_pay, pay_len, "%s message %zu decrypted", name, m);
            transport_msgs++;
        }
    }
    if (!split || transport_msgs == 0) {
        print_error("vector %d (%s): the handshake %s\n", vector, name,
                    split ? "left no transport message to check" : "never finished");
        fail();
    }

    uint8_t hash[TS_NOISE_HASHLEN];
    assert_int_equal(hex_field(v, "handshake_hash", hash, sizeof hash, vector), TS_NOISE_HASHLEN);
    check_bytes(tr[0].handshake_hash, TS_NOISE_HASHLEN, hash, TS_NOISE_HASHLEN,
                "%s initiator's handshake hash", name);
    check_bytes(tr[1].handshake_hash, TS_NOISE_HASHLEN, hash, TS_NOISE_HASHLEN,
                "%s responder's handshake hash", name);
    /* Each side learned the other's static public key, computed here from the private one. */
    for (int i = 0; i < 2; i++) {
        assert_int_equal(tr[i].has_remote_static, sd[1 - i].has_s);
        if (sd[1 - i].has_s) {
            uint8_t pub[TS_NOISE_DHLEN];
            crypto_scalarmult_base(pub, sd[1 - i].s_priv);
            check_bytes(tr[i].remote_static, sizeof pub, pub, sizeof pub, "%s remote static", name);
        }
        ts_noise_transport_wipe(&tr[i]);
    }
}

static void test_vectors(void **state) {
    (void)state;
    json_error_t jerr;
    json_t *root = json_load_file(TS_NOISE_VECTORS, 0, &jerr);
    if (!root) {
        if (access(TS_NOISE_VECTORS, R_OK) != 0)
            print_error("the Noise test vectors are missing: no readable file %s.\n"
                        "They belong at tests/vectors/noise/cacophony-xx.json in the repository; "
                        "without them this test fails, it does not skip.\n",
                        TS_NOISE_VECTORS);
        else
            print_error("cannot parse the Noise test vectors %s: %s (line %d)\n", TS_NOISE_VECTORS,
                        jerr.text, jerr.line);
        fail();
    }
    json_t *vectors = json_object_get(root, "vectors");
    assert_true(json_is_array(vectors));
    int seen[TS_NOISE_PATTERN_COUNT] = {0};
    for (size_t i = 0; i < json_array_size(vectors); i++)
        run_vector(json_array_get(vectors, i), (int)i, seen);
    json_decref(root);
    /* The file must exercise every pattern implemented, above all the production one. */
    for (int p = 0; p < TS_NOISE_PATTERN_COUNT; p++)
        if (seen[p] == 0) {
            print_error("no vector for %s in %s\n", ts_noise_protocol_name((ts_noise_pattern_t)p),
                        TS_NOISE_VECTORS);
            fail();
        }
}

/* ---- two sides in memory, with random keys -------------------------------------------------- */

typedef struct {
    ts_noise_keypair_t s[2]; /* 0: initiator, 1: responder */
    uint8_t psk[2][TS_NOISE_PSKLEN];
    ts_noise_handshake_t hs[2];
    ts_noise_transport_t tr[2];
    uint8_t msg[3][256];
    size_t msg_len[3];
} pair_t;

static const char payload_text[] = "payload!"; /* 8 bytes in every handshake message */

/* Starts both sides' XXpsk3 handshakes from the keys in p. */
static void pair_start(pair_t *p) {
    for (int i = 0; i < 2; i++) {
        ts_noise_handshake_opts_t o = {.pattern = TS_NOISE_XXPSK3,
                                       .initiator = i == 0,
                                       .prologue = (const uint8_t *)"tessera/1",
                                       .prologue_len = 9,
                                       .s_priv = p->s[i].priv,
                                       .psk = p->psk[i]};
        TU_CHECK_OK(ts_noise_handshake_init(&p->hs[i], &o));
    }
}

/* Two XXpsk3 sides with fresh static keys; the responder's psk differs when wrong_psk is set. */
static void pair_init(pair_t *p, int wrong_psk) {
    memset(p, 0, sizeof *p);
    randombytes_buf(p->psk[0], TS_NOISE_PSKLEN);
    memcpy(p->psk[1], p->psk[0], TS_NOISE_PSKLEN);
    if (wrong_psk)
        p->psk[1][7] ^= 0x01;
    TU_CHECK_OK(ts_noise_keypair_generate(&p->s[0]));
    TU_CHECK_OK(ts_noise_keypair_generate(&p->s[1]));
    pair_start(p);
}

/* Handshake message m: its writer writes it, then (after flipping bit 0 of byte flip_at, when
 * flip_at ≥ 0) its reader reads it. Returns the reader's code; the payload must survive. */
static int pair_step(pair_t *p, int m, long flip_at) {
    int w = m % 2, r = 1 - w;
    uint8_t pay[256];
    size_t got = 0;
    TU_CHECK_OK(ts_noise_handshake_write_message(&p->hs[w], (const uint8_t *)payload_text, 8,
                                                 p->msg[m], sizeof p->msg[m], &p->msg_len[m]));
    if (flip_at >= 0) {
        assert_true((size_t)flip_at < p->msg_len[m]);
        p->msg[m][flip_at] ^= 0x01;
    }
    int rc =
        ts_noise_handshake_read_message(&p->hs[r], p->msg[m], p->msg_len[m], pay, sizeof pay, &got);
    if (rc == TS_OK)
        check_bytes(pay, got, (const uint8_t *)payload_text, 8, "payload of message %d", m);
    return rc;
}

static void pair_handshake(pair_t *p) {
    for (int m = 0; m < 3; m++)
        TU_CHECK_OK(pair_step(p, m, -1));
    TU_CHECK_OK(ts_noise_handshake_split(&p->hs[0], &p->tr[0]));
    TU_CHECK_OK(ts_noise_handshake_split(&p->hs[1], &p->tr[1]));
}

/* Sends len bytes of pattern from side `from` to the other; both calls must succeed. */
static void pair_send(pair_t *p, int from, size_t len, uint8_t fill) {
    size_t n = 0, got = 0;
    memset(g_pay, fill, len);
    TU_CHECK_OK(ts_noise_transport_encrypt(&p->tr[from], g_pay, len, g_msg, sizeof g_msg, &n));
    assert_int_equal(n, len + TS_NOISE_TAGLEN);
    TU_CHECK_OK(ts_noise_transport_decrypt(&p->tr[1 - from], g_msg, n, g_out, sizeof g_out, &got));
    check_bytes(g_out, got, g_pay, len, "transport message of %zu bytes from side %d", len, from);
}

static void test_handshake_round_trip(void **state) {
    (void)state;
    static pair_t p, q;
    uint8_t rs[TS_NOISE_DHLEN];
    pair_init(&p, 0);
    /* Each side learns the other's static key from the message carrying it, not before. */
    TU_CHECK_OK(pair_step(&p, 0, -1));
    TU_CHECK_RC(ts_noise_handshake_remote_static(&p.hs[0], rs), TS_ENOTFOUND);
    TU_CHECK_OK(pair_step(&p, 1, -1));
    TU_CHECK_OK(ts_noise_handshake_remote_static(&p.hs[0], rs));
    assert_memory_equal(rs, p.s[1].pub, TS_NOISE_DHLEN);
    TU_CHECK_RC(ts_noise_handshake_remote_static(&p.hs[1], rs), TS_ENOTFOUND);
    TU_CHECK_OK(pair_step(&p, 2, -1));
    TU_CHECK_OK(ts_noise_handshake_remote_static(&p.hs[1], rs));
    assert_memory_equal(rs, p.s[0].pub, TS_NOISE_DHLEN);
    TU_CHECK_OK(ts_noise_handshake_split(&p.hs[0], &p.tr[0]));
    TU_CHECK_OK(ts_noise_handshake_split(&p.hs[1], &p.tr[1]));
    /* The message layout of XXpsk3 with an 8-byte payload: e, payload+tag (the psk modifier
     * keys the cipher from e already); e, s+tag, payload+tag; s+tag, payload+tag. */
    assert_int_equal(p.msg_len[0], 32 + 8 + 16);
    assert_int_equal(p.msg_len[1], 32 + 48 + 8 + 16);
    assert_int_equal(p.msg_len[2], 48 + 8 + 16);
    /* Split wiped both handshakes; both sides agree on the session and on who the other is. */
    assert_true(handshake_is_wiped(&p.hs[0]) && handshake_is_wiped(&p.hs[1]));
    assert_int_equal(ts_noise_handshake_action(&p.hs[0]), TS_NOISE_FAILED);
    assert_memory_equal(p.tr[0].handshake_hash, p.tr[1].handshake_hash, TS_NOISE_HASHLEN);
    assert_true(p.tr[0].has_remote_static && p.tr[1].has_remote_static);
    assert_memory_equal(p.tr[0].remote_static, p.s[1].pub, TS_NOISE_DHLEN);
    assert_memory_equal(p.tr[1].remote_static, p.s[0].pub, TS_NOISE_DHLEN);
    /* Both directions, interleaved, empty and full-size messages. */
    pair_send(&p, 0, 0, 0x00);
    pair_send(&p, 1, 1, 0x11);
    pair_send(&p, 0, 1000, 0x22);
    pair_send(&p, 0, TS_NOISE_MAX_PLAINTEXT, 0x33);
    pair_send(&p, 1, TS_NOISE_MAX_PLAINTEXT, 0x44);
    /* Another session between the same static keys uses fresh ephemeral keys: a new hash, and a
     * message of the first session does not decrypt in the second. */
    memset(&q, 0, sizeof q);
    memcpy(q.s, p.s, sizeof q.s);
    memcpy(q.psk, p.psk, sizeof q.psk);
    pair_start(&q);
    pair_handshake(&q);
    assert_memory_not_equal(p.tr[0].handshake_hash, q.tr[0].handshake_hash, TS_NOISE_HASHLEN);
    size_t n = 0, got = 0;
    TU_CHECK_OK(ts_noise_transport_encrypt(&p.tr[0], g_pay, 10, g_msg, sizeof g_msg, &n));
    TU_CHECK_RC(ts_noise_transport_decrypt(&q.tr[1], g_msg, n, g_out, sizeof g_out, &got),
                TS_ECORRUPT);
    for (int i = 0; i < 2; i++) {
        ts_noise_transport_wipe(&p.tr[i]);
        ts_noise_transport_wipe(&q.tr[i]);
    }
}

/* Every byte of every handshake message is authenticated: flipping any one makes the reader
 * fail with TS_ECORRUPT, wipes its state, and it refuses everything after. */
static void test_handshake_tamper(void **state) {
    (void)state;
    static pair_t p;
    for (int m = 0; m < 3; m++) {
        pair_init(&p, 0);
        for (int k = 0; k < m; k++)
            TU_CHECK_OK(pair_step(&p, k, -1));
        static pair_t t;
        t = p; /* message m once untouched, for its length */
        TU_CHECK_OK(pair_step(&t, m, -1));
        size_t len = t.msg_len[m];
        ts_noise_handshake_wipe(&t.hs[0]);
        ts_noise_handshake_wipe(&t.hs[1]);
        for (size_t at = 0; at < len; at++) {
            t = p; /* the same state up to message m, flipped at a different byte each time */
            int r = 1 - m % 2;
            int rc = pair_step(&t, m, (long)at);
            if (rc != TS_ECORRUPT) {
                print_error("message %d with byte %zu flipped: read returned %d (%s), want "
                            "TS_ECORRUPT\n",
                            m, at, rc, ts_strerror(rc));
                fail();
            }
            assert_int_equal(ts_noise_handshake_action(&t.hs[r]), TS_NOISE_FAILED);
            assert_true(handshake_is_wiped(&t.hs[r]));
            size_t n = 0;
            TU_CHECK_RC(ts_noise_handshake_read_message(&t.hs[r], t.msg[m], t.msg_len[m], g_out,
                                                        sizeof g_out, &n),
                        TS_EINVAL);
            TU_CHECK_RC(
                ts_noise_handshake_write_message(&t.hs[r], NULL, 0, g_msg, sizeof g_msg, &n),
                TS_EINVAL);
            ts_noise_handshake_wipe(&t.hs[0]);
            ts_noise_handshake_wipe(&t.hs[1]);
        }
    }
}

static void test_transport_tamper(void **state) {
    (void)state;
    static pair_t p;
    pair_init(&p, 0);
    pair_handshake(&p);
    size_t n = 0, got = 0;
    memset(g_pay, 0x5a, 100);
    TU_CHECK_OK(ts_noise_transport_encrypt(&p.tr[0], g_pay, 100, g_want, sizeof g_want, &n));
    memcpy(g_msg, g_want, n);
    g_msg[40] ^= 0x80;
    memset(g_out, 0xee, 100);
    TU_CHECK_RC(ts_noise_transport_decrypt(&p.tr[1], g_msg, n, g_out, sizeof g_out, &got),
                TS_ECORRUPT);
    /* No plaintext comes out of a failed decryption, and the transport is dead both ways, even
     * for the genuine message. */
    assert_true(sodium_is_zero(g_out, 100));
    TU_CHECK_RC(ts_noise_transport_decrypt(&p.tr[1], g_want, n, g_out, sizeof g_out, &got),
                TS_EINVAL);
    TU_CHECK_RC(ts_noise_transport_encrypt(&p.tr[1], g_pay, 1, g_msg, sizeof g_msg, &n), TS_EINVAL);
    assert_false(ts_noise_cipher_has_key(&p.tr[1].send) || ts_noise_cipher_has_key(&p.tr[1].recv));
    /* A flipped tag byte fails the same way. */
    pair_init(&p, 0);
    pair_handshake(&p);
    TU_CHECK_OK(ts_noise_transport_encrypt(&p.tr[1], g_pay, 100, g_msg, sizeof g_msg, &n));
    g_msg[n - 1] ^= 0x01;
    TU_CHECK_RC(ts_noise_transport_decrypt(&p.tr[0], g_msg, n, g_out, sizeof g_out, &got),
                TS_ECORRUPT);
    ts_noise_transport_wipe(&p.tr[0]);
    ts_noise_transport_wipe(&p.tr[1]);
}

/* The psk enters at the end of message 3, so a wrong one is noticed by the responder reading it;
 * the initiator, having written its last message, only learns it when the link closes. */
static void test_wrong_psk(void **state) {
    (void)state;
    static pair_t p;
    pair_init(&p, 1);
    TU_CHECK_OK(pair_step(&p, 0, -1));
    TU_CHECK_OK(pair_step(&p, 1, -1));
    TU_CHECK_RC(pair_step(&p, 2, -1), TS_ECORRUPT);
    assert_int_equal(ts_noise_handshake_action(&p.hs[1]), TS_NOISE_FAILED);
    assert_true(handshake_is_wiped(&p.hs[1]));
    assert_int_equal(ts_noise_handshake_action(&p.hs[0]), TS_NOISE_SPLIT);
    ts_noise_handshake_wipe(&p.hs[0]);
}

/* The prologue is hashed first, so two sides that disagree on it fail at the first encrypted
 * field: in XXpsk3 that is message 1's payload (the psk modifier keys the cipher from e, and the
 * handshake hash, prologue included, is its associated data), read by the responder. */
static void test_prologue_mismatch(void **state) {
    (void)state;
    static pair_t p;
    pair_init(&p, 0);
    ts_noise_handshake_opts_t o = {.pattern = TS_NOISE_XXPSK3,
                                   .prologue = (const uint8_t *)"tessera/2",
                                   .prologue_len = 9,
                                   .s_priv = p.s[1].priv,
                                   .psk = p.psk[1]};
    TU_CHECK_OK(ts_noise_handshake_init(&p.hs[1], &o));
    TU_CHECK_RC(pair_step(&p, 0, -1), TS_ECORRUPT);
    assert_int_equal(ts_noise_handshake_action(&p.hs[1]), TS_NOISE_FAILED);
    ts_noise_handshake_wipe(&p.hs[0]);
}

static void test_replay_and_reorder(void **state) {
    (void)state;
    static pair_t p;
    static uint8_t a[64], b[64];
    size_t na = 0, nb = 0, got = 0;
    pair_init(&p, 0);
    pair_handshake(&p);
    TU_CHECK_OK(
        ts_noise_transport_encrypt(&p.tr[0], (const uint8_t *)"first", 5, a, sizeof a, &na));
    TU_CHECK_OK(ts_noise_transport_decrypt(&p.tr[1], a, na, g_out, sizeof g_out, &got));
    TU_CHECK_RC(ts_noise_transport_decrypt(&p.tr[1], a, na, g_out, sizeof g_out, &got),
                TS_ECORRUPT);
    assert_false(ts_noise_cipher_has_key(&p.tr[1].recv));
    ts_noise_transport_wipe(&p.tr[0]);

    pair_init(&p, 0);
    pair_handshake(&p);
    TU_CHECK_OK(
        ts_noise_transport_encrypt(&p.tr[0], (const uint8_t *)"first", 5, a, sizeof a, &na));
    TU_CHECK_OK(
        ts_noise_transport_encrypt(&p.tr[0], (const uint8_t *)"second", 6, b, sizeof b, &nb));
    TU_CHECK_RC(ts_noise_transport_decrypt(&p.tr[1], b, nb, g_out, sizeof g_out, &got),
                TS_ECORRUPT);
    ts_noise_transport_wipe(&p.tr[0]);
}

/* The nonce is 4 zero bytes then n little-endian: checked at a counter with 8 distinct bytes
 * against libsodium called directly (the vectors only reach n = 2). */
static void test_nonce_encoding(void **state) {
    (void)state;
    uint8_t key[TS_NOISE_KEYLEN], ad[5] = {1, 2, 3, 4, 5}, want[64], got[64];
    uint8_t nonce[12] = {0, 0, 0, 0, 0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01};
    randombytes_buf(key, sizeof key);
    ts_noise_cipher_t cs;
    ts_noise_cipher_initialize_key(&cs, key);
    ts_noise_cipher_set_nonce(&cs, 0x0102030405060708ull);
    size_t n = 0;
    TU_CHECK_OK(ts_noise_cipher_encrypt_with_ad(&cs, ad, sizeof ad, (const uint8_t *)"nonce", 5,
                                                got, sizeof got, &n));
    unsigned long long wn = 0;
    crypto_aead_chacha20poly1305_ietf_encrypt(want, &wn, (const uint8_t *)"nonce", 5, ad, sizeof ad,
                                              NULL, nonce, key);
    check_bytes(got, n, want, (size_t)wn, "ciphertext at n = 0x0102030405060708");
    ts_noise_cipher_wipe(&cs);
}

static void test_nonce_exhaustion(void **state) {
    (void)state;
    static pair_t p;
    pair_init(&p, 0);
    pair_handshake(&p);
    size_t n = 0, got = 0;
    ts_noise_cipher_set_nonce(&p.tr[0].send, TS_NOISE_NONCE_MAX - 1);
    ts_noise_cipher_set_nonce(&p.tr[1].recv, TS_NOISE_NONCE_MAX - 1);
    pair_send(&p, 0, 16, 0x77); /* 2^64 − 2, the last nonce usable */
    memset(g_msg, 0xaa, 64);
    TU_CHECK_RC(ts_noise_transport_encrypt(&p.tr[0], g_pay, 16, g_msg, sizeof g_msg, &n),
                TS_ERANGE);
    for (int i = 0; i < 64; i++)
        assert_int_equal(g_msg[i], 0xaa); /* nothing written */
    TU_CHECK_RC(ts_noise_transport_encrypt(&p.tr[0], g_pay, 16, g_msg, sizeof g_msg, &n),
                TS_ERANGE); /* and it stays exhausted */
    /* The receiver is at 2^64 − 1 too: it refuses anything. */
    memset(g_msg, 0, 32);
    TU_CHECK_RC(ts_noise_transport_decrypt(&p.tr[1], g_msg, 32, g_out, sizeof g_out, &got),
                TS_ERANGE);
    ts_noise_transport_wipe(&p.tr[0]);
    ts_noise_transport_wipe(&p.tr[1]);
}

/* Rekey per §4.2: the new key is the first 32 bytes of ENCRYPT(k, 2^64 − 1, "", 32 zeros); the
 * nonce is unchanged. Checked through what the rekeyed cipher produces. */
static void test_rekey(void **state) {
    (void)state;
    uint8_t key[TS_NOISE_KEYLEN], zeros[32] = {0}, block[48], got[64], want[64];
    uint8_t max_nonce[12] = {0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    uint8_t nonce3[12] = {0, 0, 0, 0, 3};
    randombytes_buf(key, sizeof key);
    crypto_aead_chacha20poly1305_ietf_encrypt(block, NULL, zeros, 32, NULL, 0, NULL, max_nonce,
                                              key);
    crypto_aead_chacha20poly1305_ietf_encrypt(want, NULL, (const uint8_t *)"after", 5, NULL, 0,
                                              NULL, nonce3, block);
    ts_noise_cipher_t cs;
    ts_noise_cipher_initialize_key(&cs, key);
    ts_noise_cipher_set_nonce(&cs, 3);
    TU_CHECK_OK(ts_noise_cipher_rekey(&cs));
    size_t n = 0;
    TU_CHECK_OK(ts_noise_cipher_encrypt_with_ad(&cs, NULL, 0, (const uint8_t *)"after", 5, got,
                                                sizeof got, &n));
    check_bytes(got, n, want, 5 + TS_NOISE_TAGLEN, "a message after Rekey");
    ts_noise_cipher_wipe(&cs);
    ts_noise_cipher_initialize_key(&cs, NULL);
    TU_CHECK_RC(ts_noise_cipher_rekey(&cs), TS_EINVAL); /* no key to rekey */

    /* On a link: both ends rekey one direction at the same point and keep talking; a receiver
     * that did not rekey cannot read the next message. */
    static pair_t p;
    pair_init(&p, 0);
    pair_handshake(&p);
    pair_send(&p, 0, 10, 0x01);
    TU_CHECK_OK(ts_noise_cipher_rekey(&p.tr[0].send));
    TU_CHECK_OK(ts_noise_cipher_rekey(&p.tr[1].recv));
    pair_send(&p, 0, 10, 0x02);
    pair_send(&p, 1, 10, 0x03); /* the other direction is untouched */
    TU_CHECK_OK(ts_noise_cipher_rekey(&p.tr[0].send));
    size_t got_len = 0;
    TU_CHECK_OK(ts_noise_transport_encrypt(&p.tr[0], g_pay, 10, g_msg, sizeof g_msg, &n));
    TU_CHECK_RC(ts_noise_transport_decrypt(&p.tr[1], g_msg, n, g_out, sizeof g_out, &got_len),
                TS_ECORRUPT);
    ts_noise_transport_wipe(&p.tr[0]);
}

static void test_limits_and_in_place(void **state) {
    (void)state;
    static pair_t p;
    pair_init(&p, 0);
    pair_handshake(&p);
    size_t n = 0, got = 0;
    /* One byte over the plaintext limit, or an output one byte short: TS_ERANGE, and the link
     * still works (nothing was consumed). */
    TU_CHECK_RC(ts_noise_transport_encrypt(&p.tr[0], g_pay, TS_NOISE_MAX_PLAINTEXT + 1, g_msg,
                                           sizeof g_msg, &n),
                TS_ERANGE);
    TU_CHECK_RC(ts_noise_transport_encrypt(&p.tr[0], g_pay, 100, g_msg, 100 + 15, &n), TS_ERANGE);
    pair_send(&p, 0, 100, 0x10);
    /* In place, both ways. */
    memset(g_msg, 0x42, 300);
    TU_CHECK_OK(ts_noise_transport_encrypt(&p.tr[0], g_msg, 300, g_msg, sizeof g_msg, &n));
    assert_int_equal(n, 300 + TS_NOISE_TAGLEN);
    TU_CHECK_OK(ts_noise_transport_decrypt(&p.tr[1], g_msg, n, g_msg, sizeof g_msg, &got));
    assert_int_equal(got, 300);
    for (int i = 0; i < 300; i++)
        assert_int_equal(g_msg[i], 0x42);
    /* A received message over 65535 bytes is refused, and ends the link. */
    TU_CHECK_RC(ts_noise_transport_decrypt(&p.tr[1], g_msg, MAXMSG + 1, g_out, sizeof g_out, &got),
                TS_ERANGE);
    assert_false(ts_noise_cipher_has_key(&p.tr[1].recv));
    ts_noise_transport_wipe(&p.tr[0]);

    /* A handshake message that would exceed 65535 bytes: message 1 is e (32) + payload + tag. */
    pair_init(&p, 0);
    TU_CHECK_RC(ts_noise_handshake_write_message(&p.hs[0], g_pay, MAXMSG - 32 - 16 + 1, g_msg,
                                                 sizeof g_msg, &n),
                TS_ERANGE);
    assert_int_equal(ts_noise_handshake_action(&p.hs[0]), TS_NOISE_FAILED);
    pair_init(&p, 0);
    TU_CHECK_OK(ts_noise_handshake_write_message(&p.hs[0], g_pay, MAXMSG - 32 - 16, g_msg,
                                                 sizeof g_msg, &n));
    assert_int_equal(n, MAXMSG);
    TU_CHECK_OK(ts_noise_handshake_read_message(&p.hs[1], g_msg, n, g_out, sizeof g_out, &got));
    assert_int_equal(got, MAXMSG - 32 - 16);
    ts_noise_handshake_wipe(&p.hs[0]);
    ts_noise_handshake_wipe(&p.hs[1]);
}

static void test_misuse(void **state) {
    (void)state;
    ts_noise_keypair_t s;
    uint8_t psk[TS_NOISE_PSKLEN] = {0};
    TU_CHECK_OK(ts_noise_keypair_generate(&s));
    ts_noise_handshake_t hs;
    size_t n = 0;
    /* Options that do not fit the pattern. */
    ts_noise_handshake_opts_t bad[] = {
        {TS_NOISE_XX, 1, NULL, 0, NULL, NULL},            /* XX sends s: needs one */
        {TS_NOISE_NN, 1, NULL, 0, s.priv, NULL},          /* NN has no static key */
        {TS_NOISE_XXPSK3, 0, NULL, 0, s.priv, NULL},      /* XXpsk3 without a psk */
        {TS_NOISE_XX, 0, NULL, 0, s.priv, psk},           /* a psk XX would ignore */
        {TS_NOISE_PATTERN_COUNT, 1, NULL, 0, NULL, NULL}, /* no such pattern */
        {TS_NOISE_NN, 1, NULL, 5, NULL, NULL},            /* a prologue length without bytes */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        TU_CHECK_RC(ts_noise_handshake_init(&hs, &bad[i]), TS_EINVAL);
        assert_int_equal(ts_noise_handshake_action(&hs), TS_NOISE_FAILED);
    }
    assert_null(ts_noise_protocol_name(TS_NOISE_PATTERN_COUNT));

    /* Out of turn: the responder cannot write first; the failure is final. */
    ts_noise_handshake_opts_t resp = {TS_NOISE_XXPSK3, 0, NULL, 0, s.priv, psk};
    TU_CHECK_OK(ts_noise_handshake_init(&hs, &resp));
    assert_int_equal(ts_noise_handshake_action(&hs), TS_NOISE_READ);
    TU_CHECK_RC(ts_noise_handshake_write_message(&hs, NULL, 0, g_msg, sizeof g_msg, &n), TS_EINVAL);
    assert_true(handshake_is_wiped(&hs));
    /* Split before the end. */
    ts_noise_handshake_opts_t init = {TS_NOISE_XXPSK3, 1, NULL, 0, s.priv, psk};
    ts_noise_transport_t tr;
    TU_CHECK_OK(ts_noise_handshake_init(&hs, &init));
    TU_CHECK_RC(ts_noise_handshake_split(&hs, &tr), TS_EINVAL);
    assert_int_equal(ts_noise_handshake_action(&hs), TS_NOISE_FAILED);
    /* The ephemeral key of a test can only be set before it is sent. */
    TU_CHECK_OK(ts_noise_handshake_init(&hs, &init));
    TU_CHECK_OK(ts_noise_handshake_write_message(&hs, NULL, 0, g_msg, sizeof g_msg, &n));
    TU_CHECK_RC(ts_noise_handshake_set_ephemeral_for_test(&hs, s.priv), TS_EINVAL);
    ts_noise_handshake_wipe(&hs);
    /* A transport that never came from Split (all zeros) does not pass plaintext through, and
     * neither does a cipher that was wiped. */
    memset(&tr, 0, sizeof tr);
    TU_CHECK_RC(ts_noise_transport_encrypt(&tr, g_pay, 4, g_msg, sizeof g_msg, &n), TS_EINVAL);
    TU_CHECK_RC(ts_noise_transport_decrypt(&tr, g_pay, 4, g_msg, sizeof g_msg, &n), TS_EINVAL);
    ts_noise_cipher_t cs;
    ts_noise_cipher_initialize_key(&cs, NULL);
    TU_CHECK_OK(ts_noise_cipher_encrypt_with_ad(&cs, NULL, 0, g_pay, 4, g_msg, sizeof g_msg, &n));
    assert_int_equal(n, 4); /* the spec's keyless pass-through, for the handshake's first fields */
    ts_noise_cipher_wipe(&cs);
    TU_CHECK_RC(ts_noise_cipher_encrypt_with_ad(&cs, NULL, 0, g_pay, 4, g_msg, sizeof g_msg, &n),
                TS_EINVAL);
    sodium_memzero(&s, sizeof s);
}

/* An ephemeral key of small order (here the all-zero point) makes DH zero: libsodium refuses it,
 * and the handshake fails instead of going on with a key anyone could compute. */
static void test_small_order_ephemeral(void **state) {
    (void)state;
    ts_noise_keypair_t s;
    TU_CHECK_OK(ts_noise_keypair_generate(&s));
    ts_noise_handshake_opts_t resp = {TS_NOISE_XX, 0, NULL, 0, s.priv, NULL};
    ts_noise_handshake_t hs;
    TU_CHECK_OK(ts_noise_handshake_init(&hs, &resp));
    uint8_t msg1[TS_NOISE_DHLEN] = {0}; /* XX message 1: e in the clear, empty payload */
    size_t n = 0;
    TU_CHECK_OK(ts_noise_handshake_read_message(&hs, msg1, sizeof msg1, g_out, sizeof g_out, &n));
    assert_int_equal(n, 0);
    TU_CHECK_RC(ts_noise_handshake_write_message(&hs, NULL, 0, g_msg, sizeof g_msg, &n),
                TS_ECORRUPT);
    assert_true(handshake_is_wiped(&hs));
    sodium_memzero(&s, sizeof s);
}

int main(void) {
    if (sodium_init() < 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vectors),
        cmocka_unit_test(test_handshake_round_trip),
        cmocka_unit_test(test_handshake_tamper),
        cmocka_unit_test(test_transport_tamper),
        cmocka_unit_test(test_wrong_psk),
        cmocka_unit_test(test_prologue_mismatch),
        cmocka_unit_test(test_replay_and_reorder),
        cmocka_unit_test(test_nonce_encoding),
        cmocka_unit_test(test_nonce_exhaustion),
        cmocka_unit_test(test_rekey),
        cmocka_unit_test(test_limits_and_in_place),
        cmocka_unit_test(test_misuse),
        cmocka_unit_test(test_small_order_ephemeral),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
