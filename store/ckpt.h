/*
 * ckpt.h — training checkpoints in the store (the `ckpt` database, architecture.md §8).
 *
 * A checkpoint is an opaque blob — in practice the safetensors bytes of ts_trainer_save_mem:
 * step, parameters, AdamW moments, EMA weights, and (seed, step), which are the RNG state and the
 * data cursor — stored under the key (run id, step). The run id is a name of 1..TS_CKPT_RUN_MAX
 * bytes without NUL; the key is the run id, a 0 byte, and the step as 8 big-endian bytes, so the
 * checkpoints of one run sort by step and no run's keys are a prefix of another's.
 *
 * Saving writes the blob and trims the run in the same write transaction: either the new
 * checkpoint is there and the run is trimmed, or nothing changed (a kill at any moment leaves the
 * previous state). A checkpoint at step s supersedes the run's checkpoints at steps ≥ s — they
 * belong to a timeline this one replaces (a run started over, or resumed from an older point) —
 * and then all but the newest keep_last are deleted.
 */
#ifndef TS_CKPT_H
#define TS_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "model/trainer.h"
#include "store/store.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_CKPT_RUN_MAX 255 /* bytes of a run id */

/* Stores blob (len bytes, copied: the caller keeps it) as the checkpoint of run_id at step
 * (≥ 0), deletes the run's checkpoints at steps ≥ step, and keeps only the newest keep_last
 * (0: keep all). TS_EINVAL for a bad run id, step or keep_last; TS_ENOSPC when the store cannot
 * grow to hold it (nothing is changed then). */
int ts_ckpt_save(ts_store_t *s, const char *run_id, int64_t step, const void *blob, size_t len,
                 int keep_last);

/* The newest checkpoint of run_id: *step, and *blob (malloc'd, the caller frees it) of *len
 * bytes. TS_ENOTFOUND when the run has none. */
int ts_ckpt_latest(ts_store_t *s, const char *run_id, int64_t *step, unsigned char **blob,
                   size_t *len);

/* Called for each checkpoint, in (run id, step) order; a return other than TS_OK stops the walk
 * and is returned by ts_ckpt_list. run_id is only valid during the call. */
typedef int (*ts_ckpt_each_fn)(void *ctx, const char *run_id, int64_t step, size_t len);

/* Lists the checkpoints of run_id, or of every run when run_id is NULL. A key that does not
 * parse as (run id, step) is TS_ECORRUPT. */
int ts_ckpt_list(ts_store_t *s, const char *run_id, ts_ckpt_each_fn fn, void *ctx);

/* Deletes every checkpoint of run_id; *removed (may be NULL) is how many. */
int ts_ckpt_drop(ts_store_t *s, const char *run_id, int *removed);

/* ---- a trainer's state (model/trainer.h) as a checkpoint ------------------------------------ */

/* Saves tr's state (ts_trainer_save_mem) as run_id's checkpoint at tr->step, keeping the newest
 * keep_last. On failure err names the store, the run and the step. */
int ts_ckpt_save_trainer(ts_store_t *s, const char *run_id, const ts_trainer_t *tr, int keep_last,
                         char *err, size_t errlen);

/* Loads run_id's newest checkpoint into tr (ts_trainer_load_mem: a checkpoint of another
 * configuration is refused and tr left as it was) and checks that it holds the step it is
 * stored under. TS_ENOTFOUND, with tr untouched, when the run has none. */
int ts_ckpt_resume_trainer(ts_store_t *s, const char *run_id, ts_trainer_t *tr, char *err,
                           size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
