/*
 * reduce_scatter_qgz.c - qgZ, the hierarchical quantized gradient
 * reduce-scatter: INT4 all-to-all inside each node, dequantize-sum-
 * requantize, INT4 all-to-all across nodes, dequantize-sum.
 *
 * W = N*D ranks, rank r = n*D + d. The input is W partitions of count
 * elements; partition p = m*D + j ends on rank p. Tensor-slice reordering
 * packs the hop-1 message for local peer j as the N partitions that local
 * rank j of every node owns, {m*D + j : m = 0..N-1}, so each hop is an
 * all-to-all of equal contiguous blocks. Example N = 2, D = 2 (ranks 0 1 |
 * 2 3), x_p^r = partition p on rank r, Q() = one quantized block:
 *
 *   encode (x/W)   rank0: to j=0 [Q(x0^0) Q(x2^0)]  to j=1 [Q(x1^0) Q(x3^0)]
 *   hop 1 (node)   rank0: [Q(x0^0) Q(x2^0)] [Q(x0^1) Q(x2^1)]   (from ranks 0, 1)
 *                  rank1: [Q(x1^0) Q(x3^0)] [Q(x1^1) Q(x3^1)]
 *   sum, requant   rank0: to node 0 Q(x0^0+x0^1), to node 1 Q(x2^0+x2^1)
 *   hop 2 (cross)  rank0: [Q(x0^0+x0^1) Q(x0^2+x0^3)]            (from ranks 0, 2)
 *   dequant, sum   rank0: out = mean(x0) = sum over the 4 ranks / W
 *
 * The average: mul = 1/W is applied once, at the first quantization (inside
 * zr_quant_encode, before the scales are chosen). Dividing first keeps every
 * partial sum at the magnitude of the mean (no overflow however large W), the
 * scales of both hops describe the values actually sent, and the error
 * feedback residuals of both hops live in the same (averaged) units. Nothing
 * later scales again; DeepSpeed's D-times-too-large result came from dividing
 * by N at the end only.
 *
 * Error per output element (symmetric INT4, quant.h: |x - x'| <= scale):
 *     sum over the W contributions of their hop-1 scale
 *   + sum over the N nodes of the hop-2 scale of that node's partial sum.
 *
 * Degenerate layouts: a hop whose group has one member moves nothing and is
 * skipped together with its quantization (D = 1: each rank quantizes its
 * partitions once and sends them across nodes; N = 1: the hop-1 blocks are
 * summed straight into out; W = 1: out is the input, exactly). Any count
 * works: the codec closes each block with a short group, so no padding and
 * no fallback to the exact path.
 *
 * Pipelining: with cfg->chunks = C > 1 each partition is cut into C chunks
 * at quantization-group boundaries and the hops run chunk by chunk, two chunks
 * in flight per hop, so hop 1 of chunk k+1 travels while hop 2 of chunk k
 * does:
 *
 *   intra  [c0][c1]    [c2]    [c3]
 *   inter      [c0]    [c1]    [c2]    [c3]
 *
 * Chunks end on group boundaries, so every block holds exactly the groups
 * the unchunked run would quantize, and the output is bit-identical for
 * every C.
 *
 * On a device transport the same schedule runs with device buffers: every
 * encode, the fused sum-requantize and the final decode-adds are kernels on
 * the op's codec stream, each hop's exchange follows that stream, and the
 * host only posts and polls (coll_local.c). The error-feedback residuals are
 * then device memory. The kernels run the CPU codec's rules and sum in the
 * same order, so the output and the wire blocks are the CPU path's bytes;
 * the received headers are validated when the op completes.
 */
#include "coll_impl.h"

#include <string.h>

/* chunks in flight per hop: op->req[slot] intra, req[SLOTS + slot] inter */
#define SLOTS 2

