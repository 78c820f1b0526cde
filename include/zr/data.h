/*
 * zr/data.h - training data: llm.c token shards, a byte-level tokenizer, the
 * default fortunes corpus, and a batch loader with distributed sampling.
 *
 * Tokens are uint16 (text, GPT-2 shards) or uint32 (llama-3 shards), as in
 * the file. A zr_dataset is one file or several shards matched by a pattern
 * ('train_*.bin', llm.c's and fineweb's layout), read as one token sequence
 * in sorted name order; shards are mapped read-only, never copied, so a rank
 * holds only the pages it reads. Loaders borrow the dataset. Without a
 * separate validation file the last ZR_VAL_PERCENT percent of the tokens are
 * the validation split, the rest the training split.
 *
 * Distributed sampling: a split is cut into windows of T + 1 tokens (window
 * w starts at token w x T: inputs and their targets); an epoch is every
 * window once, in order or, shuffled, in a permutation drawn from (seed,
 * epoch) alone. The stream of windows continues across epochs; a global
 * batch takes its next world x B windows and rank r the r-th B of them. So W
 * ranks with batch B see exactly the windows one rank with batch W x B sees,
 * in the same order, and the position (windows consumed) is all a checkpoint
 * needs to resume at any world size. Nothing here depends on MPI.
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

/* One file of a dataset: a mapped shard, or tokens in memory (text, fortunes). */
typedef struct zr_data_shard {
    char *path;         /* owned copy of its path ("" for tokens from memory) */
    const void *tokens; /* its tokens, token_bytes each */
    size_t n;           /* its tokens */
    size_t first;       /* the dataset's index of its first token */
    uint32_t max_token; /* the largest token present (0 when empty) */
    void *map;          /* the read-only mapping of the whole file, or NULL */
    size_t map_bytes;
} zr_data_shard;

typedef struct zr_dataset {
    const void *tokens; /* the first shard's tokens: all of them when nshards is 1 */
    int token_bytes;    /* 2 or 4 */
    size_t n;           /* tokens of every shard */
    zr_data_kind kind;
    int vocab;          /* the model's vocabulary: every token is < vocab */
    uint32_t max_token; /* the largest token present (0 when empty) */
    int nshards;
    zr_data_shard *shards; /* owned, in sorted name order */
    void *owned;           /* tokens in memory (text, fortunes, from_tokens), or NULL */
} zr_dataset;

/* The shard holding token i (i < n). */
const zr_data_shard *zr_dataset_shard_of(const zr_dataset *ds, size_t i);

/* Token i (i < n). */
static inline uint32_t zr_dataset_token(const zr_dataset *ds, size_t i)
{
    const void *p = ds->tokens;
    if (ds->nshards > 1) {
        const zr_data_shard *s = zr_dataset_shard_of(ds, i);
        p = s->tokens;
        i -= s->first;
    }
    return ds->token_bytes == 4 ? ((const uint32_t *)p)[i] : ((const uint16_t *)p)[i];
}

/* Tokens [first, first + n) (first + n <= ds->n) as ints, across shards. */
void zr_dataset_read(const zr_dataset *ds, size_t first, size_t n, int *out);

/*
 * The first token >= vocab: 1 with *file (the shard's path, or name for a
 * dataset of one file), *index (in that file) and *token; 0 if none.
 */
int zr_dataset_find_beyond(const zr_dataset *ds, const char *name, uint32_t vocab,
                           const char **file, size_t *index, uint32_t *token);

/* CRC-32C of the tokens' first and last MiB (as bytes, across shards). */
uint32_t zr_dataset_ends_crc(const zr_dataset *ds);
/*
 * CRC-32C of the shards' file names (without directories) in order, 0 for
 * one file: what ranks compare, beside the tokens, to read the same shards.
 */
uint32_t zr_dataset_names_crc(const zr_dataset *ds);

/*
 * Any training file, by what it is: an llm.c token shard is recognised by its
 * header (GPT-2 or llama-3; an unknown version of either, a damaged header or
 * a size that disagrees with the token count is ZR_ERR_FORMAT, never read as
 * text); other llm.c files (model, tokenizer, eval) are refused by name;
 * anything else is byte text if it is text (zr_text_check), else refused. A
 * path that is not a regular file (FIFO, directory, device) is refused before
 * it is opened. vocab_size 0 takes the vocabulary from the kind (256, 50257,
 * 128256); otherwise it must hold every token (zr_dataset_set_vocab).
 * A path with a glob character (*, ? or [) that is not itself a file is a
 * pattern: its matches in sorted order, each an llm.c shard of one kind
 * (headers checked as above; two kinds are refused naming a file of each),
 * or the one file it matches; no match is an error naming the pattern.
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

/* The split a loader reads: ALL is the whole dataset (a separate validation file). */
typedef enum zr_split { ZR_SPLIT_TRAIN, ZR_SPLIT_VAL, ZR_SPLIT_ALL } zr_split;

typedef struct zr_loader {
    const zr_dataset *ds; /* borrowed */
    size_t begin, end;    /* the split, [begin, end) */
    int B, T, rank, world;
    size_t batches_per_epoch; /* global batches that fit in the split */
    uint64_t windows;         /* T + 1-token windows in the split: one epoch */
    uint64_t position;        /* windows consumed (all ranks') */
    int shuffle;              /* 0: windows in order; 1: permuted per epoch */
    uint64_t seed;
} zr_loader;

/*
 * Both splits must hold at least one global batch (world * B * T + 1
 * tokens); otherwise ZR_ERR_INVALID says how many tokens are missing.
 */
zr_status zr_loader_init(zr_loader *l, const zr_dataset *ds, zr_split split, int B, int T, int rank,
                         int world);

/*
 * Windows in a permutation per epoch drawn from (seed, epoch) only (a
 * counter-based bijection: window i of epoch e costs the same at any
 * position); without it, in order.
 */
void zr_loader_shuffle(zr_loader *l, int shuffle, uint64_t seed);

/*
 * This rank's slice of the next global batch: inputs and targets, B * T ints
 * each (row b: the b-th of its windows; targets are the inputs shifted by
 * one). The window stream continues into the next epoch at the end of the
 * split.
 */
void zr_loader_next(zr_loader *l, int *inputs, int *targets);

/* The split's window of index k in the stream (epoch k / windows). */
uint64_t zr_loader_window(const zr_loader *l, uint64_t k);

/* Global batches (of this loader's world x B) consumed, and a seek to one. */
uint64_t zr_loader_position(const zr_loader *l);
void zr_loader_seek(zr_loader *l, uint64_t position);
/* Windows consumed: the position at any world size and batch. */
uint64_t zr_loader_windows(const zr_loader *l);
void zr_loader_seek_windows(zr_loader *l, uint64_t windows);
/* Global batches in one pass over the split. */
size_t zr_loader_batches_per_epoch(const zr_loader *l);

#endif /* ZR_DATA_H */
