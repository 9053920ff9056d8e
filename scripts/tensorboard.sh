#!/usr/bin/env bash
# TensorBoard with the suite's terminal: the same command line as
# `tensorboard`, its own lines only. Started plainly, TensorBoard loads
# TensorFlow, whose C++ start-up notes (`I0000 ...`, `E0000 ... failed call
# to cuInit` on a machine without a GPU driver) read like errors; here they
# go through the trainer's filter (training/runtime/process.py). TF_CPP_MIN_LOG_LEVEL=0
# shows everything.
#
#   bash scripts/tensorboard.sh --logdir=./models_cifar10
set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# A --logdir with no summaries yet shows an empty page: say so once.
logdir=""
for ((i = 1; i <= $#; i++)); do
  case ${!i} in
    --logdir=*) logdir=${!i#--logdir=} ;;
    --logdir) j=$((i + 1)); logdir=${!j:-} ;;
  esac
done
if [ -n "$logdir" ] && [ -z "$(find "$logdir" -name 'events.out.tfevents.*' -print -quit 2> /dev/null)" ]; then
  echo "tensorboard.sh: no summaries in --logdir=$logdir yet: the page stays empty until the chief or the evaluator writes there (the tasks' --train_dir)" >&2
fi
# sys.path: the checkout (for training/), not the current folder, where a
# folder named tensorboard would take TensorBoard's place.
exec "${PYTHON:-python3}" -c '
import sys
sys.path[:] = [sys.argv.pop(1)] + [p for p in sys.path if p]
from training.runtime import process
process.start()
from tensorboard import main
sys.argv[0] = "tensorboard"
main.run_main()
' "$root" "$@"
