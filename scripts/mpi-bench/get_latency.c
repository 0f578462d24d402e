/*
 * get_latency: see rma_common.c.
 *
 *   get_latency [-m [MIN:]MAX] [-i ITERS] [-x WARMUP] [-t SECONDS] [-f]
 */
#include "common.c"
#define RMA_OP GET_LAT
#include "rma_common.c"
