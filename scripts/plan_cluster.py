#!/usr/bin/env python3
"""How many ps tasks? Predicts a synchronous cluster's step for 1..N ps.

From a worker's step on a fast network, the model's bytes, the link rate,
the number of workers and the transfer dtype, prints the predicted ms per
step and images/s of every ps count, and names the fewest ps tasks within
5% of the best:

  python3 scripts/plan_cluster.py --step_ms=45 --num_workers=32 --link_gbit=10

With --slots=R instead of --num_workers (R worker slots listed, each
update a gradient per slot, as in deploy/k8s.yaml), it plans for all R
running, then gives the images/s of 1..R of them running.

The model (predict_step_ms) is the one the benchmark validates: its
slow-network rows print this prediction beside each measurement
(docs/performance.md). Every task is assumed to have a link of its own of
the same rate, as machines on one switch have.
"""

import argparse
import functools
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from training import process  # pylint: disable=g-import-not-at-top,wrong-import-position

# Bytes on the wire per byte of tensor: TCP/IP and Ethernet headers, and
# gRPC's framing. Measured on the benchmark's emulated links: 723 KB over
# one TCP stream took 1.033x its bytes' time from 30 Mbit/s to 1 Gbit/s.
WIRE_OVERHEAD = 1.033
# How a synchronous step grows with its transfers. The pull crosses the
# busiest link before the forward pass can start: all of it is on the
# critical path. The push runs beside the backward pass: it costs only what
# does not fit beside HIDDEN_SHARE of the fast-network step (the backward
# pass, and the ps tasks' own work). What the push costs: the worker's own
# link once more (OWN_LINK_FACTOR), and a third of the busiest link again
# (BUSIEST_LINK_EXTRA: the workers' pushes arrive at a ps at once, and TCP
# restarts slowly after every pause of a step). The three constants were
# fitted to the benchmark's slow-network runs of 1 and 2 ps + 2 workers,
# float32 and bfloat16, batch 64 and 32, at 30 and 100 Mbit/s: within 3% of
# all seven (docs/performance.md).
BUSIEST_LINK_EXTRA = 0.3
OWN_LINK_FACTOR = 1.0
HIDDEN_SHARE = 0.58
WITHIN = 0.05  # "Within 5% of the best".


@functools.lru_cache(maxsize=None)
def largest_shares(max_ps):
  """{num_ps: the largest share of the model any ps holds} for this
  network, placed and partitioned as the trainer places it (builds the
  model once per ps count)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import cifar10_model  # pylint: disable=g-import-not-at-top
  import train_graph  # pylint: disable=g-import-not-at-top
  from training import placement  # pylint: disable=g-import-not-at-top
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


def busiest_bytes(model_bytes, share, num_workers, dtype_bytes=4):
  """The tensor bytes the busiest link carries each way per step.

  A worker's own link carries the whole model each way (the weights in,
  the gradients out); a ps's link carries its share for every worker.
  """
  return model_bytes * dtype_bytes / 4.0 * max(1.0, num_workers * share)


def transfer_ms(tensor_bytes, mbit):
  """How long tensor_bytes take on a link of mbit Mbit/s, headers and all."""
  return tensor_bytes * WIRE_OVERHEAD * 8 / (mbit * 1e6) * 1e3


def link_ms(model_bytes, share, num_workers, mbit, dtype_bytes=4):
  """The busiest link's transfer, ms each way per step."""
  return transfer_ms(busiest_bytes(model_bytes, share, num_workers,
                                   dtype_bytes), mbit)


def predict_step_ms(step_ms, model_bytes, share, num_workers, mbit,
                    dtype_bytes=4):
  """Predicts a synchronous step, ms: step_ms, the pull, and what of the
  push does not hide beside the step (see BUSIEST_LINK_EXTRA).

  Args:
    step_ms: A worker's step when the network costs nothing.
    model_bytes: The trainable variables' float32 bytes.
    share: The largest share of them one ps holds.
    num_workers: Workers (all synchronous).
    mbit: Every task's link rate, Mbit/s.
    dtype_bytes: Bytes per value on the wire (2: --transfer_dtype=bfloat16).
  """
  busiest = link_ms(model_bytes, share, num_workers, mbit, dtype_bytes)
  own = transfer_ms(model_bytes * dtype_bytes / 4.0, mbit)
  push = BUSIEST_LINK_EXTRA * busiest + OWN_LINK_FACTOR * own
  return step_ms + busiest + max(0.0, push - HIDDEN_SHARE * step_ms)