/* qgZ's state: two quantized all-to-all hops, pipelined over chunks. */
typedef struct qgz_state {
    zr_quant_params q;
    zr_dtype in_type;
    const void *in;
    size_t count;
    float *out;
    zr_qgz_feedback *fb; /* NULL without error feedback */
    float mul;           /* 1/W, applied at the first quantization */
    int W, D, N, d;      /* world, ranks per node, nodes, my rank in the node */
    size_t groups;       /* quantization groups per partition */
    int chunks;          /* effective chunk count (<= groups) */
    int next_encode;     /* first chunk whose intra hop is not posted yet */
    int next_reduce;     /* first chunk whose intra hop is not reduced yet */
    int next_final;      /* first chunk whose inter hop is not summed yet */
    unsigned char *send1[SLOTS], *recv1[SLOTS];
    unsigned char *send2[SLOTS], *recv2[SLOTS];
    const void **blocks; /* D pointers for zr_quant_sum_requant (zr_coll_local.ptr_array) */
} qgz_state;

_Static_assert(sizeof(qgz_state) <= ZR_COLL_STATE_BYTES, "qgZ state fits in an op");
_Static_assert(2 * SLOTS <= (int)(sizeof((zr_coll_op *)0)->req / sizeof(zr_request)),
               "an op has a request for every chunk in flight");

/* Elements [*lo, *lo + *len) of every partition of count (groups of G) form chunk k. */
static void chunk_span(size_t groups, int chunks, size_t G, size_t count, int k, size_t *lo,
                       size_t *len)
{
    size_t g0 = groups * (size_t)k / (size_t)chunks;
    size_t g1 = groups * (size_t)(k + 1) / (size_t)chunks;
    size_t hi = g1 * G < count ? g1 * G : count;
    *lo = g0 * G;
    *len = hi - *lo;
}

static void chunk_range(const qgz_state *q, int k, size_t *lo, size_t *len)
{
    chunk_span(q->groups, q->chunks, (size_t)q->q.group, q->count, k, lo, len);
}

static const void *input_at(const qgz_state *q, size_t elem)
{
    return (const unsigned char *)q->in + elem * zr_dtype_size(q->in_type);
}

/* Validate the blocks of one hop (peers x per_peer, each of len elements) as they arrived. */
static zr_status check_blocks(zr_comm *c, zr_coll_op *op, zr_group g, const unsigned char *recv,
                              int peers, int per_peer, size_t bytes, size_t len, int add_nonfinite)
{
    qgz_state *q = zr_coll_algo_state(op);
    void *x;
    const zr_coll_local *L = zr_coll_local_of(op, &x);
    zr_coll_check k = {"qgZ", g, 0, bytes, len, q->q, add_nonfinite};
    for (int p = 0; p < peers; p++) {
        k.peer = p;
        for (int b = 0; b < per_peer; b++) {
            const unsigned char *blk = recv + ((size_t)p * (size_t)per_peer + (size_t)b) * bytes;
            ZR_CHECK(L->check(x, c, op, blk, &k));
        }
    }
    return ZR_OK;
}

/* out[lo, lo+len) = sum of the k blocks, decoded in the order given. */
static zr_status sum_blocks(zr_coll_op *op, const void *const *blocks, int k, size_t len,
                            float *out)
{
    void *x;
    const zr_coll_local *L = zr_coll_local_of(op, &x);
    ZR_CHECK(L->decode(x, blocks[0], ZR_DTYPE_F32, out, len));
    for (int j = 1; j < k; j++) {
        ZR_CHECK(L->decode_add(x, blocks[j], out, len));
    }
    return ZR_OK;
}

/* Hop 1 of chunk k: quantize all W partitions in reordered layout, post the node all-to-all. */
static zr_status post_intra(zr_comm *c, zr_coll_op *op, int k)
{
    qgz_state *q = zr_coll_algo_state(op);
    void *x;
    const zr_coll_local *L = zr_coll_local_of(op, &x);
    size_t lo, len;
    chunk_range(q, k, &lo, &len);
    size_t bytes = zr_quant_block_bytes(&q->q, len);
    int slot = k % SLOTS;
    for (int j = 0; j < q->D; j++) {
        for (int m = 0; m < q->N; m++) {
            size_t p = (size_t)m * (size_t)q->D + (size_t)j;
            float *res = q->fb != NULL ? q->fb->intra + p * q->count + lo : NULL;
            unsigned char *dst = q->send1[slot] + ((size_t)j * (size_t)q->N + (size_t)m) * bytes;
            ZR_CHECK(L->encode(x, &q->q, q->in_type, input_at(q, p * q->count + lo), len, q->mul,
                               res, dst));
        }
    }
    return zr_coll_ialltoall(c, op, ZR_GROUP_NODE, ZR_KIND_QGZ, q->send1[slot],
                             (size_t)q->N * bytes, q->recv1[slot], &op->req[slot]);
}

