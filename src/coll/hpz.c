/*
 * hpz.c - hpZ, the secondary weight partition: after the forward all-gather
 * every rank keeps the slice of the full weights that belongs to its rank
 * in ZR_GROUP_HPZ, and the backward pass rebuilds the full weights from those
 * slices with an all-gather inside the hpZ group only.
 *
 *   world of 4 = 2 nodes x 2, h = 2 (hpZ group = node), full = [s0 s1]
 *   (each s is count elements; the forward gather left every rank with full)
 *
 *   cut            node 0: rank0 keeps s0, rank1 keeps s1 | node 1: rank2 s0, rank3 s1
 *   gather (hpZ)   node 0: rank0, rank1: [s0 s1]          | node 1: the same
 *                  bytes stay inside each node when h divides the ranks per node
 *
 * The gather is zr_allgather over ZR_GROUP_HPZ accounted as ZR_KIND_HPZ,
 * with any wire: fp32, bf16 or quantized (qwZ inside the node), into a full
 * buffer of either type.
 *
 * Types: the full buffer and the secondary are fp32 or bf16 each. The cut is
 * a copy when they agree (a bf16 gathered unit into a bf16 secondary: the
 * same bits an fp32 unit cut to bf16 would give, since the bf16 unit is its
 * rounding), else one cast.
 *
 * On a device transport both take device buffers: the cut is a copy or a
 * bf16 kernel queued on the stream the communicator follows (it belongs to
 * the caller's sequence of work, not to a collective), the gather is the
 * device all-gather. The cut runs through the local-work table of the
 * communicator's data plane (coll_impl.h, zr_coll_local.cut).
 */
#include "coll_impl.h"

static int is_type(zr_dtype t)
{
    return t == ZR_DTYPE_F32 || t == ZR_DTYPE_BF16;
}

zr_status zr_hpz_cut(const zr_comm *c, zr_dtype full_type, const void *full, size_t count,
                     zr_dtype type, void *secondary)
{
    if (c == NULL || (count > 0 && (full == NULL || secondary == NULL))) {
        ZR_FAIL(ZR_ERR_INVALID, "hpZ cut: NULL communicator or buffer");
    }
    if (!is_type(full_type) || !is_type(type)) {
        ZR_FAIL(ZR_ERR_INVALID,
                "hpZ cut: full and secondary types must be fp32 or bf16, got %d, %d",
                (int)full_type, (int)type);
    }
    const unsigned char *mine = (const unsigned char *)full +
                                (size_t)c->rank[ZR_GROUP_HPZ] * count * zr_dtype_size(full_type);
    zr_device where;
    zr_stream *follow = NULL;
    const zr_coll_local *L = zr_coll_local_for(c, &where, &follow);
    return L->cut(follow, type, secondary, full_type, mine, count);
}

zr_status zr_hpz_gather_start(zr_comm *c, const zr_wire *wire, zr_dtype type, const void *secondary,
                              size_t count, zr_dtype out_type, void *full, zr_coll_op *op)
{
    return zr_allgather_start(c, ZR_GROUP_HPZ, ZR_KIND_HPZ, wire, type, secondary, count, out_type,
                              full, op);
}

zr_status zr_hpz_gather(zr_comm *c, const zr_wire *wire, zr_dtype type, const void *secondary,
                        size_t count, zr_dtype out_type, void *full, zr_coll_op *op)
{
    ZR_CHECK(zr_hpz_gather_start(c, wire, type, secondary, count, out_type, full, op));
    return zr_coll_wait(c, op);
}
