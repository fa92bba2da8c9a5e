/*
 * tesserad_path.h — which tesserad the client starts (`tessera up`) or names in a systemd unit
 * (`tessera join --systemd`).
 */
#ifndef TS_CLIENT_TESSERAD_PATH_H
#define TS_CLIENT_TESSERAD_PATH_H

#include <stddef.h>

/* The tesserad to run: $TESSERAD, else the one built or installed next to this tessera
 * (build/client/tessera → build/daemon/tesserad; bin/tessera → bin/tesserad), else "tesserad"
 * from PATH. */
void ts_tesserad_path(char *out, size_t len);

#endif