/*
 * After hop 1 of chunk k (or at once when D = 1): build the hop-2 blocks and
 * post the cross all-to-all, or with one node sum straight into out.
 */
static zr_status reduce_chunk(zr_comm *c, zr_coll_op *op, int k)
{
    qgz_state *q = zr_coll_algo_state(op);
    void *x;
    const zr_coll_local *L = zr_coll_local_of(op, &x);
    size_t lo, len;
    chunk_range(q, k, &lo, &len);
    size_t bytes = zr_quant_block_bytes(&q->q, len);
    int slot = k % SLOTS;
    if (q->D > 1) {
        /* with one node these blocks are summed into out: their non-finite groups count */
        ZR_CHECK(
            check_blocks(c, op, ZR_GROUP_NODE, q->recv1[slot], q->D, q->N, bytes, len, q->N == 1));
    }
    for (int m = 0; m < q->N; m++) {
        if (q->D == 1) {
            /* no node peers: my partitions are quantized once, for the cross hop */
            size_t p = (size_t)m;
            float *res = q->fb != NULL ? q->fb->intra + p * q->count + lo : NULL;
            ZR_CHECK(L->encode(x, &q->q, q->in_type, input_at(q, p * q->count + lo), len, q->mul,
                               res, q->send2[slot] + (size_t)m * bytes));
            continue;
        }
        for (int j = 0; j < q->D; j++) {
            q->blocks[j] = q->recv1[slot] + ((size_t)j * (size_t)q->N + (size_t)m) * bytes;
        }
        if (q->N == 1) {
            return sum_blocks(op, q->blocks, q->D, len, q->out + lo);
        }
        float *res = q->fb != NULL ? q->fb->inter + (size_t)m * q->count + lo : NULL;
        ZR_CHECK(L->sum_requant(x, q->blocks, q->D, len, 1.0f, &q->q, res,
                                q->send2[slot] + (size_t)m * bytes));
    }
    return zr_coll_ialltoall(c, op, ZR_GROUP_CROSS, ZR_KIND_QGZ, q->send2[slot], bytes,
                             q->recv2[slot], &op->req[SLOTS + slot]);
}

/* After hop 2 of chunk k: out = sum over nodes in node order. */
static zr_status final_chunk(zr_comm *c, zr_coll_op *op, int k)
{
    qgz_state *q = zr_coll_algo_state(op);
    if (q->N == 1) {
        return ZR_OK; /* reduce_chunk already wrote out */
    }
    size_t lo, len;
    chunk_range(q, k, &lo, &len);
    size_t bytes = zr_quant_block_bytes(&q->q, len);
    int slot = k % SLOTS;
    ZR_CHECK(check_blocks(c, op, ZR_GROUP_CROSS, q->recv2[slot], q->N, 1, bytes, len, 1));
    for (int m = 0; m < q->N; m++) {
        q->blocks[m] = q->recv2[slot] + (size_t)m * bytes;
    }
    return sum_blocks(op, q->blocks, q->N, len, q->out + lo);
}

