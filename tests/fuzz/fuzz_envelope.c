/*
 * fuzz_envelope.c — libFuzzer harness for Envelope unpacking and checking (net/frame.h): the
 * input is one application frame's bytes. Decoding runs under its budget allocator (so nested
 * and repeated fields cannot balloon memory); a frame that decodes must encode again, and the
 * re-encoding must decode to an envelope that checks out. The input is decoded as the body of
 * a signed advert too, as a receiver would after checking a signature.
 */
#include <stdint.h>
#include <stdlib.h>

#include "base/error.h"
#include "net/frame.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Tessera__Envelope *env = NULL;
    int rc = ts_frame_decode_envelope(data, size, TS_FRAME_CHECK_FINITE, &env, NULL, 0);
    if (rc == TS_OK) {
        uint8_t *buf = NULL;
        size_t len = 0;
        if (ts_frame_encode_envelope(env, TS_FRAME_CHECK_FINITE, TS_FRAME_MAX_LIMIT, &buf, &len,
                                     NULL, 0))
            abort(); /* what decoded and checked must encode */
        Tessera__Envelope *again = NULL;
        if (ts_frame_decode_envelope(buf + TS_FRAME_APP_HEADER, len - TS_FRAME_APP_HEADER,
                                     TS_FRAME_CHECK_FINITE, &again, NULL, 0))
            abort();
        if (again->body_case != env->body_case)
            abort();
        ts_frame_free(again);
        free(buf);
        ts_frame_free(env);
    } else if (env) {
        abort(); /* a failure leaves nothing behind */
    }
    ProtobufCBinaryData body = {size, (uint8_t *)data};
    Tessera__AdvertBody *ad = NULL;
    if (ts_frame_decode_advert_body(&body, TS_FRAME_CHECK_FINITE, &ad, NULL, 0) == TS_OK)
        ts_frame_free(ad);
    return 0;
}
