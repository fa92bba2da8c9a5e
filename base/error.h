/*
 * error.h — tessera's error codes, shared by every layer.
 *
 * Functions that can fail return int: 0 (TS_OK) on success, one of the negative codes below
 * otherwise. ts_strerror() turns a code into words. There is no errno-by-side-effect.
 */
#ifndef TS_ERROR_H
#define TS_ERROR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    TS_OK = 0,
    TS_EINVAL = -1,     /* an argument is invalid (NULL, out of range) */
    TS_ENOMEM = -2,     /* out of memory (host, device, or arena) */
    TS_ESHAPE = -3,     /* tensor shapes do not agree */
    TS_EDTYPE = -4,     /* dtype not supported by this operation */
    TS_EDEVICE = -5,    /* tensor is on a different device from the engine */
    TS_ENODEV = -6,     /* no such device (no GPU, or CUDA not built in) */
    TS_ECUDA = -7,      /* a CUDA runtime call failed */
    TS_ECUBLAS = -8,    /* a cuBLAS call failed */
    TS_ENONFINITE = -9, /* a tensor holds NaN or Inf where finite values are required */
    TS_EIO = -10,       /* an I/O operation failed */
    TS_ECORRUPT = -11,  /* data is malformed or fails a check */
    TS_ERANGE = -12,    /* a size or value is out of the supported range */
    TS_ENOTSUP = -13,   /* operation not supported here */
    TS_ENOTFOUND = -14, /* no such key, file or entry */
    TS_ENOSPC = -15,    /* no space left on the device (the store is unchanged) */
    TS_EEXIST = -16,    /* already exists */
    TS_EBUSY = -17,     /* resource busy (another process holds it; a peer said Busy) */
    TS_ETIMEDOUT = -18, /* a deadline or timeout passed */
    TS_ECANCELED = -19, /* cancelled by the caller */
    TS_EPEER = -20,     /* the peer answered with an error (net/rpc.h: Error envelope) */
    TS_ECLOSED = -21,   /* the connection closed (or failed to open) before the answer */
    TS_EKIND = -22,     /* a valid file of another kind (a partition where weights were asked) */
};

/* Returns a static string describing err; never NULL, also for unknown codes. */
const char *ts_strerror(int err);

#if defined(__GNUC__)
#define TS_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define TS_PRINTF(a, b)
#endif

/* Writes a printf-formatted sentence into the caller's error buffer (err may be NULL, then
 * nothing is written; the text is always NUL-terminated and truncated to errlen). */
void ts_set_err(char *err, size_t errlen, const char *fmt, ...) TS_PRINTF(3, 4);

/* ts_set_err, then returns code: `return ts_fail(err, errlen, TS_EIO, "cannot read %s", p);`. */
int ts_fail(char *err, size_t errlen, int code, const char *fmt, ...) TS_PRINTF(4, 5);

/* Returns the code of expr from the calling function unless it is TS_OK. */
#define TS_TRY(expr)                                                                               \
    do {                                                                                           \
        int ts_try_rc_ = (expr);                                                                   \
        if (ts_try_rc_ != TS_OK)                                                                   \
            return ts_try_rc_;                                                                     \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif
