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
#include "store/peers.h"

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
    assert_string_equal(c.metrics_listen, d.metrics_listen);
    assert_int_equal(c.expert_mode, d.expert_mode);
    assert_int_equal(c.expert_cluster, d.expert_cluster);
    assert_string_equal(c.train_model, d.train_model);
    assert_string_equal(c.train_data, d.train_data);
    assert_int_equal(c.train_steps, d.train_steps);
    assert_int_equal(c.train_batch, d.train_batch);
    assert_true(c.train_lr == d.train_lr);
    assert_int_equal(c.train_warmup, d.train_warmup);
    assert_true(c.train_ema == d.train_ema);
    assert_true(c.train_seed == d.train_seed);
    assert_int_equal(c.train_threads, d.train_threads);
    assert_int_equal(c.train_ckpt_every, d.train_ckpt_every);
    assert_int_equal(c.train_keep, d.train_keep);
    assert_int_equal(c.train_serve_while_training, d.train_serve_while_training);
    assert_int_equal(c.compute_device.automatic, 1);
    assert_int_equal(d.compute_device.automatic, 1);
    assert_int_equal(c.compute_precision, TS_PREC_F32);
    assert_int_equal(d.compute_precision, TS_PREC_F32);
    assert_int_equal(c.compute_attention, TS_ATTN_CHOOSE_AUTO);
    /* and every key of the table appears in it, set or commented out, with its default */
    char *text = slurp(TS_CONFIG_EXAMPLE);
    for (int i = 0; ts_daemon_config_key(i); i++) {
        const ts_config_key_info_t *k = ts_daemon_config_key(i);
        char want[128], section[64];
        snprintf(section, sizeof section, "\n[%s]", k->section); /* a line, not a mention */
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
    /* a misspelling gets the key it most likely meant; an unknown section, the list of all */
    expect_error(KEYS "bootstap = 10.0.0.1:7420\n", "[node] bootstap", "did you mean [node] bootstrap?",
                 NULL);
    expect_error(KEYS "[gossip]\nprobe_intervall_ms = 200\n", "did you mean [gossip] probe_interval_ms?",
                 NULL);
    expect_error(KEYS "[relya]\nuse = true\n", "did you mean [relay] use?", "relay, log, fault, trust, metrics",
                 NULL);
    expect_error(KEYS "[node]\nzzzzzzzz = 1\n", "unknown key (configs", NULL); /* nothing close */
    expect_error(KEYS "[gossip]\nprobe_interval_ms = 20\n", "t.ini:6:", "20 is outside 50..60000",
                 NULL);
    expect_error(KEYS "[gossip]\nprobe_interval_ms = 2s\n", "'2s' is not an integer", NULL);
    expect_error(KEYS "[gossip]\nprobe_interval_ms = 99999999999999999999\n", "not an integer",
                 NULL);
    expect_error(KEYS "[gossip]\nindirect_probes = 3\nindirect_probes = 4\n",
                 "t.ini:7:", "given twice", NULL);
    expect_error(KEYS "bootstrap = 10.0.0.1:7420, nohost\n",
                 "t.ini:5:", "'nohost' is not host:port", NULL);
    expect_error(KEYS "advertise = 10.0.0.1:70000\n", "advertise", "not host:port", NULL);
    expect_error(KEYS "advertise = ::1:7420\n", "advertise", NULL);
    expect_error(KEYS "[serve]\nmax_batch = 0\n", "t.ini:6:", "[serve] max_batch",
                 "0 is outside 1..4096", NULL);
    expect_error(KEYS "[serve]\nmax_batch = 64\nmax_queue = 32\n", "[serve] max_queue (32)",
                 "max_batch (64)", NULL);
    expect_error(KEYS "[log]\nlevel = verbose\n", "want debug, info, warn or error", NULL);
    expect_error(KEYS "[log]\nformat = xml\n", "want text or json", NULL);
    expect_error(KEYS "[compute]\ndevice = gpu\n", "t.ini:6:", "[compute] device",
                 "want auto, cpu, cuda or cuda:N", NULL);
    expect_error(KEYS "[compute]\ndevice = cuda:x\n", "want auto, cpu, cuda or cuda:N", NULL);
    expect_error(KEYS "[compute]\nprecision = fp16\n", "t.ini:6:", "[compute] precision",
                 "'fp16': want f32, bf16 or f16", NULL);
    expect_error(KEYS "[compute]\nattention = flash\n", "t.ini:6:", "[compute] attention",
                 "'flash': want auto, measure, fused or composed", NULL);
    expect_error(KEYS "[metrics]\nlisten = 9420\n", "t.ini:6:", "[metrics] listen", "not host:port",
                 NULL);
    expect_error(KEYS "[metrics]\nport = 9420\n", "unknown key", NULL);
    expect_error(KEYS "this is not ini\n", "t.ini:5:", "not an INI line", NULL);
    expect_error("[node]\nnetwork_key = n\nlisten = 127.0.0.1:1\n", "identity is required",
                 "tessera keygen", NULL);
    expect_error("[node]\nidentity = i\nnetwork_key = n\nlisten =\n", "[node] listen is empty",
                 NULL);
    expect_error("[node]\nidentity = i\nlisten = 127.0.0.1:1\n", "network_key is required",
                 "--network-key", NULL);
    expect_error(KEYS "[gossip]\nprobe_interval_ms = 500\nprobe_timeout_ms = 500\n",
                 "probe_timeout_ms (500) must be less than probe_interval_ms (500)", NULL);
    expect_error(KEYS "[limits]\nmax_connections = 4\n", "max_connections_per_ip (8) exceeds",
                 NULL);
    expect_error("[node]\nidentity = i\nnetwork_key = n\nlisten = 0.0.0.0:7420\n",
                 "set [node] advertise", NULL);
    /* [expert] mode and the keys each mode needs or refuses */
    expect_error(KEYS "[expert]\nmode = serve\n", "'serve': want none, host, train or auto", NULL);
    expect_error(KEYS "[expert]\nweights = w.safetensors\npartition = p\n",
                 "[expert] weights is set but mode = none", "set mode = host", NULL);
    expect_error(KEYS "[expert]\nmode = host\nweights = w.safetensors\n",
                 "mode = host needs partition", NULL);
    expect_error(KEYS "[expert]\nmode = host\npartition = p\n", "mode = host needs weights", NULL);
    expect_error(KEYS "[expert]\nmode = host\nweights = w\npartition = p\ncluster = 1\n",
                 "cluster is set but mode = host", NULL);
    expect_error(KEYS "[expert]\nmode = train\npartition = p\n", "mode = train needs cluster",
                 NULL);
    expect_error(KEYS "[expert]\nmode = auto\ncluster = 1\n", "cluster is set but mode = auto",
                 "an auto node chooses its cluster", NULL);
    expect_error(KEYS "[expert]\nmode = auto\nweights = w\n", "weights is set but mode = auto",
                 NULL);
    expect_error(KEYS "[expert]\nauto_interval_s = 0\n", "0 is outside 1..86400", NULL);
    expect_error(KEYS "[expert]\nmode = train\ncluster = 0\n", "mode = train needs partition",
                 NULL);
    expect_error(KEYS "[expert]\ncluster = -1\n", "-1 is outside 0..65535", NULL);
    /* [train] values */
    expect_error(KEYS "[train]\nlr = 0\n", "[train] lr: 0 is outside 1e-09..10", NULL);
    expect_error(KEYS "[train]\nlr = fast\n", "'fast' is not a number", NULL);
    expect_error(KEYS "[train]\nlr = nan\n", "'nan' is not a number", NULL);
    expect_error(KEYS "[train]\nema = 1.5\n", "1.5 is outside 0..1", NULL);
    expect_error(KEYS "[train]\nseed = -3\n", "'-3' is not a non-negative integer", NULL);
    expect_error(KEYS "[train]\nseed = 99999999999999999999\n", "not a non-negative integer", NULL);
    expect_error(KEYS "[train]\nserve_while_training = yes\n", "want true or false", NULL);
    expect_error(KEYS "[train]\nmodel = huge\n", "'huge': want a model preset", NULL);
    expect_error(KEYS "[train]\nckpt_every = 0\n", "0 is outside 1..", NULL);
    expect_error(KEYS "[trian]\nsteps = 5\n", "unknown section", "expert, compute, train", NULL);
}

