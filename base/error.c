/* error.c — words for tessera's error codes. */
#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>

const char *ts_strerror(int err) {
    switch (err) {
    case TS_OK: return "success";
    case TS_EINVAL: return "invalid argument";
    case TS_ENOMEM: return "out of memory";
    case TS_ESHAPE: return "tensor shapes do not agree";
    case TS_EDTYPE: return "dtype not supported by this operation";
    case TS_EDEVICE: return "tensor is on a different device from the engine";
    case TS_ENODEV: return "no such device (no GPU present, or CUDA backend not built)";
    case TS_ECUDA: return "CUDA runtime call failed";
    case TS_ECUBLAS: return "cuBLAS call failed";
    case TS_ENONFINITE: return "tensor holds NaN or Inf";
    case TS_EIO: return "I/O error";
    case TS_ECORRUPT: return "data is malformed or corrupt";
    case TS_ERANGE: return "size or value out of range";
    case TS_ENOTSUP: return "operation not supported";
    case TS_ENOTFOUND: return "not found";
    case TS_ENOSPC: return "no space left on device";
    case TS_EEXIST: return "already exists";
    case TS_EBUSY: return "resource busy";
    case TS_ETIMEDOUT: return "timed out";
    case TS_ECANCELED: return "cancelled";
    case TS_EPEER: return "the peer answered with an error";
    case TS_ECLOSED: return "connection closed";
    case TS_EKIND: return "the file is another kind of artifact";
    default: return "unknown error";
    }
}

void ts_set_err(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

int ts_fail(char *err, size_t errlen, int code, const char *fmt, ...) {
    if (err && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}
