/*
 * coll_algo.h - the entry points of the algorithms that sit behind a public
 * dispatcher (coll_dispatch.c picks one by wire type). Each algorithm file
 * includes it for its own prototypes; the op core (coll.c) does not.
 * Algorithms that are the only one for their collective (all-reduce, qgZ,
 * hpZ) are started through zr/coll.h directly.
 */
#ifndef ZR_COLL_ALGO_H
#define ZR_COLL_ALGO_H

#include "coll_impl.h"

/* allgather_direct.c: exact all-gather, fp32 or bf16 on the wire. */
zr_status zr_allgather_direct_start(zr_comm *c, zr_group g, zr_kind kind, zr_wire_type wire,
                                    zr_dtype in_type, const void *in, size_t count,
                                    zr_dtype out_type, void *out, zr_coll_op *op);
zr_coll_cost zr_allgather_direct_cost(const zr_comm *c, zr_group g, zr_kind kind, zr_wire_type wire,
                                      zr_dtype in_type, size_t count, zr_dtype out_type);

/* allgather_qwz.c: qwZ, the quantized all-gather. */
zr_status zr_allgather_qwz_start(zr_comm *c, zr_group g, zr_kind kind, const zr_quant_params *q,
                                 zr_dtype in_type, const void *in, size_t count, zr_dtype out_type,
                                 void *out, zr_coll_op *op);
zr_coll_cost zr_allgather_qwz_cost(const zr_comm *c, zr_group g, zr_kind kind,
                                   const zr_quant_params *q, size_t count);

/* reduce_scatter_direct.c: exact reduce-scatter, fp32 or bf16 on the wire. */
zr_status zr_reduce_scatter_direct_start(zr_comm *c, zr_group g, zr_wire_type wire,
                                         zr_dtype in_type, const void *in, size_t count, float *out,
                                         zr_coll_op *op);
size_t zr_reduce_scatter_direct_work(const zr_comm *c, zr_group g, zr_wire_type wire,
                                     zr_dtype in_type, size_t count);
zr_coll_cost zr_reduce_scatter_direct_cost(const zr_comm *c, zr_group g, zr_wire_type wire,
                                           zr_dtype in_type, size_t count);

#endif /* ZR_COLL_ALGO_H */
