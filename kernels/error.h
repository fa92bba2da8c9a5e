/*
 * error.h — tessera's error codes, shared by every layer.
 *
 * Functions that can fail return int: 0 (TS_OK) on success, one of the negative codes below
 * otherwise. ts_strerror() turns a code into words. There is no errno-by-side-effect.
 */
#ifndef TS_ERROR_H
#define TS_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

enum {
    TS_OK = 0,
    TS_EINVAL = -1,    /* an argument is invalid (NULL, out of range) */
    TS_ENOMEM = -2,    /* out of memory (host, device, or arena) */
    TS_ESHAPE = -3,    /* tensor shapes do not agree */
    TS_EDTYPE = -4,    /* dtype not supported by this operation */
    TS_EDEVICE = -5,   /* tensor is on a different device from the engine */
    TS_ENODEV = -6,    /* no such device (no GPU, or CUDA not built in) */
    TS_ECUDA = -7,     /* a CUDA runtime call failed */
    TS_ECUBLAS = -8,   /* a cuBLAS call failed */
    TS_ENONFINITE = -9,/* a tensor holds NaN or Inf where finite values are required */
    TS_EIO = -10,      /* an I/O operation failed */
    TS_ECORRUPT = -11, /* data is malformed or fails a check */
    TS_ERANGE = -12,   /* a size or value is out of the supported range */
    TS_ENOTSUP = -13,  /* operation not supported here */
};

/* Returns a static string describing err; never NULL, also for unknown codes. */
const char *ts_strerror(int err);

#ifdef __cplusplus
}
#endif

#endif
