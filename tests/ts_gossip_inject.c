/*
 * ts_gossip_inject.c — hostile gossip datagrams at a real node, for tests/test_network.sh.
 *
 *   ts_gossip_inject --to IP:PORT --network-key FILE [--forge-alive] [--garbage N]
 *
 * --forge-alive sends, sealed with the right network key, a gossip datagram carrying an alive
 * claim about a fresh node id signed by another key, and prints "forged node <hex id>" (that id
 * must never appear in anyone's view). --garbage N sends N hostile datagrams, cycling through:
 * random bytes of random lengths, a sealed datagram cut short, one sealed under another key, one
 * of another seal version, and replays of one valid sealed datagram. Exit 0 when every datagram
 * was sent.
 */
#define _POSIX_C_SOURCE 200809L

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "net/keys.h"
#include "net/swim.h"
#include "net/swim_wire.h"
#include "tests/gossip_forge.h"

static int send_to(int fd, const struct sockaddr_in *sa, const uint8_t *buf, size_t len) {
    return sendto(fd, buf, len, 0, (const struct sockaddr *)sa, sizeof *sa) == (ssize_t)len ? 0
                                                                                             : -1;
}

int main(int argc, char **argv) {
    const char *to = NULL, *nk_path = NULL;
    int forge = 0, garbage = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--to") == 0 && i + 1 < argc)
            to = argv[++i];
        else if (strcmp(argv[i], "--network-key") == 0 && i + 1 < argc)
            nk_path = argv[++i];
        else if (strcmp(argv[i], "--forge-alive") == 0)
            forge = 1;
        else if (strcmp(argv[i], "--garbage") == 0 && i + 1 < argc)
            garbage = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: ts_gossip_inject --to IP:PORT --network-key FILE "
                            "[--forge-alive] [--garbage N]\n");
            return 2;
        }
    }
    char ip[64];
    int port = 0;
    const char *colon = to ? strrchr(to, ':') : NULL;
    if (!to || !nk_path || !colon || (size_t)(colon - to) >= sizeof ip) {
        fprintf(stderr, "ts_gossip_inject: --to IP:PORT and --network-key FILE are required\n");
        return 2;
    }
    memcpy(ip, to, (size_t)(colon - to));
    ip[colon - to] = 0;
    port = atoi(colon + 1);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    char err[512];
    ts_netkey_t nk, other;
    if (sodium_init() < 0 || inet_pton(AF_INET, ip, &sa.sin_addr) != 1 ||
        ts_netkey_load(&nk, nk_path, err, sizeof err) != 0 || ts_netkey_generate(&other) != 0) {
        fprintf(stderr, "ts_gossip_inject: bad address or key\n");
        return 1;
    }
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0)
        return 1;
    ts_identity_t subject, wrong;
    ts_identity_generate(&subject);
    ts_identity_generate(&wrong);
    uint8_t plain[TS_SWIM_PLAIN_MAX], dg[TS_SWIM_PACKET_MAX];
    size_t n = ts_forge_alive(&subject, &wrong, plain);
    /* counters far above anything a real node has used: the realtime clock in µs, plus */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t counter = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u + 1000000u;
    int rc = n ? 0 : 1;
    if (forge && rc == 0) {
        rc = send_to(fd, &sa, dg, ts_forge_seal(&nk, counter++, plain, n, dg));
        char hex[TS_NODE_ID_HEX];
        ts_node_id_hex(&subject.id, 2 * TS_NODE_ID_BYTES, hex);
        printf("forged node %s\n", hex);
    }
    /* one valid (empty) gossip datagram from the subject, to replay */
    uint8_t valid[TS_SWIM_PACKET_MAX];
    ts_swim_msg_t m;
    memset(&m, 0, sizeof m);
    m.type = TS_SWIM_GOSSIP;
    memcpy(m.from, subject.id.b, 32);
    size_t pn = 0;
    if (ts_swim_wire_encode(&m, plain, sizeof plain, &pn) != 0)
        rc = 1;
    size_t vlen = ts_forge_seal(&nk, counter++, plain, pn, valid);
    for (int i = 0; i < garbage && rc == 0; i++) {
        size_t len;
        switch (i % 5) {
        case 0: /* random bytes */
            len = 1 + randombytes_uniform(TS_SWIM_PACKET_MAX);
            randombytes_buf(dg, len);
            break;
        case 1: /* cut short */
            len = ts_forge_seal(&nk, counter++, plain, pn, dg);
            len = randombytes_uniform((uint32_t)len);
            break;
        case 2: /* another network's key */
            len = ts_forge_seal(&other, counter++, plain, pn, dg);
            break;
        case 3: /* another seal version */
            len = ts_forge_seal(&nk, counter++, plain, pn, dg);
            dg[0] = 2;
            break;
        default: /* a replay */
            memcpy(dg, valid, vlen);
            len = vlen;
            break;
        }
        rc = send_to(fd, &sa, dg, len);
    }
    close(fd);
    ts_identity_wipe(&subject);
    ts_identity_wipe(&wrong);
    ts_netkey_wipe(&nk);
    ts_netkey_wipe(&other);
    if (rc)
        fprintf(stderr, "ts_gossip_inject: sending failed\n");
    return rc;
}