def plan(step_ms, num_workers, mbit, shares, batch_size, model_bytes,
         dtype_bytes):
  """Returns [(num_ps, the busiest link's tensor MB each way, ms per step,
  images/s, whether a worker's own link is the busiest)]."""
  rows = []
  for num_ps, share in sorted(shares.items()):
    ms = predict_step_ms(step_ms, model_bytes, share, num_workers, mbit,
                         dtype_bytes)
    mb = busiest_bytes(model_bytes, share, num_workers, dtype_bytes) / 1e6
    rows.append((num_ps, mb, ms, num_workers * batch_size * 1e3 / ms,
                 num_workers * share <= 1))
  return rows


def update_ms(step_ms, model_bytes, share, slots, running, mbit,
              dtype_bytes=4):
  """Predicts an update of `slots` gradients made by `running` workers, ms.

  Each of the update's tokens gives one gradient at its global step, and
  the next update's tokens come after it: the workers make the gradients in
  rounds, slots // running of every worker, then one of the slots % running
  left (the others wait). Each round is predict_step_ms of its workers.
  """
  full, rest = divmod(slots, running)
  ms = full * predict_step_ms(step_ms, model_bytes, share, running, mbit,
                              dtype_bytes)
  if rest:
    ms += predict_step_ms(step_ms, model_bytes, share, rest, mbit,
                          dtype_bytes)
  return ms


def running_rows(step_ms, slots, mbit, share, batch_size, model_bytes,
                 dtype_bytes):
  """Returns [(workers running, ms per update, updates/s, images/s)] for
  1..slots of them, every update taking a gradient per slot."""
  times = [update_ms(step_ms, model_bytes, share, slots, running, mbit,
                     dtype_bytes) for running in range(1, slots + 1)]
  return [(running, ms, 1e3 / ms, slots * batch_size * 1e3 / ms)
          for running, ms in enumerate(times, 1)]


def fewest_within(rows, within=WITHIN):
  """The fewest ps tasks whose images/s are within `within` of the best."""
  best = max(r[3] for r in rows)
  return next(r[0] for r in rows if r[3] >= best * (1 - within))


# The README's "How many ps tasks?" table (--typical): a CPU-class worker
# computes a step of batch 128 in 45 ms (one process on the 2-core machine
# of docs/performance.md: 44-48 ms in its runs); a GPU-class one in 5 ms,
# an assumed figure (no GPU has been measured here).
TYPICAL_WORKERS = (8, 32, 128)
TYPICAL_GBIT = (1, 10, 25)
TYPICAL_STEP_MS = (('CPU-class worker, 45 ms a step', 45.0),
                   ('GPU-class worker, 5 ms a step', 5.0))


def parse_args(argv):
  """The command line; exits with status 2 and one line where it is wrong."""
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--step_ms', type=float,
                      help="a worker's step, ms, when the network costs "
                      'nothing: the sec/batch of a worker on a fast network '
                      '(or of one process on a worker machine, which leaves '
                      "out the ps tasks' own work)")
  parser.add_argument('--num_workers', type=int,
                      help='synchronous workers')
  parser.add_argument('--slots', type=int,
                      help='instead of --num_workers: the worker slots '
                      '--worker_hosts lists, each update taking a gradient '
                      'per slot; also prints the images/s of 1 to SLOTS '
                      'of them running')
  parser.add_argument('--link_gbit', type=float,
                      help="every task's link rate, Gbit/s (0.1: 100 Mbit/s)")
  parser.add_argument('--transfer_dtype', default='float32',
                      choices=['float32', 'bfloat16'],
                      help="the trainer's --transfer_dtype")
  parser.add_argument('--batch_size', type=int, default=128,
                      help='per worker, for images/s (default: %(default)s)')
  parser.add_argument('--max_ps', type=int, default=16,
                      help='the most ps tasks to consider (default: '
                      '%(default)s)')
  parser.add_argument('--model_bytes', type=int,
                      help="another model's trainable float32 bytes, assumed "
                      'spread evenly over the ps (default: this network, '
                      'placed as the trainer places it)')
  parser.add_argument('--plot', metavar='FILE.png',
                      help='also draw the predicted images/s of 1 to '
                      '--num_workers workers with 1, 2, 4, 8 and 16 ps (up to '
                      '--max_ps) into FILE.png')
  parser.add_argument('--typical', action='store_true',
                      help="the README's table: the fewest ps for 8, 32 and "
                      '128 workers on 1, 10 and 25 Gbit/s links (takes no '
                      'other flag but --max_ps)')
  args = parser.parse_args(argv)
  problem = usage_problem(args)
  if problem:
    print('Error: %s' % problem, file=sys.stderr)
    sys.exit(2)
  return args


