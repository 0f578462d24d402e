/*
 * get_bw: see rma_common.c.
 *
 *   get_bw [-m [MIN:]MAX] [-i ITERS] [-x WARMUP] [-t SECONDS] [-W WINDOW] [-f]
 */
#include "common.c"
#define RMA_OP GET_BW
#include "rma_common.c"
