"""ps 0's CPU a worker's step, of two checkouts in interleaved rounds.

    git worktree add /tmp/before d339a85
    python3 tools/ps_cpu.py --data_dir=DIR --checkouts=/tmp/before,.

Each round runs 1 ps + --workers synchronous workers of each checkout on
this machine, one after the other, and reads the ps's CPU time
(/proc/PID/stat, user and system) when the chief's progress line first
reaches --from_step and --to_step: the CPU between, over the worker steps
between (updates x workers). Prints each run, each checkout's median, and
the ratio of each checkout to the first within each round: the machine
drifts from minute to minute, so only ratios within a round compare.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, 'scripts'))  # The planner's calibration.
from calibrate_planner import cpu_ms  # pylint: disable=wrong-import-position
from training.cluster import ports  # pylint: disable=wrong-import-position

STEP = re.compile(r': step (\d+),')


def one_run(*, checkout, args, work):
  """ps 0's CPU ms a worker's step in one run of checkout."""
  found = ports.free_ports(1 + args.workers)
  common = ['--ps_hosts=localhost:%d' % found[0],
            '--worker_hosts=' + ','.join('localhost:%d' % p
                                         for p in found[1:]),
            '--data_dir=' + args.data_dir,
            '--train_dir=' + tempfile.mkdtemp(dir=work),
            '--batch_size=%d' % args.batch_size, '--intra_op_threads=1',
            '--max_steps=%d' % (args.to_step + 20), '--log_frequency=10']
  trainer = [sys.executable, os.path.join(checkout, 'train_distributed.py')]
  tasks = [subprocess.Popen(trainer + ['--job_name=ps', '--task_index=0'] +
                            common, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)]
  for i in range(args.workers):
    tasks.append(subprocess.Popen(
        trainer + ['--job_name=worker', '--task_index=%d' % i] + common,
        stdout=subprocess.PIPE if i == 0 else subprocess.DEVNULL,
        stderr=subprocess.STDOUT, text=True))
  marks = []
  try:
    for line in tasks[1].stdout:
      match = STEP.search(line)
      if match and int(match.group(1)) >= (args.to_step if marks
                                           else args.from_step):
        marks.append((int(match.group(1)), cpu_ms(tasks[0].pid)))
        if len(marks) == 2:
          break
    for _ in tasks[1].stdout:
      pass  # The rest of the chief's lines, so that it never blocks.
    codes = [t.wait(timeout=600) for t in tasks]
  finally:
    for t in tasks:
      if t.poll() is None:
        t.kill()
  if any(codes) or len(marks) < 2:
    sys.exit('a run of %s failed: exit codes %s' % (checkout, codes))
  (first, start), (last, end) = marks
  return (end - start) / ((last - first) * args.workers)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--data_dir', required=True)
  parser.add_argument('--checkouts', required=True,
                      help='comma-separated checkouts, the first the base')
  parser.add_argument('--workers', type=int, default=4)
  parser.add_argument('--batch_size', type=int, default=32)
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--from_step', type=int, default=30)
  parser.add_argument('--to_step', type=int, default=180)
  args = parser.parse_args(argv)
  checkouts = [os.path.abspath(c) for c in args.checkouts.split(',')]
  results = [[] for _ in checkouts]  # By position: one may come twice.
  with tempfile.TemporaryDirectory(prefix='ps_cpu_') as work:
    for round_ in range(args.rounds):
      for checkout, ms in zip(checkouts, results):
        ms.append(one_run(checkout=checkout, args=args, work=work))
        print('round %d, %s: %.2f ms of ps 0 a worker step' % (
            round_, checkout, ms[-1]), flush=True)
  base = results[0]
  for checkout, ms in zip(checkouts, results):
    print('%s: median %.2f ms (%s); x the first, by round: %s' % (
        checkout, statistics.median(ms), ', '.join('%.2f' % m for m in ms),
        ', '.join('%.2f' % (m / b) for m, b in zip(ms, base))))


if __name__ == '__main__':
  main()
