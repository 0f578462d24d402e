/*
 * acc_rate: see rma_common.c.
 *
 *   acc_rate [-m [MIN:]MAX] [-i ITERS] [-x WARMUP] [-t SECONDS] [-W WINDOW] [-f]
 */
#include "common.c"
#define RMA_OP ACC_RATE
#include "rma_common.c"
