#!/bin/bash
# A sweep as a Slurm job array: N shard tasks, then one merge job once all of them succeed.
#
#   sbatch --array=0-7 docs/sweep-slurm.sh docs/sweep-tiny.toml sweeps/tiny     (8 shards)
#
# Each task runs shard K/N of the grid (K = SLURM_ARRAY_TASK_ID + 1, N = the array's size)
# into its own directory on the shared filesystem, on the CPUs Slurm gave it. A task that is
# preempted or times out is simply resubmitted: the sweep skips every case that has a result
# and re-runs only the rest. The last line submits the merge, which waits for every task.
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
# more threads). A divergence exits 1, which is a result, not a failed task: only exit 2 (bad
# input) or a crash fails the task.
status=0
python -m ladder sweep "$grid" --out "$out/shard-$k-of-$n" --shard "$k/$n" -j "$cpus" \
    --threads 1 || status=$?
[ "$status" -le 1 ] || exit "$status"

# The first task submits the merge, held until every task of this array has ended.
if [ "$k" -eq 1 ]; then
    sbatch --dependency="afterany:$SLURM_ARRAY_JOB_ID" --job-name=ladder-sweep-merge \
        --output="%x-%j.log" --wrap="python -m ladder sweep --merge $out/shard-*-of-$n \
        --out $out/report"
fi
