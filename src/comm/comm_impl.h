/*
 * comm_impl.h - what the files of src/comm share: the bounded wait every
 * transport completes its requests with.
 */
#ifndef ZR_COMM_IMPL_H
#define ZR_COMM_IMPL_H

#include "zr/comm.h"

/*
 * Complete n requests by polling, under the watchdog (comm.h "Bounded
 * waits"). peer[i] is the world rank at the other end of reqs[i] (-1 or a
 * NULL peer: unknown, as for MPI's own collectives); the first nrecv requests
 * are receives. scratch holds n ints (NULL: no progress tracking, the time
 * counts from the start of the wait). what and g name the wait in messages.
 * counter >= 0: the wait is number index among the zr_comm.posted[counter]
 * of this rank, and ends with ZR_ERR_REMOTE (requests left posted) once a
 * notice shows that a rank it waits for never started it; counter < 0:
 * notices are not looked at. Completed requests become MPI_REQUEST_NULL.
 */
zr_status zr_comm_poll(zr_comm *c, MPI_Request *reqs, int n, const int *peer, int nrecv,
                       int *scratch, const char *what, zr_group g, int counter, long long index);

#endif /* ZR_COMM_IMPL_H */
