#!/bin/bash
# A sweep as a Slurm job array: one task per shard, then one merge job submitted beside it.
#
#   jid=$(sbatch --parsable --array=0-7 docs/sweep-slurm.sh docs/sweep-tiny.toml sweeps/tiny)
#   sbatch --dependency=afterany:$jid --job-name=ladder-sweep-merge \
#       --wrap "python -m ladder sweep --merge sweeps/tiny/shard-* --out sweeps/tiny/report"
#
# The merge is its own submission, not something a task does: it runs once whatever each
# task's exit (afterany), and a requeued task cannot submit it twice. The merge then exits 2
# if a shard left cases missing (listed; resubmit that task, it resumes) or if a case errored.
#
# Each task runs shard K/N of the grid (K = SLURM_ARRAY_TASK_ID + 1, N = the array's size)
# into its own directory on the shared filesystem, on the CPUs Slurm gave it. A task that is
# preempted or times out is simply resubmitted: the sweep skips every case that has a result
# and re-runs only the rest.
#SBATCH --job-name=ladder-sweep
#SBATCH --cpus-per-task=4
#SBATCH --time=02:00:00
#SBATCH --output=%x-%A_%a.log
set -euo pipefail

grid=${1:?usage: sbatch --array=0-N docs/sweep-slurm.sh GRID.toml OUTDIR}
out=${2:?usage: sbatch --array=0-N docs/sweep-slurm.sh GRID.toml OUTDIR}
k=$((SLURM_ARRAY_TASK_ID + 1))
n=$SLURM_ARRAY_TASK_COUNT
cpus=${SLURM_CPUS_PER_TASK:-1}

# -j: one worker per CPU, one thread each (the sweep pins them; tiny cases gain nothing from
# more threads). Exit 1 means a case diverged: a result, so the task succeeds. Exit 2 means
# a case errored (its row says why; the other cases ran) or the input was refused (grid,
# flags, --out): the task fails, so it shows in sacct, and the merge still runs.
status=0
python -m ladder sweep "$grid" --out "$out/shard-$k-of-$n" --shard "$k/$n" -j "$cpus" \
    --threads 1 || status=$?
[ "$status" -le 1 ] || exit "$status"
