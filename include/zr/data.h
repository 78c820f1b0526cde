/*
 * zr/data.h - training data: llm.c token shards, a byte-level tokenizer, the
 * default fortunes corpus, and a batch loader with distributed sampling.
 *
 * Tokens are uint16 (text, GPT-2 shards) or uint32 (llama-3 shards), as in
 * the file. A zr_dataset owns one token array; loaders borrow it. The last
 * ZR_VAL_PERCENT percent of the tokens are the validation split, the rest
 * the training split.
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

/*
 * llm.c's token shards (dev/data/data_common.py): a header of 256 int32
 * (magic, version, token count, zeros) and then the tokens, uint16 for
 * GPT-2 and uint32 for llama-3.
 */
#define ZR_SHARD_HEADER_INTS    256
#define ZR_SHARD_MAGIC          20240520 /* GPT-2 */
#define ZR_SHARD_VERSION        1
#define ZR_SHARD_LLAMA3_MAGIC   20240801
#define ZR_SHARD_LLAMA3_VERSION 7
#define ZR_GPT2_VOCAB           50257
#define ZR_LLAMA3_VOCAB         128256
#define ZR_BYTE_VOCAB           256
/* Largest vocabulary zr accepts (zr.model.vocab_size; also the model's bound). */
#define ZR_VOCAB_MAX    (1 << 24)
#define ZR_VAL_PERCENT  5
#define ZR_FORTUNES_DIR "/usr/share/games/fortunes"

/* What a data file holds. */
typedef enum zr_data_kind {
    ZR_DATA_TEXT,   /* UTF-8 text through the byte tokenizer (uint16 tokens < 256) */
    ZR_DATA_GPT2,   /* llm.c GPT-2 shard: uint16 tokens, vocabulary 50257 */
    ZR_DATA_LLAMA3, /* llm.c llama-3 shard: uint32 tokens, vocabulary 128256 */
} zr_data_kind;

/* "text", "llm.c GPT-2 shard", "llm.c llama-3 shard". */
const char *zr_data_kind_name(zr_data_kind kind);

/* ---- shards ----------------------------------------------------------------- */

/*
 * Writes an llm.c token shard of kind (GPT-2: tokens are uint16_t, llama-3:
 * uint32_t) atomically (temporary file, fsync, rename).
 */
zr_status zr_shard_write_kind(const char *path, zr_data_kind kind, const void *tokens, size_t n);
/* A GPT-2 shard. */
zr_status zr_shard_write(const char *path, const uint16_t *tokens, size_t n);

/* ---- byte tokenizer ------------------------------------------------------- */

/* One token per byte (V = 256). */
void zr_bytes_encode(const void *text, size_t bytes, uint16_t *tokens);
/* Tokens >= 256 become '?'. */
void zr_bytes_decode(const uint16_t *tokens, size_t n, char *text);

/*
 * Whether bytes are text: valid UTF-8 (no overlong forms, surrogates or code
 * points above U+10FFFF, no sequence cut at the end) without NUL bytes.
 * Returns -1 if so, else the offset of the first offending byte.
 */
long long zr_text_check(const void *bytes, size_t n);

/* ---- datasets --------------------------------------------------------------- */

typedef struct zr_dataset {
    void *tokens;    /* owned, zr_alloc'd: uint16_t or uint32_t (token_bytes) per token */
    int token_bytes; /* 2 or 4 */
    size_t n;
    zr_data_kind kind;
    int vocab;          /* the model's vocabulary: every token is < vocab */
    uint32_t max_token; /* the largest token present (0 when empty) */
} zr_dataset;

/* Token i (i < n). */
static inline uint32_t zr_dataset_token(const zr_dataset *ds, size_t i)
{
    return ds->token_bytes == 4 ? ((const uint32_t *)ds->tokens)[i]
                                : ((const uint16_t *)ds->tokens)[i];
}

/*
 * Any training file, by what it is: an llm.c token shard is recognised by its
 * header (GPT-2 or llama-3; an unknown version of either, a damaged header or
 * a size that disagrees with the token count is ZR_ERR_FORMAT, never read as
 * text); other llm.c files (model, tokenizer, eval) are refused by name;
 * anything else is byte text if it is text (zr_text_check), else refused. A
 * path that is not a regular file (FIFO, directory, device) is refused before
 * it is opened. vocab_size 0 takes the vocabulary from the kind (256, 50257,
 * 128256); otherwise it must hold every token (zr_dataset_set_vocab).
 */
zr_status zr_dataset_load(zr_dataset *ds, const char *path, int vocab_size);
/* Only an llm.c shard (GPT-2 or llama-3); vocabulary from its kind. */
zr_status zr_dataset_load_shard(zr_dataset *ds, const char *path);
/* Only text (valid UTF-8 without NUL), byte tokens, vocab 256. */
zr_status zr_dataset_load_text(zr_dataset *ds, const char *path);
/*
 * The default corpus: the plain fortune files (no .dat/.u8 suffix) of dir
 * (NULL = ZR_FORTUNES_DIR), concatenated in sorted name order, byte tokens.
 * A missing directory gives ZR_ERR_IO telling to run `make setup`.
 */
zr_status zr_dataset_load_fortunes(zr_dataset *ds, const char *dir);
/* From memory (copied), kind text if vocab <= 256 else GPT-2. */
zr_status zr_dataset_from_tokens(zr_dataset *ds, const uint16_t *tokens, size_t n, int vocab);
/*
 * The model's vocabulary for this data (zr.model.vocab_size): 0 keeps the
 * kind's; otherwise 1 <= vocab_size <= ZR_VOCAB_MAX. Either way every token
 * must be below it, else ZR_ERR_INVALID names name (the file), the token and
 * its position, and the key.
 */
zr_status zr_dataset_set_vocab(zr_dataset *ds, const char *name, int vocab_size);
void zr_dataset_free(zr_dataset *ds);

/* ---- loader ----------------------------------------------------------------- */

typedef enum zr_split { ZR_SPLIT_TRAIN, ZR_SPLIT_VAL } zr_split;

typedef struct zr_loader {
    const void *tokens; /* borrowed from the dataset */
    int token_bytes;    /* 2 or 4 */
    size_t begin, end;  /* the split, [begin, end) */
    int B, T, rank, world;
    size_t batches_per_epoch; /* global batches that fit in the split */
    uint64_t position;        /* global batches consumed */
} zr_loader;

/*
 * Both splits must hold at least one global batch (world * B * T + 1
 * tokens); otherwise ZR_ERR_INVALID says how many tokens are missing.
 */
zr_status zr_loader_init(zr_loader *l, const zr_dataset *ds, zr_split split, int B, int T, int rank,
                         int world);

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
