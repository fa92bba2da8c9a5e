/*
 * fuzz_torch_pt.c — libFuzzer harness for the PyTorch checkpoint reader (model/torch_pt.h),
 * which reads a .pt file from anyone (`tessera import`): the input is the file's bytes, parsed
 * in place by ts_pt_parse.
 *
 * Checked: a failure leaves *f empty and a sentence in err. On success every tensor has a name,
 * 0..8 dimensions, its data inside the input, and the furthest element its shape and strides
 * reach inside its storage; tensors of at most 2^16 elements convert to F32 (TS_ENOTSUP only
 * for the integer kinds).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "model/torch_pt.h"

#define MAX_CONVERT ((int64_t)1 << 16)

static float out[MAX_CONVERT];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ts_pt_file_t f;
    char err[512] = "";
    int rc = ts_pt_parse(data, size, &f, err, sizeof err);
    if (rc != TS_OK) {
        if (f.n != 0 || f.t != NULL || f.map != NULL || !err[0])
            abort();
        return 0;
    }
    for (int i = 0; i < f.n; i++) {
        const ts_pt_tensor_t *t = &f.t[i];
        if (!t->name || t->ndim < 0 || t->ndim > TS_PT_MAX_DIMS || t->offset < 0 ||
            t->data < data || t->data > data + size)
            abort();
        int64_t n = ts_pt_numel(t), last = t->offset;
        for (int k = 0; k < t->ndim; k++)
            if (t->shape[k] > 0)
                last += (t->shape[k] - 1) * t->stride[k];
        if (n > 0 && last >= t->storage_numel)
            abort();
        if (ts_pt_find(&f, t->name) == NULL)
            abort();
        if (n <= MAX_CONVERT) {
            int c = ts_pt_to_f32(t, out);
            if (c != TS_OK && !(c == TS_ENOTSUP && t->dtype == TS_PT_OTHER))
                abort();
        }
    }
    ts_pt_close(&f);
    return 0;
}