static void test_values(void **state) {
    (void)state;
    ts_daemon_config_t c;
    char err[512] = "";
    const char *text = KEYS "bootstrap = 10.0.0.1:7420, [2001:db8::1]:7421\n"
                            "bootstrap = node3.example:9\n"
                            "; a comment\n# another\n"
                            "[gossip]\nprobe_interval_ms = 200\nprobe_timeout_ms = 100\n"
                            "[compute]\ndevice = cuda:1\nprecision = bf16\nattention = measure\n"
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
    assert_int_equal(c.compute_device.automatic, 0);
    assert_int_equal(c.compute_device.device, TS_CUDA);
    assert_int_equal(c.compute_device.gpu, 1);
    assert_int_equal(c.compute_precision, TS_PREC_BF16);
    assert_int_equal(c.compute_attention, TS_ATTN_CHOOSE_MEASURE);
    assert_int_equal(c.log_format, TS_LOG_JSON);
    assert_string_equal(c.log_file, "/tmp/x.log");
    assert_string_equal(c.advertise, "127.0.0.1:7420"); /* defaults to listen */
    assert_string_equal(c.identity, "id.key");
    assert_string_equal(c.metrics_listen, "127.0.0.1:9420"); /* the default */
    /* an empty [metrics] listen turns the endpoint off */
    rc = ts_daemon_config_parse(&c, KEYS "[metrics]\nlisten =\n", "t.ini", err, sizeof err);
    if (rc != TS_OK)
        fail_msg("%s", err);
    assert_string_equal(c.metrics_listen, "");
    rc = ts_daemon_config_parse(&c, KEYS "[metrics]\nlisten = [::1]:9500\n", "t.ini", err,
                                sizeof err);
    if (rc != TS_OK)
        fail_msg("%s", err);
    assert_string_equal(c.metrics_listen, "[::1]:9500");
    /* port 0: any free port (tests running several daemons) */
    rc = ts_daemon_config_parse(&c, KEYS "[metrics]\nlisten = 127.0.0.1:0\n", "t.ini", err,
                                sizeof err);
    if (rc != TS_OK)
        fail_msg("%s", err);
    assert_string_equal(c.metrics_listen, "127.0.0.1:0");
    assert_int_equal(c.expert_mode, TS_EXPERT_NONE);

    /* a training node */
    text = KEYS "[expert]\nmode = train\npartition = part/partition.safetensors\ncluster = 3\n"
                "[train]\nmodel = S/4\ndata = /data/fmnist\nsteps = 40000\nbatch = 128\n"
                "lr = 1e-4\nwarmup = 0\nema = 0.9999\nseed = 18446744073709551615\n"
                "threads = 2\nckpt_every = 250\nkeep = 1\nserve_while_training = true\n";
    rc = ts_daemon_config_parse(&c, text, "t.ini", err, sizeof err);
    if (rc != TS_OK)
        fail_msg("%s", err);
    assert_int_equal(c.expert_mode, TS_EXPERT_TRAIN);
    assert_string_equal(ts_expert_mode_name(c.expert_mode), "train");
    assert_string_equal(c.expert_partition, "part/partition.safetensors");
    assert_int_equal(c.expert_cluster, 3);
    assert_string_equal(c.expert_weights, ""); /* optional in train mode */
    assert_string_equal(c.train_model, "S/4");
    assert_string_equal(c.train_data, "/data/fmnist");
    assert_int_equal(c.train_steps, 40000);
    assert_int_equal(c.train_batch, 128);
    assert_true(c.train_lr == 1e-4);
    assert_int_equal(c.train_warmup, 0);
    assert_true(c.train_ema == 0.9999);
    assert_true(c.train_seed == UINT64_MAX);
    assert_int_equal(c.train_threads, 2);
    assert_int_equal(c.train_ckpt_every, 250);
    assert_int_equal(c.train_keep, 1);
    assert_int_equal(c.train_serve_while_training, 1);

    /* a hosting node */
    text = KEYS "[expert]\nmode = host\nweights = e.safetensors\npartition = p\n";
    rc = ts_daemon_config_parse(&c, text, "t.ini", err, sizeof err);
    if (rc != TS_OK)
        fail_msg("%s", err);
    assert_int_equal(c.expert_mode, TS_EXPERT_HOST);
    assert_int_equal(c.expert_cluster, -1);
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
    assert_int_equal(ts_addr_valid("127.0.0.1:1", 11, 0), 1);
    assert_int_equal(ts_addr_valid("[::1]:65535", 11, 0), 1);
    assert_int_equal(ts_addr_valid("host:0", 6, 0), 0);
    assert_int_equal(ts_addr_valid("host:0", 6, 1), 1);
    assert_int_equal(ts_addr_valid(":7420", 5, 0), 0);
    assert_int_equal(ts_addr_valid("host:", 5, 0), 0);
    assert_int_equal(ts_addr_valid("host", 4, 0), 0);
    assert_int_equal(ts_addr_valid("a b:1", 5, 0), 0);
    assert_int_equal(ts_addr_valid("[::1:7420", 9, 0), 0);
}