static zr_status advance(zr_comm *c, zr_coll_op *op, int block)
{
    qgz_state *q = zr_coll_algo_state(op);
    for (;;) {
        int moved = 0, ok = 0, done = 0;
        /* hop 1 of every chunk whose slot is free */
        while (q->next_encode < q->chunks && q->next_encode - q->next_reduce < SLOTS) {
            if (q->D > 1) {
                ZR_CHECK(zr_coll_gate(c, op, ZR_GROUP_NODE, block, &ok));
                if (!ok) {
                    break;
                }
                ZR_CHECK(post_intra(c, op, q->next_encode));
                if (q->next_encode + 1 == q->chunks) {
                    zr_coll_posted_last(op, ZR_GROUP_NODE);
                }
            }
            q->next_encode++;
            moved = 1;
        }
        /* reduce the oldest chunk whose hop 1 is in and whose hop-2 slot is free */
        if (q->next_reduce < q->next_encode && q->next_reduce - q->next_final < SLOTS) {
            ok = 1;
            if (q->N > 1) {
                ZR_CHECK(zr_coll_gate(c, op, ZR_GROUP_CROSS, block, &ok));
            }
            if (ok) {
                ZR_CHECK(zr_coll_progress(c, &op->req[q->next_reduce % SLOTS], block, &done));
            }
            if (ok && done) {
                ZR_CHECK(reduce_chunk(c, op, q->next_reduce));
                q->next_reduce++;
                if (q->next_reduce == q->chunks && q->N > 1) {
                    zr_coll_posted_last(op, ZR_GROUP_CROSS);
                }
                moved = 1;
            }
        }
        /* finish the oldest chunk whose hop 2 is in; block here only if nothing else moved */
        if (q->next_final < q->next_reduce) {
            ZR_CHECK(zr_coll_progress(c, &op->req[SLOTS + q->next_final % SLOTS], block && !moved,
                                      &done));
            if (done) {
                ZR_CHECK(final_chunk(c, op, q->next_final));
                q->next_final++;
                moved = 1;
            }
        }
        if (q->next_final == q->chunks) {
            return zr_coll_finish(op);
        }
        if (!moved && !block) {
            return ZR_OK;
        }
    }
}

static const zr_coll_algo algo = {"qgz", advance};

/* One residual buffer of n elements on dev, zeroed (through the op's local work). */
static zr_status residual_prepare(zr_coll_op *op, const zr_device *dev, float **buf, size_t *have,
                                  size_t n)
{
    void *x;
    const zr_coll_local *L = zr_coll_local_of(op, &x);
    ZR_CHECK(
        zr_device_alloc_at(dev, (void **)buf, (n > 0 ? n : 1) * sizeof(float), __FILE__, __LINE__));
    *have = n;
    return L->zero(x, *buf, (n > 0 ? n : 1) * sizeof(float));
}

/*
 * Residual buffers sized for this call, on the communicator's device (host
 * memory for the MPI transport); (re)allocated zeroed when the size or the
 * device changes.
 */
static zr_status feedback_prepare(zr_comm *c, zr_coll_op *op, zr_qgz_feedback *fb, size_t n_intra,
                                  size_t n_inter)
{
    const zr_device *d = zr_comm_device(c, NULL);
    zr_device dev = d != NULL ? *d : zr_device_cpu();
    if (!zr_device_same(&dev, &fb->dev)) {
        zr_qgz_feedback_free(fb);
        fb->dev = dev;
    }
    if (fb->intra == NULL || fb->n_intra != n_intra) {
        zr_device_free(&fb->dev, fb->intra);
        fb->intra = NULL;
        fb->n_intra = 0;
        ZR_CHECK(residual_prepare(op, &fb->dev, &fb->intra, &fb->n_intra, n_intra));
    }
    if (fb->inter == NULL || fb->n_inter != n_inter) {
        zr_device_free(&fb->dev, fb->inter);
        fb->inter = NULL;
        fb->n_inter = 0;
        ZR_CHECK(residual_prepare(op, &fb->dev, &fb->inter, &fb->n_inter, n_inter));
    }
    return ZR_OK;
}

void zr_qgz_feedback_free(zr_qgz_feedback *fb)
{
    if (fb == NULL) {
        return;
    }
    zr_device_free(&fb->dev, fb->intra);
    zr_device_free(&fb->dev, fb->inter);
    memset(fb, 0, sizeof *fb);
}

zr_qgz_config zr_qgz_config_default(void)
{
    zr_qgz_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.q.bits = 4;
    cfg.q.group = ZR_QUANT_DEFAULT_GROUP;
    cfg.q.scheme = ZR_QUANT_SYM;
    cfg.chunks = 1;
    cfg.error_feedback = 0;
    return cfg;
}

/* W = 1: nothing to reduce and no wire to compress; the mean of one rank is its input. */
static zr_status copy_exact(zr_coll_op *op, zr_dtype in_type, const void *in, size_t count,
                            float *out)
{
    void *x;
    const zr_coll_local *L = zr_coll_local_of(op, &x);
    if (in_type == ZR_DTYPE_BF16) {
        return L->from_bf16(x, out, in, count);
    }
    return L->copy(x, out, in, count * sizeof(float));
}

