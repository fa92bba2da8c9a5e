/*
 * frame_internal.h — internal to net/'s Envelope code (frame.h): what frame_envelope.c (the
 * codec: encoding, and decoding within a memory budget) and frame_check.c (the validity rules)
 * share. Included only by those two files.
 *
 * Naming. A helper shared between them has external linkage, so it is named ts_frame__<name>
 * (two underscores: the module's prefix, then a name no public symbol of frame.h can take); a
 * helper used by one file stays static with its short name.
 */
#ifndef TS_FRAME_INTERNAL_H
#define TS_FRAME_INTERNAL_H

#include <stddef.h>

#include "net/frame.h"

/* Refuses, with code, an unknown field numbered outside protobuf's 1..2^29 − 1 in m or in any
 * sub-message present in it; what is m's path in err (frame_check.c). */
int ts_frame__check_field_numbers(const ProtobufCMessage *m, const char *what, int code, char *err,
                                  size_t errlen);

#endif
