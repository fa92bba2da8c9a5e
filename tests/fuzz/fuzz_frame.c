/*
 * fuzz_frame.c — libFuzzer harness for the two framing readers of net/frame.h.
 *
 * The input's first byte picks the piece size (1..256 bytes, or everything at once); the rest is
 * fed, piece by piece, to a Noise-message reader and to an application-frame reader with a small
 * max_frame. Checked on every call: the consumed count stays within the input, a message never
 * exceeds its reader's limit and lies inside the input or the reader's buffer, the memory held
 * never exceeds the announced length nor about twice what has arrived, and a failed reader stays
 * failed.
 */
#include <stdint.h>
#include <stdlib.h>

#include "base/error.h"
#include "net/frame.h"

#define MAX_FRAME 4096u

static void run(ts_frame_reader_t *r, const uint8_t *in, size_t len, size_t piece) {
    size_t pos = 0, received = 0;
    int failed = 0;
    while (pos < len) {
        size_t n = len - pos < piece ? len - pos : piece, off = 0;
        while (off < n) {
            const uint8_t *msg;
            size_t used = 0, mlen = 0;
            int rc = ts_frame_reader_feed(r, in + pos + off, n - off, &used, &msg, &mlen, NULL, 0);
            if (used > n - off)
                abort();
            if (failed && rc == TS_OK) /* a failure must stick */
                abort();
            if (rc) {
                if (rc != TS_ECORRUPT && rc != TS_ERANGE && rc != TS_ENOMEM)
                    abort();
                failed = 1;
                off = n;
                break;
            }
            off += used;
            received += used;
            if (msg) {
                if (mlen < 1 || mlen > r->max)
                    abort();
                int in_input = msg >= in && msg + mlen <= in + len;
                int in_buf = r->buf && msg >= r->buf && msg + mlen <= r->buf + r->cap;
                if (!in_input && !in_buf)
                    abort();
            } else if (used == 0 && off < n) {
                abort(); /* no progress */
            }
            size_t held = ts_frame_reader_held(r);
            if (held > r->max || (held > 4096 && held > 2 * received + 4096))
                abort();
        }
        pos += n;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    size_t piece = data[0] == 0 ? size : data[0];
    ts_frame_reader_t r;
    ts_frame_reader_init_noise(&r);
    run(&r, data + 1, size - 1, piece);
    ts_frame_reader_free(&r);
    if (ts_frame_reader_init_app(&r, MAX_FRAME))
        abort();
    run(&r, data + 1, size - 1, piece);
    ts_frame_reader_free(&r);
    return 0;
}
