/*
 * cmd_keygen.c — `tessera keygen`: create a node identity or a network key (net/keys.h).
 *
 *   tessera keygen --out FILE                 a new node identity (Ed25519); prints the node id
 *   tessera keygen --out FILE --network-key   a new network key, the secret every node of one
 *                                             network shares (the handshake's psk)
 *
 * The file is created with mode 0600 and never overwritten: when FILE exists the command fails
 * (exit 1) naming it. --json prints one object instead of text:
 *
 *   {"file": "node.key", "kind": "identity", "node_id": "<64 hex>", "node_id_short": "<16 hex>"}
 *   {"file": "net.key", "kind": "network-key"}
 *
 * Only public values are printed: the node id is the public key; no secret byte ever reaches
 * stdout or stderr.
 */
#include <jansson.h>
#include <stdio.h>

#include "base/error.h"
#include "client/args.h"
#include "client/commands.h"
#include "client/jsonout.h"
#include "net/keys.h"

static int failed(int rc, const char *err) {
    fprintf(stderr, "tessera keygen: %s\n", err && *err ? err : ts_strerror(rc));
    return 1;
}

static int make_network_key(const char *out, int json) {
    ts_netkey_t nk;
    char err[512] = "";
    int rc = ts_netkey_generate(&nk);
    if (rc == TS_OK)
        rc = ts_netkey_save(&nk, out, err, sizeof err);
    ts_netkey_wipe(&nk);
    if (rc != TS_OK)
        return failed(rc, err);
    if (json)
        ts_json_print(json_pack("{s:s, s:s}", "file", out, "kind", "network-key"));
    else
        printf("wrote a network key to %s (mode 0600)\n"
               "Give a copy, privately, to every node of this network; each keeps it mode 0600.\n",
               out);
    return 0;
}

static int make_identity(const char *out, int json) {
    ts_identity_t id;
    char err[512] = "", full[TS_NODE_ID_HEX], brief[TS_NODE_ID_SHORT + 1];
    int rc = ts_identity_generate(&id);
    if (rc != TS_OK)
        return failed(rc, err);
    rc = ts_identity_save(&id, out, err, sizeof err);
    ts_node_id_hex(&id.id, 2 * TS_NODE_ID_BYTES, full);
    ts_node_id_hex(&id.id, TS_NODE_ID_SHORT, brief);
    ts_identity_wipe(&id);
    if (rc != TS_OK)
        return failed(rc, err);
    if (json)
        ts_json_print(json_pack("{s:s, s:s, s:s, s:s}", "file", out, "kind", "identity", "node_id",
                                full, "node_id_short", brief));
    else
        printf("wrote a node identity to %s (mode 0600)\n"
               "node id: %s\n"
               "public key: %s\n",
               out, brief, full);
    return 0;
}

int ts_cmd_keygen(int argc, char **argv) {
    const char *out = NULL;
    int network = 0, json = 0;
    ts_arg_t args[] = {
        {"out", TS_ARG_STRING, &out, "FILE",
         "the key file to create (mode 0600, never overwritten)", 0, 0, 1},
        {"network-key", TS_ARG_FLAG, &network, NULL,
         "create a network key (shared by the nodes of one network) instead of a node identity"},
        {"json", TS_ARG_FLAG, &json, NULL, "print a JSON object on stdout (file, kind, node_id)"},
    };
    int pr =
        ts_args_parse("tessera keygen",
                      "Create a node identity (an Ed25519 key; the node id is its public key)\n"
                      "or, with --network-key, a network key.\nexample: tessera keygen --out "
                      "node.key\nexample: tessera keygen --network-key --out network.key",
                      args, (int)(sizeof args / sizeof args[0]), argc, argv);
    if (pr != TS_ARGS_RUN)
        return pr;
    return network ? make_network_key(out, json) : make_identity(out, json);
}
