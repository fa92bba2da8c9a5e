/*
 * fuzz_gossip_node.c — libFuzzer harness for a gossip node's whole datagram path
 * (net/gossip.h ts_gossip_receive_datagram): the seal, the sender's replay window, the decoder and
 * the SWIM state machine, on one real node (a loop, a secure listener, a UDP socket on loopback)
 * built once. The first input byte picks how the rest arrives:
 *   - even: as raw bytes off the wire, which almost never open (the network key is secret);
 *   - odd: sealed with the network key, as a key holder would send them, with a counter that
 *     grows from one input to the next — so a member that holds the key and sends hostile
 *     plaintexts reaches the replay window, the decoder and the state machine.
 * After each input the loop runs once without blocking (the node's answers go out). Checked: the
 * node survives every input (ASan, UBSan and libFuzzer's leak and memory limits are the
 * oracle), its counters only grow, and its member table stays within the configured bound.
 */
#define _POSIX_C_SOURCE 200809L

#include <netinet/in.h>
#include <sodium.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "base/error.h"
#include "net/conn.h"
#include "net/gossip.h"
#include "net/keys.h"
#include "net/rpc.h"
#include "net/swim.h"
#include "net/swim_wire.h"

static uv_loop_t loop;
static ts_net_t *net;
static ts_rpc_t *rpc;
static ts_gossip_t *node;
static uint8_t seal_key[32];
static uint64_t counter = 1;
static struct sockaddr_in from;

/* What tessera's gossip layer does (docs/protocol.md "Sealed datagrams"): version 1, an 8-byte
 * big-endian counter, a 24-byte nonce, then XChaCha20-Poly1305 of the plaintext under
 * BLAKE2b-256(network key, "tessera/gossip/seal/1"), the version and counter as associated data. */
static size_t seal(const uint8_t *plain, size_t n, uint8_t *out) {
    out[0] = 1;
    for (int i = 0; i < 8; i++)
        out[1 + i] = (uint8_t)(counter >> (56 - 8 * i));
    counter++;
    randombytes_buf(out + 9, 24);
    unsigned long long clen = 0;
    crypto_aead_xchacha20poly1305_ietf_encrypt(out + 33, &clen, plain, n, out, 9, NULL, out + 9,
                                               seal_key);
    return 33 + (size_t)clen;
}

static void setup(void) {
    if (sodium_init() < 0)
        abort();
    uv_loop_init(&loop);
    ts_identity_t id;
    ts_netkey_t nk;
    ts_identity_generate(&id);
    ts_netkey_generate(&nk);
    static const char ctx[] = "tessera/gossip/seal/1";
    crypto_generichash(seal_key, sizeof seal_key, (const uint8_t *)ctx, sizeof ctx - 1, nk.k,
                       TS_NETKEY_BYTES);
    char err[256] = "";
    ts_listener_t *lis = NULL;
    if (ts_net_new(&net, &loop, &id, &nk, NULL) || ts_rpc_new(&rpc, net, NULL) ||
        ts_rpc_listen(rpc, "127.0.0.1:0", &lis, err, sizeof err))
        abort();
    static char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ts_listener_port(lis));
    ts_gossip_config_t c;
    ts_gossip_config_default(&c);
    c.listen = addr;
    if (ts_gossip_new(&loop, rpc, &id, &nk, &c, &node, err, sizeof err) ||
        ts_gossip_start(node, err, sizeof err))
        abort();
    ts_identity_wipe(&id);
    ts_netkey_wipe(&nk);
    from.sin_family = AF_INET;
    from.sin_port = htons(7);
    from.sin_addr.s_addr = htonl(0x7f000001);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int ready;
    if (!ready) {
        setup();
        ready = 1;
    }
    if (size < 1)
        return 0;
    ts_gossip_stats_t before, after;
    ts_gossip_get_stats(node, &before);
    static uint8_t out[TS_SWIM_PACKET_MAX + 64];
    const uint8_t *dg = data + 1;
    size_t len = size - 1;
    if ((data[0] & 1) && len + 33 + 16 <= TS_SWIM_PACKET_MAX) {
        len = seal(data + 1, len, out);
        dg = out;
    }
    ts_gossip_receive_datagram(node, (const struct sockaddr *)&from, dg, len);
    uv_run(&loop, UV_RUN_NOWAIT);
    ts_gossip_get_stats(node, &after);
    if (after.udp_in != before.udp_in + 1 || after.udp_unsealed_failed < before.udp_unsealed_failed)
        abort();
    const ts_swim_t *sw = ts_gossip_swim(node);
    if (!sw || ts_swim_member_count(sw) > 4096)
        abort();
    return 0;
}