/* docs/protocol.md §3.5 states tesserad's limits and timeouts as `[section] key = default`; each
 * must be the table's default (the daemon's), so the document cannot drift from the code. And
 * the numbers in the prose next to them: seconds for the millisecond key, the counts. */
static void test_protocol_md_limits(void **state) {
    (void)state;
    char *doc = slurp(TS_PROTOCOL_MD);
    assert_non_null(doc);
    static const char *const keys[][2] = {{"limits", "handshake_timeout_ms"},
                                          {"limits", "idle_timeout_s"},
                                          {"limits", "max_connections"},
                                          {"limits", "max_connections_per_ip"}};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const ts_config_key_info_t *k = NULL;
        for (int j = 0; ts_daemon_config_key(j); j++)
            if (strcmp(ts_daemon_config_key(j)->section, keys[i][0]) == 0 &&
                strcmp(ts_daemon_config_key(j)->key, keys[i][1]) == 0)
                k = ts_daemon_config_key(j);
        assert_non_null(k);
        char want[160];
        snprintf(want, sizeof want, "`[%s] %s = %s`", k->section, k->key, k->deflt);
        if (!strstr(doc, want))
            fail_msg("docs/protocol.md does not state %s (the daemon's default)", want);
        char prose[96];
        if (strcmp(k->key, "handshake_timeout_ms") == 0)
            snprintf(prose, sizeof prose, "not open %d s after", atoi(k->deflt) / 1000);
        else if (strcmp(k->key, "idle_timeout_s") == 0)
            snprintf(prose, sizeof prose, "received for %s s", k->deflt);
        else if (strcmp(k->key, "max_connections") == 0)
            snprintf(prose, sizeof prose, "at most %s connections at once", k->deflt);
        else
            snprintf(prose, sizeof prose, "and %s from one IP address", k->deflt);
        if (!strstr(doc, prose))
            fail_msg("docs/protocol.md's prose does not say '%s'", prose);
    }
    free(doc);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_example_is_valid_and_complete),
        cmocka_unit_test(test_errors_name_file_line_and_key),
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_addr_check),
        cmocka_unit_test(test_protocol_md_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
