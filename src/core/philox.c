/* philox.c - the linkable Philox4x32-10; the inline functions are in philox.h. */
#include "philox.h"

void dsi_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    dsi_philox4x32_10(ctr, key, out);
}
