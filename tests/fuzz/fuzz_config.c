/*
 * fuzz_config.c — libFuzzer harness for tesserad's configuration parser (daemon/config.h,
 * ts_daemon_config_parse): the input, up to its first NUL byte, is the text of a config file
 * (copied into a malloc'd, NUL-terminated buffer, as ts_daemon_config_load hands it over).
 *
 * The key table's integer ranges are private to daemon/config.c, so what is checked is what
 * config.h promises. A failure says why. A success has every string field NUL-terminated within
 * its array, the required identity and network_key set, 0..TS_CONFIG_MAX_BOOTSTRAP non-empty
 * bootstrap addresses, the enumerations (expert mode, log level and format) and the boolean
 * within their values, expert cluster −1 or more, and the whole-file checks true (probe timeout
 * below the interval, per-address connections within the total, the queue at least a batch);
 * parsing the same text again gives the same bytes. The key table itself (ts_daemon_config_key)
 * is walked once: every entry has a section, key, type and default.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "daemon/config.h"

#define TERMINATED(field) (memchr((field), 0, sizeof(field)) != NULL)

static ts_daemon_config_t c1, c2;

static void check_table(void) {
    static int done;
    if (done)
        return;
    int n = 0;
    for (const ts_config_key_info_t *k; (k = ts_daemon_config_key(n)) != NULL; n++)
        if (!k->section || !k->key || !k->type || !k->deflt || !k->doc || !k->section[0] ||
            !k->key[0])
            abort();
    if (n == 0 || ts_daemon_config_key(-1) != NULL)
        abort();
    done = 1;
}

static void check(const ts_daemon_config_t *c) {
    if (!TERMINATED(c->identity) || !TERMINATED(c->network_key) || !TERMINATED(c->data_dir) ||
        !TERMINATED(c->listen) || !TERMINATED(c->advertise) || !TERMINATED(c->expert_weights) ||
        !TERMINATED(c->expert_partition) || !TERMINATED(c->expert_router) ||
        !TERMINATED(c->train_model) || !TERMINATED(c->train_data) || !TERMINATED(c->log_file) ||
        !TERMINATED(c->metrics_listen))
        abort();
    if (!c->identity[0] || !c->network_key[0])
        abort(); /* required */
    if (c->n_bootstrap < 0 || c->n_bootstrap > TS_CONFIG_MAX_BOOTSTRAP)
        abort();
    for (int i = 0; i < c->n_bootstrap; i++)
        if (!TERMINATED(c->bootstrap[i]) || !c->bootstrap[i][0])
            abort();
    if ((unsigned)c->expert_mode > TS_EXPERT_TRAIN || (unsigned)c->log_level > TS_LOG_ERROR ||
        (unsigned)c->log_format > TS_LOG_JSON ||
        (c->train_serve_while_training != 0 && c->train_serve_while_training != 1) ||
        c->expert_cluster < -1)
        abort();
    if (c->probe_timeout_ms >= c->probe_interval_ms ||
        c->max_connections_per_ip > c->max_connections || c->serve_max_queue < c->serve_max_batch)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    check_table();
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    char err[512] = "";
    int rc = ts_daemon_config_parse(&c1, text, "fuzz.ini", err, sizeof err);
    if (rc != TS_OK) {
        if (!err[0] || !TERMINATED(err))
            abort(); /* a refusal says why */
    } else {
        check(&c1);
        if (ts_daemon_config_parse(&c2, text, "fuzz.ini", err, sizeof err) != TS_OK ||
            memcmp(&c1, &c2, sizeof c1) != 0)
            abort(); /* the same text, the same configuration */
    }
    free(text);
    return 0;
}
