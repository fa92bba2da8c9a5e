/*
 * accuse_tool.c — forged accusations for tests/test_verify.sh: asks node ASK one honest denoising
 * request of expert EXPERT (images C×S×S), then sends node JUDGE an accusation of ASK built from
 * that answer, in one of these forms:
 *
 *   honest    the answer as received (signed, and right: the judge must refuse it)
 *   tampered  one element of the answer changed by 1e-3, the signature kept (no longer ASK's
 *             signature over it: refused)
 *   wrongsig  the answer as received, one bit of the signature flipped (refused)
 *   accused   the honest form sent to ASK itself (it does not judge itself)
 *
 * Prints the verdict as one JSON object {"upheld": bool, "judged": bool, "reason": "..."}; exit 0
 * when a verdict came back, 1 otherwise.
 *
 * usage: accuse_tool ASK JUDGE NETWORK_KEY EXPERT_HEX C S MODE
 */
#define _POSIX_C_SOURCE 200809L

#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/frame.h"
#include "net/netclient.h"

static int fail(const char *what, const char *err) {
    fprintf(stderr, "accuse_tool: %s%s%s\n", what, err && *err ? ": " : "", err ? err : "");
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 8)
        return fail("usage: accuse_tool ASK JUDGE NETWORK_KEY EXPERT_HEX C S MODE", NULL);
    const char *ask = argv[1], *judge = argv[2], *nk = argv[3], *mode = argv[7];
    int C = atoi(argv[5]), S = atoi(argv[6]);
    uint8_t expert[32];
    if (sodium_init() < 0 || C < 1 || S < 1 ||
        sodium_hex2bin(expert, sizeof expert, argv[4], strlen(argv[4]), NULL, NULL, NULL) != 0)
        return fail("bad arguments", NULL);
    ts_netclient_t c;
    if (ts_netclient_open(&c, "accuse_tool", ask, NULL, nk, 10000) != 0)
        return 1;
    size_t n = (size_t)C * (size_t)S * (size_t)S;
    float *x = calloc(n, sizeof *x);
    if (!x)
        return fail("out of memory", NULL);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((int)(i % 17) - 8) / 8.0f;
    ts_tensor_t xt;
    Tessera__Tensor xw = TESSERA__TENSOR__INIT;
    if (ts_tensor_wrap(&xt, x, TS_F32, TS_CPU, 4, TS_SHAPE(1, C, S, S)) != TS_OK ||
        ts_frame_tensor_set(&xw, &xt) != TS_OK)
        return fail("cannot build the request", NULL);
    float t = 0.5f;
    int32_t label = 0;
    Tessera__DenoiseRequest dr = TESSERA__DENOISE_REQUEST__INIT;
    dr.has_expert_id = dr.has_cfg_scale = 1;
    dr.expert_id.data = expert;
    dr.expert_id.len = sizeof expert;
    dr.x_t = &xw;
    dr.n_t = 1;
    dr.t = &t;
    dr.n_class_labels = 1;
    dr.class_labels = &label;
    dr.cfg_scale = 1.0f;
    Tessera__Envelope req = TESSERA__ENVELOPE__INIT, *answer = NULL, *verdict = NULL;
    req.body_case = TESSERA__ENVELOPE__BODY_DENOISE_REQUEST;
    req.denoise_request = &dr;
    char err[512] = "";
    if (ts_netclient_call(&c, c.peer, &req, 30000, &answer, err, sizeof err) != TS_OK)
        return fail("the denoising request failed", err);
    ts_rpc_peer_info_t info;
    ts_rpc_peer_info(c.peer, &info);
    Tessera__DenoiseResponse *resp = answer->denoise_response;
    if (!info.has_node_id || !resp->has_signature || !resp->velocity)
        return fail("the answer is not signed", NULL);
    if (strcmp(mode, "tampered") == 0) {
        float v0;
        memcpy(&v0, resp->velocity->data.data, sizeof v0);
        v0 += 1e-3f;
        memcpy(resp->velocity->data.data, &v0, sizeof v0);
    } else if (strcmp(mode, "wrongsig") == 0) {
        resp->signature.data[5] ^= 0x10;
    } else if (strcmp(mode, "honest") != 0 && strcmp(mode, "accused") != 0) {
        return fail("MODE must be honest, tampered, wrongsig or accused", NULL);
    }
    Tessera__Accusation acc = TESSERA__ACCUSATION__INIT;
    acc.has_accused = acc.has_request_id = 1;
    acc.accused.data = info.node_id.b;
    acc.accused.len = sizeof info.node_id.b;
    acc.request_id = answer->request_id;
    acc.request = &dr;
    acc.answer = resp;
    Tessera__Envelope env = TESSERA__ENVELOPE__INIT;
    env.body_case = TESSERA__ENVELOPE__BODY_ACCUSATION;
    env.accusation = &acc;
    ts_rpc_peer_t *to = c.peer;
    if (strcmp(mode, "accused") != 0 &&
        ts_rpc_peer_get(c.rpc, judge, &to, err, sizeof err) != TS_OK)
        return fail("bad JUDGE address", err);
    if (ts_netclient_call(&c, to, &env, 60000, &verdict, err, sizeof err) != TS_OK)
        return fail("the accusation was not answered", err);
    const Tessera__AccusationVerdict *v = verdict->accusation_verdict;
    json_t *j = json_pack("{s:b, s:b, s:s}", "upheld", (int)v->upheld, "judged", (int)v->judged,
                          "reason", v->reason ? v->reason : "");
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    printf("%s\n", s ? s : "{}");
    free(s);
    json_decref(j);
    ts_frame_free(verdict);
    ts_frame_free(answer);
    free(x);
    ts_netclient_close(&c);
    return 0;
}