def usage_problem(args):
  """What is wrong with the command line, in a few words; None if nothing."""
  if args.typical:
    given = [n for n in ('step_ms', 'num_workers', 'slots', 'link_gbit',
                         'model_bytes') if getattr(args, n) is not None]
    given += ['plot'] if args.plot else []
    if given or args.batch_size != 128 or args.transfer_dtype != 'float32':
      return ('--typical prints the README\'s table for its own clusters; '
              'drop --%s, or drop --typical' % (
                  given[0] if given else 'batch_size/--transfer_dtype'))
    needed = []
  elif args.slots is not None and args.num_workers is not None:
    return ('--slots=%d plans 1 to %d workers running; drop --num_workers'
            % (args.slots, args.slots))
  else:
    needed = ['step_ms', 'num_workers' if args.slots is None else 'slots',
              'link_gbit']
  for name in needed + ['batch_size', 'max_ps'] + (
      ['model_bytes'] if args.model_bytes is not None else []):
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
  out = ['Predicted: %d synchronous workers at batch %d, %s links, %s '
         "transfers, a worker's step %g ms on a fast network." % (
             args.num_workers, args.batch_size, gbit_name(args.link_gbit),
             args.transfer_dtype, args.step_ms), '',
         "| ps tasks | busiest link's tensors, MB each way per step | "
         'ms per step | images/s | x 1 ps |', '|---|---|---|---|---|']
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


# The ps counts --plot draws (those up to --max_ps).
PLOT_PS = (1, 2, 4, 8, 16)


def workers_series(step_ms, max_workers, mbit, shares, batch_size,
                   model_bytes, dtype_bytes):
  """{num_ps: [predicted images/s of 1..max_workers workers]}, for PLOT_PS
  within shares."""
  return {num_ps: [n * batch_size * 1e3 / predict_step_ms(
      step_ms, model_bytes, shares[num_ps], n, mbit, dtype_bytes)
                   for n in range(1, max_workers + 1)]
          for num_ps in PLOT_PS if num_ps in shares}


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
                    network_bytes(), 4)
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
  dtype_bytes = 2 if args.transfer_dtype == 'bfloat16' else 4
  if args.slots:
    args.num_workers = args.slots  # The ps table: every slot running.
  rows = plan(args.step_ms, args.num_workers, args.link_gbit * 1000, shares,
              args.batch_size, args.model_bytes, dtype_bytes)
  print(markdown(args, rows))
  if args.slots:
    num_ps = fewest_within(rows)
    print()
    print(running_markdown(args, num_ps, running_rows(
        args.step_ms, args.slots, args.link_gbit * 1000, shares[num_ps],
        args.batch_size, args.model_bytes, dtype_bytes)))
  if args.plot:
    plot_workers(workers_series(args.step_ms, args.num_workers,
                                args.link_gbit * 1000, shares,
                                args.batch_size, args.model_bytes,
                                dtype_bytes),
                 "batch %d, %s links, %s transfers, a worker's step %g ms" % (
                     args.batch_size, gbit_name(args.link_gbit),
                     args.transfer_dtype, args.step_ms), args.plot)
    print('Wrote %s' % args.plot)
  return 0


if __name__ == '__main__':
  process.start()  # Before TensorFlow loads (largest_shares loads it).
  sys.exit(main())
