/*
 * fop_rate: see rma_common.c.
 *
 *   fop_rate [-m [MIN:]MAX] [-i ITERS] [-x WARMUP] [-t SECONDS] [-f]
 */
#include "common.c"
#define RMA_OP FOP_RATE
#include "rma_common.c"
