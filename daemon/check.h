/*
 * check.h — `tesserad --check-config`: every file the config names is opened and validated as
 * the daemon would use it, without starting anything or creating the data directory.
 *
 *   [expert] partition  loads as a partition artifact (header, PCA basis, centroids, id);
 *   [expert] weights    mode = host: a .safetensors file, or a hash prefix in an existing store;
 *                       a DiT whose every tensor loads (names, shapes, finite values — so a
 *                       truncated file fails), with metadata partition_id equal to the
 *                       partition's id and cluster below its K;
 *   [expert] router     a classifier that loads, with one output per cluster of the partition and
 *                       (when its metadata names one) the same partition;
 *   [expert] cluster    mode = train: below the partition's K.
 * What it found is written to out, one line per file; the first problem is TS_* with err naming
 * the key, the file and what is wrong.
 */
#ifndef TS_DAEMON_CHECK_H
#define TS_DAEMON_CHECK_H

#include <stdio.h>

#include "daemon/config.h"

int ts_check_expert_files(const ts_daemon_config_t *c, FILE *out, char *err, size_t errlen);

/* Whether the ports the config listens on are free now: [node] listen (TCP and UDP: RPC and
 * gossip share the port) and [metrics] listen (TCP), each bound and released at once (port 0
 * always is). TS_EIO with err naming the key, the address and the reason ("address already in
 * use: another tesserad?") for the first that is taken. */
int ts_check_ports(const ts_daemon_config_t *c, char *err, size_t errlen);

#endif
