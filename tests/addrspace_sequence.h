/* addrspace_sequence.h — allocations and frees that fragment the expandable pool's address space:
 * with va_factor:2 a 64 MiB device has 128 MiB of it, and after this sequence (found by a random
 * search on the sim device, then shrunk) 39 MiB live leave no free range for the 21 MiB of new
 * chunks ADDRSPACE_REQUEST_MIB needs, although the device has 22 MiB free. One copy for the
 * heap's report (tests/test_oom_report.c, case 9) and the traced scenario
 * (tests/trace_scenarios.c addrspace), which must see the same OOM. */
#ifndef CUALLOC_TESTS_ADDRSPACE_SEQUENCE_H
#define CUALLOC_TESTS_ADDRSPACE_SEQUENCE_H

enum { ADDRSPACE_BLOCKS = 32, ADDRSPACE_REQUEST_MIB = 21 };

/* Step i allocates addrspace_sequence[i].mib MiB as block id, or frees block id where mib is 0. */
static const struct {
    int id, mib;
} addrspace_sequence[] = {{4, 10}, {5, 12},  {6, 7},  {7, 6},   {8, 3},  {9, 11},  {6, 0},   {17, 9},
                          {4, 0},  {9, 0},   {20, 12}, {20, 0}, {5, 0},  {22, 24}, {23, 5},  {17, 0},
                          {7, 0},  {25, 21}, {25, 0}, {27, 19}, {28, 7}, {27, 0}};

#endif
