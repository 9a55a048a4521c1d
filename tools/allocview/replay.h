/* replay.h — allocview's `replay` (replay.c) and `import` (import.c) commands.
 *
 *  replay  runs a trace's request sequence against cualloc's own heap (the static library, never
 *          the recorder) on the sim device without host backing, under one or more
 *          configurations, and reports the peaks, the OOMs and optionally the smallest capacity
 *          on which the whole sequence completes (DESIGN.md decision 9).
 *  import  converts a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot) into a cualloc
 *          trace, so every allocview command — replay above all — works on PyTorch jobs.
 *  export  the reverse (export.c): a trace as a PyTorch memory snapshot for PyTorch's viewer.
 *
 * Both take argv[0] = the command's name and parse their own options; they return allocview's
 * exit statuses (0 ok, 1 usage, 2 unreadable input, 3 corrupt input after a readable prefix).
 */
#ifndef CUALLOC_REPLAY_H
#define CUALLOC_REPLAY_H

#include <stdbool.h>
#include <stdint.h>

int av_cmd_replay(int argc, char **argv);
int av_cmd_import(int argc, char **argv);
int av_cmd_export(int argc, char **argv);

#endif
