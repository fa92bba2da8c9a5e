/* status_json.c — a status response as JSON (net/status_json.h). */
#include "net/status_json.h"

#include <stdlib.h>
#include <string.h>

#include "base/str.h"

void ts_status_hex(const ProtobufCBinaryData *b, size_t digits, char *out) {
    ts_hex(b->data, b->len < digits / 2 ? b->len : digits / 2, out);
}

const char *ts_status_state_name(int s) {
    switch (s) {
    case TESSERA__MEMBER_STATUS__MEMBER_ALIVE: return "alive";
    case TESSERA__MEMBER_STATUS__MEMBER_SUSPECT: return "suspect";
    case TESSERA__MEMBER_STATUS__MEMBER_DEAD: return "dead";
    case TESSERA__MEMBER_STATUS__MEMBER_LEFT: return "left";
    default: return "?";
    }
}

static const char *objective_name(int o) {
    switch (o) {
    case TESSERA__OBJECTIVE__OBJECTIVE_VELOCITY: return "velocity";
    case TESSERA__OBJECTIVE__OBJECTIVE_EPSILON: return "epsilon";
    case TESSERA__OBJECTIVE__OBJECTIVE_V_PREDICTION: return "v_prediction";
    case TESSERA__OBJECTIVE__OBJECTIVE_X0: return "x0";
    default: return "?";
    }
}

struct ts_status_advert_key {
    const ProtobufCBinaryData *id;
    size_t index;
};

static int key_cmp(const void *x, const void *y) {
    const ProtobufCBinaryData *a = ((const ts_status_advert_key_t *)x)->id;
    const ProtobufCBinaryData *b = ((const ts_status_advert_key_t *)y)->id;
    if (a->len != b->len)
        return a->len < b->len ? -1 : 1;
    int c = a->len ? memcmp(a->data, b->data, a->len) : 0;
    if (c)
        return c;
    size_t i = ((const ts_status_advert_key_t *)x)->index,
           j = ((const ts_status_advert_key_t *)y)->index;
    return i < j ? -1 : i > j; /* the first of two adverts of one node wins, as a scan would */
}

int ts_status_adverts_decode(const Tessera__StatusResponse *r, ts_status_adverts_t *a) {
    a->n = 0;
    a->bodies = calloc(r->n_adverts ? r->n_adverts : 1, sizeof *a->bodies);
    a->by_id = calloc(r->n_adverts ? r->n_adverts : 1, sizeof *a->by_id);
    if (!a->bodies || !a->by_id) {
        free(a->bodies);
        free(a->by_id);
        a->bodies = NULL;
        a->by_id = NULL;
        return TS_ENOMEM; /* a stays safe to free */
    }
    a->n = r->n_adverts;
    for (size_t i = 0; i < a->n; i++) {
        char err[256];
        if (ts_frame_decode_advert_body(&r->adverts[i]->body, 0, &a->bodies[i], err, sizeof err))
            a->bodies[i] = NULL;
        a->by_id[i] = (ts_status_advert_key_t){&r->adverts[i]->node_id, i};
    }
    qsort(a->by_id, a->n, sizeof *a->by_id, key_cmp);
    return TS_OK;
}

void ts_status_adverts_free(ts_status_adverts_t *a) {
    for (size_t i = 0; i < a->n; i++)
        ts_frame_free(a->bodies[i]);
    free(a->bodies);
    free(a->by_id);
}

/* The decoded advert of node id, or NULL. */
const Tessera__AdvertBody *ts_status_advert_of(const Tessera__StatusResponse *r,
                                               const ts_status_adverts_t *a,
                                               const ProtobufCBinaryData *id) {
    (void)r;
    size_t lo = 0, hi = a->n; /* the first key not below (id, 0) */
    ts_status_advert_key_t want = {id, 0};
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (key_cmp(&a->by_id[mid], &want) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < a->n && a->by_id[lo].id->len == id->len &&
        (id->len == 0 || memcmp(a->by_id[lo].id->data, id->data, id->len) == 0))
        return a->bodies[a->by_id[lo].index];
    return NULL;
}

static json_t *j_model(const Tessera__ModelConfig *m) {
    if (!m)
        return json_null();
    return json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:b}", "input_size", (int)m->input_size,
                     "patch_size", (int)m->patch_size, "in_channels", (int)m->in_channels,
                     "hidden_size", (int)m->hidden_size, "depth", (int)m->depth, "num_heads",
                     (int)m->num_heads, "num_classes", (int)m->num_classes, "learn_sigma",
                     (int)(m->has_learn_sigma && m->learn_sigma));
}

