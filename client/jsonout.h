/*
 * jsonout.h — the one way the `tessera` verbs print a JSON object: one compact line on stdout
 * (jansson escapes every string, so a quote in a file name cannot break it).
 */
#ifndef TS_CLIENT_JSONOUT_H
#define TS_CLIENT_JSONOUT_H

#include <jansson.h>

/* Prints j as one line and takes ownership of it; NULL (out of memory) prints nothing. */
void ts_json_print(json_t *j);

#endif
