/*
 * test_config.c — tesserad's configuration (daemon/config.h): the documented example parses to
 * the documented defaults, the example documents every key of the table, and each kind of bad
 * input gets an error naming the file, the line and the key.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/config.h"

#ifndef TS_CONFIG_EXAMPLE
#error "TS_CONFIG_EXAMPLE (configs/tesserad.ini) must be defined by the build"
#endif

#define KEYS "[node]\nidentity = id.key\nnetwork_key = net.key\nlisten = 127.0.0.1:7420\n"

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char *buf = calloc(1, 1 << 16);
    assert_non_null(buf);
    size_t n = fread(buf, 1, (1 << 16) - 1, f);
    fclose(f);
    assert_true(n > 0);
    return buf;
}

static void test_example_is_valid_and_complete(void **state) {
    (void)state;
    ts_daemon_config_t c, d;
    char err[512] = "";
    int rc = ts_daemon_config_load(&c, TS_CONFIG_EXAMPLE, err, sizeof err);
    if (rc != TS_OK)
        fail_msg("%s", err);
    /* every key in the example is at its default (the file documents the defaults) */
    ts_daemon_config_default(&d);
    assert_int_equal(c.probe_interval_ms, d.probe_interval_ms);
    assert_int_equal(c.probe_timeout_ms, d.probe_timeout_ms);
    assert_int_equal(c.indirect_probes, d.indirect_probes);
    assert_int_equal(c.suspicion_mult, d.suspicion_mult);
    assert_int_equal(c.retransmit_mult, d.retransmit_mult);
    assert_int_equal(c.pushpull_interval_s, d.pushpull_interval_s);
    assert_int_equal(c.max_frame_mib, d.max_frame_mib);
    assert_int_equal(c.max_connections, d.max_connections);
    assert_int_equal(c.max_connections_per_ip, d.max_connections_per_ip);
    assert_int_equal(c.handshake_timeout_ms, d.handshake_timeout_ms);
    assert_int_equal(c.idle_timeout_s, d.idle_timeout_s);
    assert_int_equal(c.serve_max_batch, d.serve_max_batch);
    assert_int_equal(c.serve_max_wait_ms, d.serve_max_wait_ms);
    assert_int_equal(c.serve_max_queue, d.serve_max_queue);
    assert_int_equal(c.serve_compute_threads, d.serve_compute_threads);
    assert_int_equal(c.weights_bandwidth_mib_s, d.weights_bandwidth_mib_s);
    assert_int_equal(c.weights_max_pending, d.weights_max_pending);
    assert_int_equal(c.log_level, d.log_level);
    assert_int_equal(c.log_format, d.log_format);
    assert_string_equal(c.listen, d.listen);
    assert_string_equal(c.data_dir, d.data_dir);
    /* and every key of the table appears in it, set or commented out, with its default */
    char *text = slurp(TS_CONFIG_EXAMPLE);
    for (int i = 0; ts_daemon_config_key(i); i++) {
        const ts_config_key_info_t *k = ts_daemon_config_key(i);
        char want[128], section[64];
        snprintf(section, sizeof section, "[%s]", k->section);
        snprintf(want, sizeof want, "\n%s = ", k->key);
        char *at = strstr(text, section);
        if (!at)
            fail_msg("configs/tesserad.ini has no section %s", section);
        char *next = strstr(at + 1, "\n[");
        char *hit = strstr(at, want);
        if (!hit || (next && hit > next)) { /* maybe commented out: "; key = " */
            snprintf(want, sizeof want, "\n; %s = ", k->key);
            hit = strstr(at, want);
        }
        if (!hit || (next && hit > next))
            fail_msg("configs/tesserad.ini does not document [%s] %s", k->section, k->key);
        if (k->deflt[0] != '(') { /* a literal default: the file shows it */
            const char *v = hit + strlen(want);
            if (strncmp(v, k->deflt, strlen(k->deflt)) != 0)
                fail_msg("configs/tesserad.ini shows [%s] %s with another value than the "
                         "default %s",
                         k->section, k->key, k->deflt);
        }
    }
    free(text);
}

/* text must fail with an error containing each of the NULL-terminated fragments. */
static void expect_error(const char *text, ...) {
    ts_daemon_config_t c;
    char err[512] = "";
    int rc = ts_daemon_config_parse(&c, text, "t.ini", err, sizeof err);
    if (rc == TS_OK)
        fail_msg("accepted:\n%s", text);
    assert_int_equal(rc, TS_EINVAL);
    va_list ap;
    va_start(ap, text);
    for (const char *frag = va_arg(ap, const char *); frag; frag = va_arg(ap, const char *))
        if (!strstr(err, frag))
            fail_msg("error '%s' lacks '%s' (input:\n%s)", err, frag, text);
    va_end(ap);
}