static json_t *j_load(const Tessera__Load *l) {
    if (!l)
        return json_null();
    return json_pack("{s:i, s:i, s:f}", "queue_depth", (int)l->queue_depth, "item_latency_us",
                     (int)l->item_latency_us, "requests_per_s", (double)l->requests_per_s);
}

static json_t *j_capacity(const Tessera__Capacity *c) {
    if (!c)
        return json_null();
    json_t *j =
        json_pack("{s:f, s:i, s:i, s:s?}", "items_per_s", (double)c->items_per_s, "max_batch",
                  (int)c->max_batch, "queue_limit", (int)c->queue_limit, "device", c->device);
    if (j && c->has_max_rows)
        json_object_set_new(j, "max_rows", json_integer((json_int_t)c->max_rows));
    if (j && c->has_model_bytes)
        json_object_set_new(j, "model_bytes", json_integer((json_int_t)c->model_bytes));
    if (j && c->has_row_bytes)
        json_object_set_new(j, "row_bytes", json_integer((json_int_t)c->row_bytes));
    return j;
}

/* A training status: step, steps, fraction, loss (null before one), steps_per_s, eta_s (null
 * while the rate is unknown); the responder's own job adds partition_id, cluster and served, and
 * heldout_loss with heldout_step once measured. */
static json_t *j_training(const Tessera__TrainingStatus *t) {
    if (!t)
        return json_null();
    double rate = t->has_steps_per_s ? (double)t->steps_per_s : 0.0;
    json_t *j = json_pack(
        "{s:I, s:I, s:f, s:o, s:f, s:o}", "step", (json_int_t)t->step, "steps",
        (json_int_t)t->steps, "fraction", t->steps ? (double)t->step / (double)t->steps : 1.0,
        "loss", t->has_loss ? json_real(t->loss) : json_null(), "steps_per_s", rate, "eta_s",
        rate > 0.0 ? json_real((double)(t->steps - t->step) / rate) : json_null());
    if (j && t->has_partition_id) {
        char part[65];
        ts_status_hex(&t->partition_id, 64, part);
        json_object_set_new(j, "partition_id", json_string(part));
        json_object_set_new(j, "cluster", json_integer(t->cluster));
        json_object_set_new(j, "served", json_boolean(t->served));
    }
    if (j && t->has_heldout_loss) { /* the responder's own job: the newest measure */
        json_object_set_new(j, "heldout_loss", json_real(t->heldout_loss));
        json_object_set_new(j, "heldout_step", json_integer((json_int_t)t->heldout_step));
    }
    return j;
}

static json_t *j_advert(const Tessera__Advert *a, const Tessera__AdvertBody *b) {
    char id[65], part[65], wh[65];
    ts_status_hex(&a->node_id, 64, id);
    if (!b)
        return json_pack("{s:s, s:b}", "node_id", id, "valid", 0);
    ts_status_hex(&b->partition_id, 64, part);
    ts_status_hex(&b->weights_hash, 64, wh);
    json_int_t dims = b->centroid && b->centroid->n_shape ? b->centroid->shape[0] : 0;
    json_t *training = j_training(b->training);
    char relay[65];
    ts_status_hex(&b->relay_id, 64, relay);
    json_t *j = json_pack(
        "{s:s, s:b, s:I, s:s, s:i, s:i, s:s, s:s, s:o, s:I, s:o, s:o, s:o, s:b, s:s?}", "node_id",
        id, "valid", 1, "version", (json_int_t)b->version, "partition_id", part, "num_clusters",
        (int)b->num_clusters, "cluster", (int)b->cluster, "weights_hash", wh, "objective",
        objective_name(b->objective), "model", j_model(b->model), "centroid_dims", dims, "capacity",
        j_capacity(b->capacity), "load", j_load(b->load), "training", training, "router",
        b->has_router_hash, "relayed_via", b->has_relay_id ? relay : NULL);
    if (j) /* the served weights' own figure (model/heldout.h), null when they carry none */
        json_object_set_new(j, "heldout_loss",
                            b->has_heldout_loss ? json_real(b->heldout_loss) : json_null());
    if (j) { /* a latent expert's VAE (model/latents.h), null for pixels */
        char space[65];
        ts_status_hex(&b->latent_space, 64, space);
        json_object_set_new(j, "latent_space",
                            b->has_latent_space ? json_string(space) : json_null());
    }
    return j;
}

/* The relay carrying member m, as its advert says (short hex), or NULL. Only the adverts that
 * name a relay are looked at: few, where the members may be thousands. */