/* Chunks, block size and workspace of a qgZ of count elements per partition. */
typedef struct qgz_layout {
    size_t groups, bytes, work;
    int chunks, slots, nptr;
} qgz_layout;

static qgz_layout layout(const zr_comm *c, const zr_qgz_config *cfg, size_t count)
{
    int W = c->size[ZR_GROUP_WORLD], D = c->ranks_per_node, N = c->n_nodes;
    qgz_layout L;
    size_t G = (size_t)cfg->q.group;
    L.groups = zr_div_up(count, G);
    L.chunks = cfg->chunks < 1 ? 1 : cfg->chunks;
    if ((size_t)L.chunks > L.groups) {
        L.chunks = (int)L.groups; /* a chunk is at least one quantization group */
    }
    size_t max_len = zr_div_up(L.groups, (size_t)L.chunks) * G;
    max_len = max_len < count ? max_len : count;
    L.bytes = zr_quant_block_bytes(&cfg->q, max_len);
    L.slots = L.chunks < SLOTS ? L.chunks : SLOTS;
    size_t b1 = D > 1 ? zr_coll_span((size_t)W * L.bytes) : 0;
    size_t b2 = N > 1 ? zr_coll_span((size_t)N * L.bytes) : 0;
    L.nptr = D > N ? D : N;
    L.work = zr_coll_span(sizeof(void *) * (size_t)L.nptr) + (size_t)L.slots * 2 * (b1 + b2);
    return L;
}

/* Bytes of workspace the op reserves (layout says what they hold). */
static size_t work_bytes(const zr_comm *c, const zr_qgz_config *cfg, size_t count)
{
    if (c->size[ZR_GROUP_WORLD] == 1 || count == 0) {
        return 0;
    }
    return layout(c, cfg, count).work;
}

zr_coll_cost zr_qgz_cost(const zr_comm *c, const zr_qgz_config *cfg, size_t count)
{
    zr_qgz_config def = zr_qgz_config_default();
    cfg = cfg != NULL ? cfg : &def;
    zr_coll_cost k = {.kind = ZR_KIND_QGZ, .work = work_bytes(c, cfg, count)};
    size_t W = (size_t)c->size[ZR_GROUP_WORLD], D = (size_t)c->ranks_per_node,
           N = (size_t)c->n_nodes;
    if (W == 1 || count == 0) {
        return k; /* a copy */
    }
    qgz_layout L = layout(c, cfg, count);
    for (int i = 0; i < L.chunks; i++) {
        size_t lo, len;
        chunk_span(L.groups, L.chunks, (size_t)cfg->q.group, count, i, &lo, &len);
        size_t bytes = zr_quant_block_bytes(&cfg->q, len);
        if (D > 1) {
            zr_coll_cost_send(c, ZR_GROUP_NODE, N * bytes, 0, &k);
        }
        if (N > 1) {
            zr_coll_cost_send(c, ZR_GROUP_CROSS, bytes, 1, &k);
        }
    }
    /* hop 1 quantizes all W partitions (D = 1: my N), the node sum dequantizes D blocks of each
       of N and requantizes them for hop 2, the final sum dequantizes N blocks */
    k.q_enc = (D > 1 ? W : 0) * count + (N > 1 ? N : 0) * count;
    k.q_dec = (D > 1 ? D * N : 0) * count + (N > 1 ? N : 0) * count;
    k.q_bits = cfg->q.bits;
    return k;
}

