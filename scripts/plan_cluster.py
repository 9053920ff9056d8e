#!/usr/bin/env python3
"""How many ps tasks? Predicts a cluster's images/s for 1..N ps.

From a worker's step on a fast network, the model's bytes, the link rate,
the number of workers, the transfer dtype and, where given, the machines'
cores and the steps' spread, prints the predicted ms per step and images/s
of every ps count (synchronous, with a backup worker, or asynchronous), and
names the fewest ps tasks within 5% of the best:

  python3 scripts/plan_cluster.py --step_ms=45 --num_workers=32 --link_gbit=10

With --slots=R instead of --num_workers (R worker slots listed, each
update a gradient per slot, as in deploy/k8s.yaml), it plans for all R
running, then gives the images/s of 1..R of them running. The model:
training/cluster/planner_model.py (its CPU constants: scripts/calibrate_planner.py).
"""

import argparse
import functools
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from training.cluster import planner_model  # pylint: disable=g-import-not-at-top,wrong-import-position
from training.runtime import process  # pylint: disable=g-import-not-at-top,wrong-import-position

WITHIN = 0.05  # "Within 5% of the best".


@functools.lru_cache(maxsize=None)
def largest_shares(max_ps):
  """{num_ps: the largest share of the model any ps holds} for this
  network, placed and partitioned as the trainer places it (builds the
  model once per ps count)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import cifar10_model  # pylint: disable=g-import-not-at-top
  import train_graph  # pylint: disable=g-import-not-at-top
  from training.graph import placement  # pylint: disable=g-import-not-at-top
  tf1 = tf.compat.v1
  shares = {}
  for num_ps in range(1, max_ps + 1):
    cluster = tf.train.ClusterSpec({
        'ps': ['ps%d:1' % i for i in range(num_ps)], 'worker': ['w:1']})
    with tf.Graph().as_default(), tf1.device(train_graph.devices(
        cluster=cluster, task_index=0, num_gpus=0)[1]), tf1.variable_scope(
            '', partitioner=placement.partitioner(num_ps)):
      cifar10_model.inference(tf1.placeholder(tf.float32, [1, 32, 32, 3]))
      loads = [size for _, size in placement.ps_loads(
          tf1.trainable_variables(), num_ps)]
    shares[num_ps] = max(loads) / float(sum(loads))
  return shares


def network_bytes():
  """This network's trainable float32 bytes (cifar10_model.MODEL_BYTES:
  imported here, as it loads TensorFlow, which another model never needs)."""
  import cifar10_model  # pylint: disable=g-import-not-at-top
  return cifar10_model.MODEL_BYTES


def even_shares(max_ps):
  """{num_ps: 1 / num_ps}: a model spread evenly (any other model)."""
  return {p: 1.0 / p for p in range(1, max_ps + 1)}


def plan(step_ms, num_workers, mbit, shares, batch_size, model_bytes,
         dtype_bytes, *, mode='sync', worker_cores=None, ps_cores=None,
         step_cv=0.0):
  """Returns [(num_ps, the busiest link's tensor MB each way, ms per step
  (an update; asynchronous: a worker's step), images/s, whether a worker's
  own link is the busiest)]."""
  rows = []
  for num_ps, share in sorted(shares.items()):
    rate = planner_model.predict_images_per_sec(
        step_ms=step_ms, model_bytes=model_bytes, share=share,
        num_workers=num_workers, num_ps=num_ps, mbit=mbit,
        batch_size=batch_size, mode=mode, worker_cores=worker_cores,
        ps_cores=ps_cores, step_cv=step_cv, dtype_bytes=dtype_bytes)
    examples = num_workers - (mode == 'backup')
    ms = (num_workers if mode == 'async' else examples) * batch_size * 1e3 / (
        rate)
    mb = planner_model.busiest_bytes(model_bytes, share, num_workers,
                                  dtype_bytes) / 1e6
    rows.append((num_ps, mb, ms, rate, num_workers * share <= 1))
  return rows


def fewest_within(rows, within=WITHIN):
  """The fewest ps tasks whose images/s are within `within` of the best."""
  best = max(r[3] for r in rows)
  return next(r[0] for r in rows if r[3] >= best * (1 - within))


# The README's "How many ps tasks?" table (--typical): a CPU-class worker
# computes a step of batch 128 in 45 ms (one process on the 2-core machine
# of docs/scaling.md: 44-48 ms in its runs); a GPU-class one in 5 ms,
# an assumed figure (no GPU has been measured here); every machine of
# AT_SCALE_CORES cores, the RPCs' CPU counted.
TYPICAL_WORKERS = (8, 32, 128)
TYPICAL_GBIT = (1, 10, 25)
TYPICAL_STEP_MS = (('CPU-class worker, 45 ms a step', 45.0),
                   ('GPU-class worker, 5 ms a step', 5.0))


def add_cluster_args(parser):
  """--training, the machines' cores and steps' spread, --at_scale."""
  parser.add_argument('--training', default='sync',
                      choices=['sync', 'backup', 'async'],
                      help='sync: an update a gradient per worker; backup: '
                      'one backup worker; async: --nosync_replicas')
  parser.add_argument('--worker_cores', type=float,
                      help="each worker machine's cores: counts its RPCs' CPU")
  parser.add_argument('--ps_cores', type=float,
                      help="each ps machine's cores: counts ps 0's CPU")
  parser.add_argument('--constants', metavar='FILE.json', help="the RPCs' "
                      'CPU measured here by scripts/calibrate_planner.py')
  parser.add_argument('--step_cv', type=float, default=0.0,
                      help="the spread of a worker's sec/batch (deviation "
                      'over mean): an update waits for the slowest worker')
  parser.add_argument('--at_scale', action='store_true', help='docs/'
                      "scaling.md's table: the fewest ps, the efficiency "
                      'and its bound for 8 to 128 GPU-class workers')


def parse_args(argv):
  """The command line; exits with status 2 and one line where it is wrong."""
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--step_ms', type=float, help="a worker's step, ms, "
                      'when the network costs nothing: the sec/batch of one '
                      'process on a worker machine, or of a worker on a fast '
                      'network')
  parser.add_argument('--num_workers', type=int, help='synchronous workers')
  parser.add_argument('--slots', type=int, help='instead of --num_workers: '
                      'the slots --worker_hosts lists, a gradient a slot an '
                      'update; also the images/s of 1 to SLOTS running')
  parser.add_argument('--link_gbit', type=float,
                      help="every task's link rate, Gbit/s (0.1: 100 Mbit/s)")
  add_cluster_args(parser)
  parser.add_argument('--transfer_dtype', default='float32', choices=[
      'float32', 'bfloat16'], help="the trainer's --transfer_dtype")
  parser.add_argument('--optimizer', default='sgd', choices=['sgd', 'momentum'],
                      help="the trainer's --optimizer: the ps's variables")
  parser.add_argument('--batch_size', type=int, default=128,
                      help='per worker, for images/s (default: %(default)s)')
  parser.add_argument('--max_ps', type=int, default=16, help='most ps tried')
  parser.add_argument('--model_bytes', type=int, help="another model's "
                      'trainable float32 bytes, spread evenly over the ps '
                      '(default: this network, placed as the trainer does)')
  parser.add_argument('--plot', metavar='FILE.png', help='also draw the '
                      'images/s of 1 to --num_workers workers with 1, 2, 4, 8 '
                      'and 16 ps (up to --max_ps) into FILE.png')
  parser.add_argument('--typical', action='store_true', help="the README's "
                      'table: the fewest ps for 8, 32 and 128 workers on 1, '
                      '10 and 25 Gbit/s links (no other flag but --max_ps)')
  args = parser.parse_args(argv)
  problem = usage_problem(args)
  try:
    args.measured_on = args.constants and not problem and (
        planner_model.load_constants(args.constants))
  except (OSError, ValueError) as e:
    problem = '--constants=%s: %s' % (args.constants, e)
  if problem:
    print('Error: %s' % problem, file=sys.stderr)
    sys.exit(2)
  return args


def usage_problem(args):
  """What is wrong with the command line, in a few words; None if nothing."""
  if args.typical or args.at_scale:
    which = '--typical' if args.typical else '--at_scale'
    given = [n for n in ('step_ms', 'num_workers', 'slots', 'link_gbit',
                         'model_bytes', 'worker_cores', 'ps_cores')
             if getattr(args, n) is not None]
    given += ['plot'] if args.plot else []
    given += ['at_scale'] if args.typical and args.at_scale else []
    if given or args.batch_size != 128 or args.transfer_dtype != 'float32' or (
        args.training != 'sync' or args.step_cv or args.optimizer != 'sgd'):
      return ('%s prints %s table for its own clusters; drop --%s, or drop '
              '%s' % (which, 'the README\'s' if args.typical else
                      'docs/scaling.md\'s', given[0] if given else
                      'batch_size/--transfer_dtype/--training/--step_cv/'
                      '--optimizer', which))
    needed = []
  elif args.slots is not None and args.num_workers is not None:
    return ('--slots=%d plans 1 to %d workers running; drop --num_workers'
            % (args.slots, args.slots))
  else:
    needed = ['step_ms', 'num_workers' if args.slots is None else 'slots',
              'link_gbit']
  if not 0 <= args.step_cv < 1:
    return ('--step_cv is the spread of the steps over their mean, from 0 '
            'up to 1 (got %g), e.g. 0.1' % args.step_cv)
  if args.slots is not None and args.training != 'sync':
    return ('--slots plans synchronous updates of a gradient per slot; drop '
            '--training=%s' % args.training)
  for name in needed + ['batch_size', 'max_ps'] + [
      n for n in ('model_bytes', 'worker_cores', 'ps_cores')
      if getattr(args, n) is not None]:
    value = getattr(args, name)
    if value is None or not value > 0:
      return ('--%s must be given and above 0 (got %s), e.g. --step_ms=45 '
              '--num_workers=32 --link_gbit=10' % (name, value))
  folder = os.path.dirname(os.path.abspath(args.plot or '.'))
  if args.plot and not os.path.isdir(folder):
    return '--plot=%s: there is no folder %s; make it, or name another' % (
        args.plot, folder)
  if args.plot and os.path.isdir(args.plot):
    return '--plot=%s is a folder; name a file in it, e.g. %s' % (
        args.plot, os.path.join(args.plot, 'plan.png'))
  return None


def running_markdown(args, num_ps, rows):
  """The plan of 1..--slots workers running, with num_ps ps, as Markdown."""
  out = ['With %d ps, each update %d gradients (%d examples) from the '
         'workers running:' % (num_ps, args.slots,
                               args.slots * args.batch_size), '',
         '| workers running of %d slots | ms per update | updates/s | '
         'images/s | x 1 worker |' % args.slots, '|---|---|---|---|---|']
  for running, ms, updates, rate in rows:
    out.append('| %d | %.1f | %.2f | %.0f | %.2fx |' % (
        running, ms, updates, rate, rate / rows[0][3]))
  idle = [r[0] for r in rows if args.slots % r[0]]
  if idle:
    out += ['', 'With %s running, the last round of each update has fewer '
            'gradients to make than workers: the others wait for the next '
            "update's tokens." % ', '.join(str(n) for n in idle)]
  return '\n'.join(out)


def markdown(args, rows):
  """One plan as a Markdown table and the answer's line."""
  fewest = fewest_within(rows)
  one = rows[0][3]
  cores = ''
  if args.worker_cores or args.ps_cores:
    cores = ' Machines: %s; their RPCs\' CPU as measured on %s.' % (
        ', '.join('%s of %g cores' % (name, c) for name, c in (
            ('workers', args.worker_cores), ('ps', args.ps_cores)) if c),
        args.measured_on or 'a Zen 4 (the default)')
  out = ['Predicted: %d %s at batch %d, %s links, %s '
         "transfers, a worker's step %g ms on a fast network.%s" % (
             args.num_workers, TRAINING_NAMES[args.training],
             args.batch_size, gbit_name(args.link_gbit),
             args.transfer_dtype, args.step_ms, cores), '',
         "| ps tasks | busiest link's tensors, MB each way per step | "
         'ms per %s | images/s | x 1 ps |' % (
             "worker's step" if args.training == 'async' else 'update'),
         '|---|---|---|---|---|']
  for num_ps, mb, ms, rate, _ in rows:
    out.append('| %d | %.2f | %.1f | %.0f | %.2fx |' % (num_ps, mb, ms, rate,
                                                       rate / one))
  best = max(rows, key=lambda r: r[3])
  out += ['', 'Fewest ps tasks within %d%% of the best: %d (%.0f images/s; '
          'the best, %d ps: %.0f).' % (WITHIN * 100, fewest,
                                       rows[fewest - 1][3], best[0], best[3])]
  own = next((r[0] for r in rows if r[4]), None)
  if own:
    out.append("From %d ps on, each worker's own link is the busiest: more "
               'ps tasks cannot shorten the step; a faster link or bfloat16 '
               'transfers can, and a larger batch moves fewer bytes per '
               'image.' % own)
  return '\n'.join(out)


TRAINING_NAMES = {'sync': 'synchronous workers',
                  'backup': 'synchronous workers, one of them a backup,',
                  'async': 'asynchronous workers'}

# docs/scaling.md's table (--at_scale): GPU-class steps of batch 128 on
# machines of 16 cores, every ps and worker on a link of its own, the steps
# spread by 5% (assumed: a GPU's steps vary less than a CPU share's).
AT_SCALE_WORKERS = (8, 32, 128)
AT_SCALE_STEP_MS = (10.0, 50.0)
AT_SCALE_GBIT = (10, 25, 100)
AT_SCALE_CORES = 16
AT_SCALE_CV = 0.05


def at_scale_markdown(shares):
  """Per cluster: the fewest ps within 5% of the best, the efficiency
  against linear (workers x 1 worker + 1 ps) and what bounds the step."""
  out = ['| workers | step | %s |' % ' | '.join(
      gbit_name(g) for g in AT_SCALE_GBIT),
         '|---|---|%s' % ('---|' * len(AT_SCALE_GBIT))]
  cores = dict(worker_cores=AT_SCALE_CORES, ps_cores=AT_SCALE_CORES,
               step_cv=AT_SCALE_CV)
  for workers in AT_SCALE_WORKERS:
    for step_ms in AT_SCALE_STEP_MS:
      cells = []
      for gbit in AT_SCALE_GBIT:
        rows = plan(step_ms, workers, gbit * 1000, shares, 128,
                    network_bytes(), 4, **cores)
        fewest = fewest_within(rows)
        one = plan(step_ms, 1, gbit * 1000, {1: shares[1]}, 128,
                   network_bytes(), 4, **cores)[0][3]
        cells.append('%d ps: %.2f, %s' % (
            fewest, rows[fewest - 1][3] / (workers * one),
            planner_model.bound(step_ms=step_ms, model_bytes=network_bytes(),
                             share=shares[fewest], num_workers=workers,
                             num_ps=fewest, mbit=gbit * 1000, **cores)))
      out.append('| %d | %g ms | %s |' % (workers, step_ms,
                                          ' | '.join(cells)))
  return '\n'.join(out)


# The ps counts --plot draws (those up to --max_ps).
PLOT_PS = (1, 2, 4, 8, 16)


def plot_workers(series, title, path):
  """Images/s against workers, a line per ps count, as a PNG."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(6, 4))
  for num_ps, rates in sorted(series.items()):
    ax.plot(range(1, len(rates) + 1), rates, marker='.',
            label='%d ps' % num_ps)
  ax.set_xlabel('synchronous workers')
  ax.set_ylabel('predicted images/s (all workers)')
  ax.set_ylim(bottom=0)
  ax.set_title(title, fontsize='small')
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize='small', loc='upper left')
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def typical_markdown(shares):
  """The README's table: per cluster, the fewest ps within 5% of the best,
  its images/s and its speed-up over 1 ps."""
  out = ['| workers | links | %s |' % ' | '.join(n for n, _ in TYPICAL_STEP_MS),
         '|---|---|%s' % ('---|' * len(TYPICAL_STEP_MS))]
  for workers in TYPICAL_WORKERS:
    for gbit in TYPICAL_GBIT:
      cells = []
      for _, step_ms in TYPICAL_STEP_MS:
        rows = plan(step_ms, workers, gbit * 1000, shares, 128,
                    network_bytes(), 4, worker_cores=AT_SCALE_CORES,
                    ps_cores=AT_SCALE_CORES)
        fewest = fewest_within(rows)
        cells.append('%d ps: %.0f images/s, %.2fx 1 ps' % (
            fewest, rows[fewest - 1][3], rows[fewest - 1][3] / rows[0][3]))
      out.append('| %d | %s | %s |' % (workers, gbit_name(gbit),
                                       ' | '.join(cells)))
  return '\n'.join(out)


def gbit_name(gbit):
  return '%g Gbit/s' % gbit if gbit >= 1 else '%g Mbit/s' % (gbit * 1000)


def main(argv=None):
  args = parse_args(argv)
  if args.model_bytes is not None:
    shares = even_shares(args.max_ps)
  else:
    shares = largest_shares(args.max_ps)
    args.model_bytes = network_bytes()
  if args.typical:
    print(typical_markdown(shares))
    return 0
  if args.at_scale:
    print(at_scale_markdown(shares))
    return 0
  dtype_bytes = 2 if args.transfer_dtype == 'bfloat16' else 4
  if args.slots:
    args.num_workers = args.slots  # The ps table: every slot running.
  rows = plan(args.step_ms, args.num_workers, args.link_gbit * 1000, shares,
              args.batch_size, args.model_bytes, dtype_bytes,
              mode=args.training, worker_cores=args.worker_cores,
              ps_cores=args.ps_cores, step_cv=args.step_cv)
  print(markdown(args, rows))
  print(planner_model.variables_line(args.model_bytes, shares, fewest_within(
      rows), args.optimizer))
  if args.slots:
    num_ps = fewest_within(rows)
    print()
    print(running_markdown(args, num_ps, planner_model.running_rows(
        args.step_ms, args.slots, args.link_gbit * 1000, shares[num_ps],
        args.batch_size, args.model_bytes, dtype_bytes)))
  if args.plot:
    plot_workers(planner_model.workers_series(args.step_ms, args.num_workers,
                                args.link_gbit * 1000, shares,
                                args.batch_size, args.model_bytes,
                                dtype_bytes, PLOT_PS),
                 "batch %d, %s links, %s transfers, a worker's step %g ms" % (
                     args.batch_size, gbit_name(args.link_gbit),
                     args.transfer_dtype, args.step_ms), args.plot)
    print('Wrote %s' % args.plot)
  return 0


if __name__ == '__main__':
  process.start()  # Before TensorFlow loads (largest_shares loads it).
  sys.exit(main())
