/* tesserad_path.c — which tesserad the client starts (tesserad_path.h). */
#define _DEFAULT_SOURCE /* readlink */

#include "client/tesserad_path.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PATHLEN 4096

void ts_tesserad_path(char *out, size_t len) {
    const char *env = getenv("TESSERAD");
    if (env && *env) {
        snprintf(out, len, "%s", env);
        return;
    }
    char self[PATHLEN];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = 0;
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = 0;
            snprintf(out, len, "%.*s/../daemon/tesserad", (int)(len - 32), self);
            if (access(out, X_OK) == 0)
                return;
            snprintf(out, len, "%.*s/tesserad", (int)(len - 32), self);
            if (access(out, X_OK) == 0)
                return;
        }
    }
    snprintf(out, len, "tesserad");
}
