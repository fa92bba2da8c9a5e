/*
 * jsonout.c — one compact JSON line on stdout (jsonout.h).
 */
#include "client/jsonout.h"

#include <stdio.h>

void ts_json_print(json_t *j) {
    if (!j)
        return;
    json_dumpf(j, stdout, JSON_COMPACT);
    printf("\n");
    json_decref(j);
}
