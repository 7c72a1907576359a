/* bench_leave.h - `dsinfer bench layer --leave-out`: backend ops replaced by no-ops, by name, so
 * that a decode step timed without them gives their cost inside the recorded step (the device
 * notes' "time variants that leave one stage out"). The step's numbers are then garbage; only
 * its time means anything. */
#ifndef DSI_TOOLS_BENCH_LEAVE_H
#define DSI_TOOLS_BENCH_LEAVE_H

#include "backend/backend.h"

/* Replace op `name` of *ops by a no-op; -1: no such op (bench_leave_names lists them). */
int bench_leave_set(struct dsi_backend_ops *ops, const char *name);
/* The op names, comma-separated (static storage). */
const char *bench_leave_names(void);

#endif