static void test_errors_name_file_line_and_key(void **state) {
    (void)state;
    expect_error(KEYS "[gossip]\nprobe_intervall_ms = 200\n", "t.ini:6:", "[gossip]",
                 "probe_intervall_ms", "unknown key", NULL);
    expect_error(KEYS "[gosip]\nprobe_interval_ms = 200\n", "t.ini:6:", "unknown section", NULL);
    expect_error(KEYS "[gossip]\nprobe_interval_ms = 20\n", "t.ini:6:", "20 is outside 50..60000",
                 NULL);
    expect_error(KEYS "[gossip]\nprobe_interval_ms = 2s\n", "'2s' is not an integer", NULL);
    expect_error(KEYS "[gossip]\nprobe_interval_ms = 99999999999999999999\n", "not an integer",
                 NULL);
    expect_error(KEYS "[gossip]\nindirect_probes = 3\nindirect_probes = 4\n", "t.ini:7:",
                 "given twice", NULL);
    expect_error(KEYS "bootstrap = 10.0.0.1:7420, nohost\n", "t.ini:5:", "'nohost' is not host:port",
                 NULL);
    expect_error(KEYS "advertise = 10.0.0.1:70000\n", "advertise", "not host:port", NULL);
    expect_error(KEYS "advertise = ::1:7420\n", "advertise", NULL);
    expect_error(KEYS "[serve]\nmax_batch = 0\n", "t.ini:6:", "[serve] max_batch",
                 "0 is outside 1..4096", NULL);
    expect_error(KEYS "[serve]\nmax_batch = 64\nmax_queue = 32\n", "[serve] max_queue (32)",
                 "max_batch (64)", NULL);
    expect_error(KEYS "[log]\nlevel = verbose\n", "want debug, info, warn or error", NULL);
    expect_error(KEYS "[log]\nformat = xml\n", "want text or json", NULL);
    expect_error(KEYS "this is not ini\n", "t.ini:5:", "not an INI line", NULL);
    expect_error("[node]\nnetwork_key = n\nlisten = 127.0.0.1:1\n", "identity is required",
                 "tessera keygen", NULL);
    expect_error("[node]\nidentity = i\nlisten = 127.0.0.1:1\n", "network_key is required",
                 "--network-key", NULL);
    expect_error(KEYS "[gossip]\nprobe_interval_ms = 500\nprobe_timeout_ms = 500\n",
                 "probe_timeout_ms (500) must be less than probe_interval_ms (500)", NULL);
    expect_error(KEYS "[limits]\nmax_connections = 4\n", "max_connections_per_ip (8) exceeds",
                 NULL);
    expect_error("[node]\nidentity = i\nnetwork_key = n\nlisten = 0.0.0.0:7420\n",
                 "set [node] advertise", NULL);
}

static void test_values(void **state) {
    (void)state;
    ts_daemon_config_t c;
    char err[512] = "";
    const char *text = KEYS "bootstrap = 10.0.0.1:7420, [2001:db8::1]:7421\n"
                            "bootstrap = node3.example:9\n"
                            "; a comment\n# another\n"
                            "[gossip]\nprobe_interval_ms = 200\nprobe_timeout_ms = 100\n"
                            "[log]\nlevel = debug\nformat = json\nfile = /tmp/x.log\n";
    int rc = ts_daemon_config_parse(&c, text, "t.ini", err, sizeof err);
    if (rc != TS_OK)
        fail_msg("%s", err);
    assert_int_equal(c.n_bootstrap, 3);
    assert_string_equal(c.bootstrap[0], "10.0.0.1:7420");
    assert_string_equal(c.bootstrap[1], "[2001:db8::1]:7421");
    assert_string_equal(c.bootstrap[2], "node3.example:9");
    assert_int_equal(c.probe_interval_ms, 200);
    assert_int_equal(c.probe_timeout_ms, 100);
    assert_int_equal(c.log_level, TS_LOG_DEBUG);
    assert_int_equal(c.log_format, TS_LOG_JSON);
    assert_string_equal(c.log_file, "/tmp/x.log");
    assert_string_equal(c.advertise, "127.0.0.1:7420"); /* defaults to listen */
    assert_string_equal(c.identity, "id.key");
}

static void test_missing_file(void **state) {
    (void)state;
    ts_daemon_config_t c;
    char err[512] = "";
    assert_int_equal(ts_daemon_config_load(&c, "/nonexistent/tesserad.ini", err, sizeof err),
                     TS_ENOTFOUND);
    assert_non_null(strstr(err, "/nonexistent/tesserad.ini"));
}

static void test_addr_check(void **state) {
    (void)state;
    assert_int_equal(ts_config_check_addr("127.0.0.1:1", 0), TS_OK);
    assert_int_equal(ts_config_check_addr("[::1]:65535", 0), TS_OK);
    assert_int_equal(ts_config_check_addr("host:0", 0), TS_EINVAL);
    assert_int_equal(ts_config_check_addr("host:0", 1), TS_OK);
    assert_int_equal(ts_config_check_addr(":7420", 0), TS_EINVAL);
    assert_int_equal(ts_config_check_addr("host:", 0), TS_EINVAL);
    assert_int_equal(ts_config_check_addr("host", 0), TS_EINVAL);
    assert_int_equal(ts_config_check_addr("a b:1", 0), TS_EINVAL);
    assert_int_equal(ts_config_check_addr("[::1:7420", 0), TS_EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_example_is_valid_and_complete),
        cmocka_unit_test(test_errors_name_file_line_and_key),
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_addr_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
