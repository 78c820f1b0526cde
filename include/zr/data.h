/*
 * zr/data.h - training data: llm.c token shards, a byte-level tokenizer, the
 * default fortunes corpus, and a batch loader with distributed sampling.
 *
 * Tokens are uint16 (llm.c's shard format). A zr_dataset owns one token
 * array; loaders borrow it. The last ZR_VAL_PERCENT percent of the tokens are
 * the validation split, the rest the training split.
 *
 * Distributed sampling: a global batch is world x B x T tokens (+1 for the
 * last target); rank r takes the r-th B x T slice of it. So W ranks with
 * batch B see exactly the batches one rank with batch W x B sees, in the same
 * order. The position is the number of global batches consumed; it is all a
 * checkpoint needs to resume. Nothing here depends on MPI.
 */
#ifndef ZR_DATA_H
#define ZR_DATA_H

#include "zr/base.h"

#include <stddef.h>
#include <stdint.h>

#define ZR_SHARD_MAGIC 20240520
#define ZR_SHARD_VERSION 1
#define ZR_SHARD_HEADER_INTS 256
#define ZR_BYTE_VOCAB 256
#define ZR_VAL_PERCENT 5
#define ZR_FORTUNES_DIR "/usr/share/games/fortunes"

/* ---- shards ----------------------------------------------------------------- */

/*
 * Writes an llm.c token shard (header: magic, version, count; uint16 tokens)
 * to "<path>.tmp", fsyncs and renames it to path.
 */
zr_status zr_shard_write(const char *path, const uint16_t *tokens, size_t n);

/*
 * Reads a shard; *tokens is allocated with zr_alloc (free with zr_free).
 * Wrong magic or version, a truncated header, or a size that disagrees with
 * the token count give ZR_ERR_FORMAT naming the file and the field.
 */
zr_status zr_shard_read(const char *path, uint16_t **tokens, size_t *n);

/* ---- byte tokenizer ------------------------------------------------------- */

/* One token per byte (V = 256), so any file, UTF-8 or not, can be trained on. */
void zr_bytes_encode(const void *text, size_t bytes, uint16_t *tokens);
/* Tokens >= 256 become '?'. */
void zr_bytes_decode(const uint16_t *tokens, size_t n, char *text);

/* ---- datasets --------------------------------------------------------------- */

typedef struct zr_dataset {
    uint16_t *tokens; /* owned; zr_alloc'd */
    size_t n;
    int vocab; /* tokens are < vocab */
} zr_dataset;

/* From an llm.c shard (vocab: the largest token + 1, at least 1). */
zr_status zr_dataset_load_shard(zr_dataset *ds, const char *path);
/* Any file through the byte tokenizer (vocab 256). */
zr_status zr_dataset_load_text(zr_dataset *ds, const char *path);
/*
 * The default corpus: the plain fortune files (no .dat/.u8 suffix) of dir
 * (NULL = ZR_FORTUNES_DIR), concatenated in sorted name order, byte tokens.
 * A missing directory gives ZR_ERR_IO telling to run `make setup`.
 */
zr_status zr_dataset_load_fortunes(zr_dataset *ds, const char *dir);
/* From memory (copied). */
zr_status zr_dataset_from_tokens(zr_dataset *ds, const uint16_t *tokens, size_t n, int vocab);
void zr_dataset_free(zr_dataset *ds);

/* ---- loader ----------------------------------------------------------------- */

typedef enum zr_split { ZR_SPLIT_TRAIN, ZR_SPLIT_VAL } zr_split;

typedef struct zr_loader {
    const uint16_t *tokens; /* borrowed from the dataset */
    size_t begin, end;      /* the split, [begin, end) */
    int B, T, rank, world;
    size_t batches_per_epoch; /* global batches that fit in the split */
    uint64_t position;        /* global batches consumed */
} zr_loader;

/*
 * Both splits must hold at least one global batch (world * B * T + 1
 * tokens); otherwise ZR_ERR_INVALID says how many tokens are missing.
 */
zr_status zr_loader_init(zr_loader *l, const zr_dataset *ds, zr_split split, int B, int T,
                         int rank, int world);

/*
 * This rank's slice of the next global batch: inputs and targets, B * T ints
 * each (targets are the inputs shifted by one). Wraps around at the end of
 * the split, always in the same order.
 */
void zr_loader_next(zr_loader *l, int *inputs, int *targets);

uint64_t zr_loader_position(const zr_loader *l);
void zr_loader_seek(zr_loader *l, uint64_t position);
/* Global batches in one pass over the split. */
size_t zr_loader_batches_per_epoch(const zr_loader *l);

#endif /* ZR_DATA_H */
