/*
 * gossip_forge.h — hostile gossip datagrams for the tests (test_gossip, ts_gossip_inject): a seal
 * built by hand from docs/protocol.md ("Sealed datagrams") rather than by net/gossip.c, so that
 * the tests also check the document, and an alive claim signed by the wrong key.
 */
#ifndef TS_TESTS_GOSSIP_FORGE_H
#define TS_TESTS_GOSSIP_FORGE_H

#include <stddef.h>
#include <stdint.h>

#include "net/keys.h"

/* Seals plain[0..n) under network key k with the given counter into out (n + 49 bytes): version
 * 1, the counter big-endian, a random nonce, XChaCha20-Poly1305 with the first 9 bytes as
 * associated data. Returns the sealed length. */
size_t ts_forge_seal(const ts_netkey_t *k, uint64_t counter, const uint8_t *plain, size_t n,
                     uint8_t *out);

/* A gossip datagram (plaintext, at most TS_SWIM_PLAIN_MAX bytes) from `from` carrying an alive
 * claim about `from` at incarnation 7, address 127.0.0.1:9, signed by `signer` (the wrong key
 * unless signer is from). Returns its length, 0 if it could not be encoded. */
size_t ts_forge_alive(const ts_identity_t *from, const ts_identity_t *signer, uint8_t *out);

#endif
