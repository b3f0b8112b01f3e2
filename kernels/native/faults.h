/* Planted faults (ladder/sides/faults.py): each -DNEEDLE_FAULT_... switch builds its own library
   with one known bug, so the harness can prove it locates bugs in the C step. A normal build
   defines none of them. The switches used as values are resolved here; the others guard
   their line in needle_step.c directly (#ifdef NEEDLE_FAULT_...). */
#ifndef NEEDLE_FAULTS_H
#define NEEDLE_FAULTS_H

#ifdef NEEDLE_FAULT_HPOST_ONE
#define HPOST_SCALE 1.0f
#else
#define HPOST_SCALE 2.0f
#endif
#ifdef NEEDLE_FAULT_SINKHORN_19
#define SINKHORN_SHORT 1
#else
#define SINKHORN_SHORT 0
#endif
#ifdef NEEDLE_FAULT_WINDOW_SHORT
#define WINDOW_SHORT 1
#else
#define WINDOW_SHORT 0
#endif

#endif