/* Fill in q's state of an op begun on c: parameters, and the buffers carved from op->work. */
static zr_status setup(zr_comm *c, const zr_qgz_config *cfg, const qgz_layout *L, zr_dtype in_type,
                       const void *in, size_t count, float *out, zr_qgz_feedback *fb,
                       zr_coll_op *op)
{
    qgz_state *q = zr_coll_algo_state(op);
    void *x;
    const zr_coll_local *loc = zr_coll_local_of(op, &x);
    int W = c->size[ZR_GROUP_WORLD], D = c->ranks_per_node, N = c->n_nodes;
    q->q = cfg->q;
    q->in_type = in_type;
    q->in = in;
    q->count = count;
    q->out = out;
    q->fb = fb;
    q->mul = 1.0f / (float)W;
    q->W = W;
    q->D = D;
    q->N = N;
    q->d = c->rank[ZR_GROUP_NODE];
    q->groups = L->groups;
    q->chunks = L->chunks;
    unsigned char *cur = op->work;
    size_t ptr_bytes = sizeof(void *) * (size_t)L->nptr;
    void *ptrs = NULL;
    ZR_CHECK(loc->ptr_array(op, zr_coll_carve(&cur, ptr_bytes), ptr_bytes, &ptrs));
    q->blocks = ptrs;
    for (int i = 0; i < L->slots; i++) {
        if (D > 1) {
            q->send1[i] = zr_coll_carve(&cur, (size_t)W * L->bytes);
            q->recv1[i] = zr_coll_carve(&cur, (size_t)W * L->bytes);
        }
        if (N > 1) {
            q->send2[i] = zr_coll_carve(&cur, (size_t)N * L->bytes);
            q->recv2[i] = zr_coll_carve(&cur, (size_t)N * L->bytes);
        }
    }
    /* every received block is checked: W per chunk on the node hop, N on the cross hop */
    size_t checks = (size_t)L->chunks * ((D > 1 ? (size_t)W : 0) + (N > 1 ? (size_t)N : 0));
    return loc->expect_checks(x, checks);
}

zr_status zr_qgz_start(zr_comm *c, const zr_qgz_config *cfg, zr_dtype in_type, const void *in,
                       size_t count, float *out, zr_qgz_feedback *fb, zr_coll_op *op)
{
    zr_qgz_config def = zr_qgz_config_default();
    if (cfg == NULL) {
        cfg = &def;
    }
    if (c == NULL) {
        ZR_FAIL(ZR_ERR_INVALID, "qgZ: NULL communicator");
    }
    ZR_CHECK(zr_quant_params_check(&cfg->q));
    if (cfg->chunks < 0) {
        ZR_FAIL(ZR_ERR_INVALID, "qgZ: chunks must be >= 1 (0 means 1), got %d", cfg->chunks);
    }
    if (in_type != ZR_DTYPE_F32 && in_type != ZR_DTYPE_BF16) {
        ZR_FAIL(ZR_ERR_INVALID, "qgZ: input type must be fp32 or bf16, got %d", (int)in_type);
    }
    if (count > 0 && (in == NULL || out == NULL)) {
        ZR_FAIL(ZR_ERR_INVALID, "qgZ: NULL %s buffer", in == NULL ? "input" : "output");
    }
    if (cfg->error_feedback && fb == NULL) {
        ZR_FAIL(ZR_ERR_INVALID, "qgZ: error_feedback is on but no zr_qgz_feedback was passed");
    }
    int W = c->size[ZR_GROUP_WORLD], D = c->ranks_per_node, N = c->n_nodes;
    if (W == 1 || count == 0) {
        qgz_state *none;
        ZR_CHECK(zr_coll_begin(c, op, &algo, 0, (void **)&none));
        zr_status st = copy_exact(op, in_type, in, count, out);
        if (st != ZR_OK) {
            zr_coll_end(op);
            return st;
        }
        return zr_coll_finish(op);
    }
    qgz_layout L = layout(c, cfg, count);
    unsigned pending =
        (D > 1 ? ZR_COLL_BIT(ZR_GROUP_NODE) : 0) | (N > 1 ? ZR_COLL_BIT(ZR_GROUP_CROSS) : 0);
    qgz_state *q;
    ZR_CHECK(zr_coll_begin(c, op, &algo, pending, (void **)&q));
    zr_status st = zr_coll_reserve(op, L.work);
    if (st == ZR_OK && cfg->error_feedback) {
        st = feedback_prepare(c, op, fb, (size_t)W * count, D > 1 && N > 1 ? (size_t)N * count : 0);
    }
    if (st == ZR_OK) {
        st = setup(c, cfg, &L, in_type, in, count, out, cfg->error_feedback ? fb : NULL, op);
    }
    if (st != ZR_OK) {
        zr_coll_end(op);
        return st;
    }
    return zr_coll_kick(c, op);
}
