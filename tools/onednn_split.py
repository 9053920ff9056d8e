#!/usr/bin/env python3
"""Where a training step's time goes, oneDNN primitive by primitive: the
trainer's single process beside PyTorch's peer (tools/torch_peer.py), on
this CPU or on the instruction set --isa allows.

Both call oneDNN for the convolutions (and TensorFlow for BatchNorm and the
pools too); ONEDNN_VERBOSE=1 makes oneDNN print each primitive it runs and
its time. Each side trains --steps (the first half a warmup, left out);
the table sums each primitive's time a step, the two sides' rows matched
by kind, direction and shape, and beside them each side's wall time a
step, whose rest is outside oneDNN (the framework, other kernels, input).

TensorFlow runs at one inter-op thread here (TF_NUM_INTEROP_THREADS=1): with
two, a layer's two gradients run at once, each timed with the other's
threads in its time, and the sum would count some time twice.

  python3 tools/onednn_split.py --data_dir=DIR
  python3 tools/onednn_split.py --data_dir=DIR --isa=avx2   # as on a Zen 3
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile

TOOLS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TOOLS)
sys.path.insert(0, ROOT)
from training.runtime import progress  # pylint: disable=g-import-not-at-top,wrong-import-position


def parse_args(argv):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--data_dir', required=True)
  parser.add_argument('--steps', type=int, default=40,
                      help='steps each side trains, half of them a warmup')
  parser.add_argument('--batch_size', type=int, default=128)
  parser.add_argument('--isa', choices=['native', 'avx2', 'avx512_core'],
                      default='native', help="the widest instructions "
                      "oneDNN and PyTorch's kernels may use (default: the "
                      "CPU's)")
  args = parser.parse_args(argv)
  if args.steps < 4:
    parser.error('--steps must be 4 or more, got %d' % args.steps)
  return args


def environment(isa):
  """Both sides' environment: oneDNN's lines, and the instruction set."""
  env = dict(os.environ, ONEDNN_VERBOSE='1', TF_NUM_INTEROP_THREADS='1')
  if isa != 'native':
    env.update(ONEDNN_MAX_CPU_ISA=isa.upper(), ATEN_CPU_CAPABILITY=(
        'avx2' if isa == 'avx2' else 'avx512'))
  return env


def primitives(lines, steps):
  """{(kind, direction, shape): [implementation, ms a step]} of the oneDNN
  lines of the second half of `steps` steps (its primitives' calls split
  evenly over the steps, the warmup's dropped)."""
  calls = collections.defaultdict(list)
  for line in lines:
    fields = line.split(',')
    if len(fields) < 12 or fields[:4] != ['onednn_verbose', 'v1',
                                          'primitive', 'exec']:
      continue
    try:
      calls[(fields[5], fields[7], fields[-2])].append(
          (fields[6], float(fields[-1])))
    except ValueError:
      continue
  measured = steps - steps // 2
  table = {}
  for key, times in calls.items():
    kept = times[len(times) * (steps // 2) // steps:]
    table[key] = [kept[-1][0], sum(t for _, t in kept) / measured]
  return table


def run_trainer(args, env, work):
  """(oneDNN table, wall ms a step of the second half) of one process."""
  out = subprocess.run(
      [sys.executable, os.path.join(ROOT, 'train_distributed.py'),
       '--ps_hosts=', '--data_dir=' + args.data_dir, '--train_dir=' + work,
       '--max_steps=%d' % args.steps, '--batch_size=%d' % args.batch_size,
       '--log_frequency=1'], env=env, capture_output=True, text=True,
      check=True)
  text = out.stdout + out.stderr
  times = [l.time.timestamp() for l in progress.parse(text)]
  half = times[len(times) // 2:]
  wall = 1e3 * (half[-1] - half[0]) / (len(half) - 1)
  return primitives(text.splitlines(), args.steps), wall


def run_peer(args, env):
  """(oneDNN table, wall ms a step after the warmup) of PyTorch's peer."""
  out = subprocess.run(
      [sys.executable, os.path.join(TOOLS, 'torch_peer.py'),
       '--data_dir=' + args.data_dir, '--batch_size=%d' % args.batch_size,
       '--warmup_steps=%d' % (args.steps // 2),
       '--steps=%d' % (args.steps - args.steps // 2)],
      env=env, capture_output=True, text=True, check=True)
  text = out.stdout + out.stderr
  measured = json.loads([l for l in text.splitlines()
                         if l.startswith('{')][-1])
  return (primitives(text.splitlines(), args.steps),
          1e3 * args.batch_size / measured['images_per_sec'])


def table(ours, theirs):
  """Markdown: the rows side by side, the biggest first, and the sums."""
  (tf_rows, tf_wall), (pt_rows, pt_wall) = ours, theirs
  out = ['| oneDNN primitive (ms a step) | shape | TensorFlow | PyTorch | '
         'TensorFlow / PyTorch |', '|---|---|---|---|---|']
  keys = sorted(set(tf_rows) | set(pt_rows), key=lambda k: -max(
      tf_rows.get(k, ['', 0])[1], pt_rows.get(k, ['', 0])[1]))
  for kind, direction, shape in keys:
    a, b = (tf_rows.get((kind, direction, shape), ['', 0.0])[1],
            pt_rows.get((kind, direction, shape), ['', 0.0])[1])
    if max(a, b) < 0.05:
      continue
    out.append('| %s %s | %s | %.2f | %.2f | %s |' % (
        kind, direction if direction != 'undef' else '', shape, a, b,
        '%.2f' % (a / b) if b else ''))
  in_tf = sum(v for _, v in tf_rows.values())
  in_pt = sum(v for _, v in pt_rows.values())
  out += ['| all of oneDNN | | %.1f | %.1f | %.2f |' % (in_tf, in_pt,
                                                        in_tf / in_pt),
          '| the step, wall | | %.1f | %.1f | %.2f |' % (tf_wall, pt_wall,
                                                         tf_wall / pt_wall),
          '| outside oneDNN | | %.1f | %.1f | |' % (tf_wall - in_tf,
                                                    pt_wall - in_pt)]
  return '\n'.join(out)


def main(argv=None):
  args = parse_args(argv)
  env = environment(args.isa)
  with tempfile.TemporaryDirectory(prefix='onednn-split-') as work:
    ours = run_trainer(args, env, work)
  print(table(ours, run_peer(args, env)))
  return 0


if __name__ == '__main__':
  sys.exit(main())