static const char *relayed_via(const Tessera__MemberState *m, const Tessera__StatusResponse *r,
                               const ts_status_adverts_t *ad, const size_t *relayed,
                               size_t n_relayed, char out[17]) {
    for (size_t k = 0; k < n_relayed; k++) {
        const Tessera__Advert *a = r->adverts[relayed[k]];
        if (a->node_id.len == m->node_id.len &&
            memcmp(a->node_id.data, m->node_id.data, a->node_id.len) == 0) {
            ts_status_hex(&ad->bodies[relayed[k]]->relay_id, 16, out);
            return out;
        }
    }
    return NULL;
}

json_t *ts_status_json(const Tessera__StatusResponse *r, const ts_status_adverts_t *ad) {
    char id[65];
    ts_status_hex(&r->node_id, 64, id);
    json_t *members = json_array(), *adverts = json_array(), *clusters = json_array(),
           *uncovered = json_array();
    size_t *relayed = calloc(r->n_adverts ? r->n_adverts : 1, sizeof *relayed), n_relayed = 0;
    for (size_t i = 0; relayed && i < r->n_adverts; i++)
        if (ad->bodies[i] && ad->bodies[i]->has_relay_id)
            relayed[n_relayed++] = i;
    for (size_t i = 0; i < r->n_members; i++) {
        const Tessera__MemberState *m = r->members[i];
        char mid[65], brief[17], via[17];
        ts_status_hex(&m->node_id, 64, mid);
        ts_status_hex(&m->node_id, 16, brief);
        json_array_append_new(
            members,
            json_pack("{s:s, s:s, s:s, s:I, s:s, s:I, s:I, s:s?}", "node_id", mid, "node_id_short",
                      brief, "state", ts_status_state_name(m->status), "incarnation",
                      (json_int_t)m->incarnation, "addr", m->addr ? m->addr : "",
                      "last_change_age_ms", (json_int_t)m->last_change_age_ms, "advert_version",
                      (json_int_t)m->advert_version, "relayed_via",
                      relayed_via(m, r, ad, relayed, n_relayed, via)));
    }
    free(relayed);
    for (size_t i = 0; i < r->n_adverts; i++)
        json_array_append_new(adverts, j_advert(r->adverts[i], ad->bodies[i]));
    const Tessera__Aggregates *g = r->aggregates;
    json_t *agg = json_null();
    if (g) {
        for (size_t i = 0; i < g->n_clusters; i++) {
            char p[65];
            ts_status_hex(&g->clusters[i]->partition_id, 64, p);
            json_array_append_new(clusters,
                                  json_pack("{s:s, s:i, s:i, s:i}", "partition_id", p, "cluster",
                                            (int)g->clusters[i]->cluster, "live_experts",
                                            (int)g->clusters[i]->live_experts, "training_experts",
                                            (int)g->clusters[i]->training_experts));
        }
        for (size_t i = 0; i < g->n_uncovered; i++) {
            char p[65];
            ts_status_hex(&g->uncovered[i]->partition_id, 64, p);
            json_array_append_new(uncovered,
                                  json_pack("{s:s, s:i, s:i}", "partition_id", p, "cluster",
                                            (int)g->uncovered[i]->cluster, "training_experts",
                                            (int)g->uncovered[i]->training_experts));
        }
        agg = json_pack("{s:O, s:O, s:f, s:f, s:i}", "clusters", clusters, "uncovered", uncovered,
                        "total_capacity", (double)g->total_capacity, "request_rate",
                        (double)g->request_rate, "live_members", (int)g->live_members);
    }
    json_decref(clusters);
    json_decref(uncovered);
    json_t *j = json_pack("{s:s, s:i, s:o, s:o, s:o, s:o}", "node_id", id, "live_members",
                          g ? (int)g->live_members : -1, "members", members, "adverts", adverts,
                          "load", j_load(r->load), "aggregates", agg);
    json_object_set_new(j, "health", r->health ? json_string(r->health) : json_null());
    json_object_set_new(j, "metrics", r->metrics ? json_string(r->metrics) : json_null());
    json_object_set_new(j, "training", j_training(r->training));
    json_t *bans = json_array();
    for (size_t i = 0; i < r->n_bans; i++) {
        const Tessera__Ban *b = r->bans[i];
        char node[2 * TS_FRAME_ID_BYTES + 1], expert[2 * TS_FRAME_ID_BYTES + 1];
        ts_status_hex(&b->node_id, 2 * TS_FRAME_ID_BYTES, node);
        ts_status_hex(&b->expert_id, 2 * TS_FRAME_ID_BYTES, expert);
        json_array_append_new(bans,
                              json_pack("{s:s, s:s, s:s, s:I, s:b}", "node_id", node, "expert",
                                        expert, "reason", b->reason ? b->reason : "", "since_ms",
                                        (json_int_t)b->since_ms, "expelled", (int)b->expelled));
    }
    json_object_set_new(j, "bans", bans);
    return j;
}
