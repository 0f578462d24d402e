/*
 * put_latency: see rma_common.c.
 *
 *   put_latency [-m [MIN:]MAX] [-i ITERS] [-x WARMUP] [-t SECONDS] [-f]
 */
#include "common.c"
#define RMA_OP PUT_LAT
#include "rma_common.c"
