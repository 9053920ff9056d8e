#!/usr/bin/env python3
"""Measures the suite on this machine, side by side in one run.

Prints Markdown tables and writes the numbers as JSON:
- input pipeline records/s: the trainer's 16-thread queue, tf.data with the
  same decoding, and a numpy decode of the same bytes (an upper bound);
- training images/s, steady state, summed over the workers: one process
  (--ps_hosts=), 1 ps + 1 worker, 1 ps + 2 workers and 2 ps + 2 workers,
  synchronous and asynchronous; 1 ps + 2 synchronous workers on the plain
  graph (--nopack_transfers), beside the packed one; one process and 1 ps +
  2 workers with --mixed_precision; 1 ps + 2 workers with
  --transfer_dtype=bfloat16; TF2's ParameterServerStrategy. Each also as a
  ratio to the single process in the same round; --rounds interleaved
  rounds, the median reported; --only picks some of them;
- startup (launch to the first step, beyond importing TensorFlow) and
  shutdown of 1 ps + 2 synchronous workers;
- bytes a worker moves per step, and their time on 1 and 10 Gb/s links;
- slow networks (root and iproute2): synchronous clusters, every task a
  host of its own, on unlimited links and on links of each --network_rates,
  beside the step scripts/plan_cluster.py predicts; a PNG of images/s
  against the rate. Skipped, saying why, elsewhere.

Absolute numbers depend on the machine and whatever else runs on it; the
ratios, measured minutes apart on the same machine, are what to compare.

  python3 tools/benchmark.py --quick

This module owns the command line and the plan (which runs, in which
order, how many rounds); benchmark_inputs.py measures the input pipelines,
measured_run.py a training run, benchmark_network.py the slow-network
runs, and benchmark_report.py turns it all into tables, a plot and JSON.
"""

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, 'scripts'))  # The planner, the data.
from training.runtime import process  # pylint: disable=g-import-not-at-top,wrong-import-position
if __name__ == '__main__':
  process.start()  # Before TensorFlow loads (see import_seconds).

import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-position

import benchmark_inputs  # pylint: disable=g-import-not-at-top,wrong-import-position
import benchmark_network  # pylint: disable=g-import-not-at-top,wrong-import-position
import benchmark_report  # pylint: disable=g-import-not-at-top,wrong-import-position
import measured_run  # pylint: disable=g-import-not-at-top,wrong-import-position
import cifar10_model  # pylint: disable=g-import-not-at-top,wrong-import-position
import cpu_peak  # pylint: disable=g-import-not-at-top,wrong-import-position
import cpu_profile  # pylint: disable=g-import-not-at-top,wrong-import-position
import make_synthetic_cifar10  # pylint: disable=g-import-not-at-top,wrong-import-position
import plan_cluster  # pylint: disable=g-import-not-at-top,wrong-import-position
from training.graph import precision  # pylint: disable=g-import-not-at-top,wrong-import-position

tf1 = tf.compat.v1
BASELINE = benchmark_report.BASELINE
PEER_ROW = benchmark_report.PEER_ROW
TORCH_ROW = benchmark_report.TORCH_ROW
DDP_ROW = benchmark_report.DDP_ROW
NETWORK_RATES = '10000,1000,100'  # Mbit/s: 10 Gbit/s, 1 Gbit/s, 100 Mbit/s.
# Beside 2 workers, 8 with the same examples a step: 4 times the bytes per
# image, where the planner's model of the busiest link matters most.
NETWORK_WORKERS = '2,8'


class Config(NamedTuple):
  """A training row: its cluster, and the trainer's flags; with peer 'tf2'
  TF2's strategy (tools/tf2_peer.py) and its flags, with 'torch' PyTorch
  (tools/torch_peer.py), num_workers processes."""
  name: str
  num_ps: int
  num_workers: int
  flags: tuple = ()
  peer: str = ''


SYNC_ROW = benchmark_report.SYNC_ROW
CONFIGS = (
    Config(BASELINE, 0, 1),
    Config('single process, mixed precision', 0, 1, ('--mixed_precision',)),
    Config('1 ps + 1 worker', 1, 1),
    Config(SYNC_ROW, 1, 2),
    # The packing turned off, in the same rounds: packed / plain side by side.
    Config(SYNC_ROW + ', plain graph', 1, 2, ('--nopack_transfers',)),
    Config(SYNC_ROW + ', mixed precision', 1, 2, ('--mixed_precision',)),
    Config(SYNC_ROW + ', bfloat16 transfers', 1, 2,
           ('--transfer_dtype=bfloat16',)),
    Config('1 ps + 2 workers, async', 1, 2, ('--nosync_replicas',)),
    Config('2 ps + 2 workers, sync', 2, 2),
    Config('2 ps + 2 workers, async', 2, 2, ('--nosync_replicas',)),
    Config(PEER_ROW, 1, 2, ('--moving_averages',), peer='tf2'),
    Config(PEER_ROW + ', no moving averages', 1, 2, peer='tf2'),
    Config(TORCH_ROW, 0, 1, peer='torch'),
    Config(DDP_ROW, 0, 2, peer='torch'))
# --quick: the baseline, 1 ps + 2 workers synchronous and asynchronous, and
# TensorFlow 2's own asynchronous strategy and PyTorch beside them.
QUICK_RUNS = (BASELINE, SYNC_ROW, '1 ps + 2 workers, async', PEER_ROW,
              TORCH_ROW, DDP_ROW)


def parse_args(argv):
  """The command line."""
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--quick', action='store_true',
                      help='one round of three configurations, fewer steps '
                      'and shorter timings (under 3 minutes '
                      'on 2 cores)')
  parser.add_argument('--data_dir', help='CIFAR-10 binary files (default: a '
                      'synthetic set made in a temporary directory)')
  parser.add_argument('--batch_size', type=int, default=128)
  parser.add_argument('--steps', type=int,
                      help='global steps per training run (default: 40 with '
                      '--quick, 120 without)')
  parser.add_argument('--rounds', type=int,
                      help='times each training configuration runs, '
                      'interleaved; the median counts (default: 1 with '
                      '--quick, 3 without)')
  parser.add_argument('--num_gpus', type=int, default=0,
                      help='GPUs per machine, passed to the trainer')
  add_network_args(parser)
  parser.add_argument('--perf', action='store_true',
                      help='split each training run\'s CPU in its steady '
                      'state by process and kind of work (oneDNN, gRPC, '
                      'the kernel...) with `perf record -a`: needs perf and '
                      'root (tools/cpu_profile.py)')
  parser.add_argument('--only',
                      help='a regular expression: train only the '
                      'configurations whose name it finds, and the single '
                      'process, e.g. "mixed precision"')
  parser.add_argument('--plot', default='benchmark_network.png',
                      help='where to draw images/s against link rate '
                      '(default: %(default)s)')
  parser.add_argument('--json', default='benchmark.json',
                      help='where to write the numbers (default: '
                      '%(default)s)')
  return check_args(parser, parser.parse_args(argv))


def add_network_args(parser):
  """The slow-network runs' flags."""
  parser.add_argument('--network_rates', default=NETWORK_RATES,
                      help='link rates in Mbit/s for the slow-network runs '
                      '(needs root and iproute2; empty: none; default: '
                      '%(default)s, with --quick 100)')
  parser.add_argument('--network_steps', type=int,
                      help='global steps per slow-network run (default: 10 '
                      'with --quick, 60 without)')
  parser.add_argument('--network_batch_sizes',
                      help='batches per worker in the slow-network runs, '
                      'comma-separated (default: half of --batch_size, what '
                      'each of 2 pinned workers computes in the time one '
                      'process computes the whole)')
  parser.add_argument('--network_rounds', type=int,
                      help='times each slow-network run runs, interleaved; '
                      'the median counts (default: 1 with --quick, 3 '
                      'without)')
  parser.add_argument('--network_workers', default=NETWORK_WORKERS,
                      help='worker counts of the slow-network runs; a count '
                      'N other than 2 trains a batch of 2 / N of each of '
                      '--network_batch_sizes, the same examples a step '
                      '(default: %(default)s, with --quick 2)')
  parser.add_argument('--network_transfer_dtypes', default='float32,bfloat16',
                      help='--transfer_dtype values of the 1 ps slow-network '
                      'runs (default: %(default)s, with --quick float32)')


def check_args(parser, args):
  """Refuses counts below 1, in one line; returns args with
  --network_workers as a sorted list of counts."""
  given = args.network_workers
  if args.quick and given == NETWORK_WORKERS:
    given = '2'
  if not re.fullmatch(r'[1-9]\d*(,[1-9]\d*)*', given):
    parser.error('--network_workers must be worker counts of 1 or more, '
                 'comma-separated, e.g. 2,8 (got "%s")' % given)
  args.network_workers = sorted({int(n) for n in given.split(',')})
  missing = args.perf and cpu_profile.unavailable()
  if missing:
    parser.error('--perf: %s; run without it, or where perf may record '
                 'every CPU (as root)' % missing)
  for name in ('rounds', 'network_rounds', 'steps', 'network_steps'):
    if getattr(args, name) is not None and getattr(args, name) < 1:
      parser.error('--%s must be 1 or more, got %d' % (name,
                                                       getattr(args, name)))
  return args


def main(argv=None):
  """Runs what the command line asks for; returns the exit status."""
  args = parse_args(argv)
  tf1.disable_eager_execution()
  tf.get_logger().setLevel('ERROR')
  with tempfile.TemporaryDirectory(prefix='cifar10-benchmark-') as work:
    results = measure(args, work=work,
                      data_dir=args.data_dir or synthetic_data(work))
  benchmark_report.write(results, plot=args.plot, json_path=args.json)
  return 0


def synthetic_data(work):
  """A small synthetic set in work, for a run without --data_dir."""
  data_dir = os.path.join(work, 'data')
  make_synthetic_cifar10.main(['--data_dir', data_dir, '--train_records',
                               '2000', '--test_records', '100'])
  return data_dir


def measure(args, *, work, data_dir):
  """Everything the command line asks for, in the JSON's layout."""
  steps = args.steps or (40 if args.quick else 120)
  rounds = args.rounds or (1 if args.quick else 3)
  flags = ['--num_gpus=%d' % args.num_gpus] if args.num_gpus else []
  results = {'machine': cpu_peak.cpu_model(),
             'cpu_bf16': precision.cpu_bf16_flags(),
             'cores': len(os.sched_getaffinity(0)),
             'tensorflow': tf.__version__, 'batch_size': args.batch_size,
             'steps': steps, 'num_gpus': args.num_gpus, 'rounds': rounds}
  print('Input pipelines...', flush=True)
  results['input'], results['input_cpu_ms_per_record'] = (
      benchmark_inputs.measure(data_dir=data_dir, batch_size=args.batch_size,
                               seconds=1 if args.quick else 10))
  measured = train_all(
      configs=chosen_configs(quick=args.quick, only=args.only),
      rounds=rounds, data_dir=data_dir, work=work, steps=steps,
      batch_size=args.batch_size, flags=flags, perf=args.perf)
  results['training'] = benchmark_report.summarize(
      measured, num_workers={c.name: c.num_workers for c in CONFIGS},
      num_gpus=args.num_gpus)
  results['against_tf2'] = benchmark_report.against_tf2(results['training'])
  results['against_pytorch'] = benchmark_report.against_torch(
      results['training'])
  results['flop_per_image'] = flop_per_image()
  results['peak'] = cpu_peak.float32_peak()
  results['startup'] = startup(results['training'],
                               tries=1 if args.quick else 2)
  results['bytes'] = bytes_per_step()
  results['network_batch_sizes'], results['network'] = measure_networks(
      args, data_dir=data_dir, work=work, flags=flags,
      bytes_=results['bytes'])
  return results


def chosen_configs(*, quick, only):
  """The Configs to train: those --only finds (and the single process, the
  ratios' baseline), else with --quick those of QUICK_RUNS, else all; the
  PyTorch rows only where PyTorch is installed (one line says so)."""
  if only:
    configs = [c for c in CONFIGS if c.name == BASELINE or re.search(
        only, c.name)]
  else:
    configs = [c for c in CONFIGS if c.name in QUICK_RUNS or not quick]
  if (any(c.peer == 'torch' for c in configs) and
      importlib.util.find_spec('torch') is None):
    print('PyTorch is not installed: its rows are left out (pip install -r '
          'tools/requirements-peers.txt to measure against it).', flush=True)
    configs = [c for c in configs if c.peer != 'torch']
  return configs


def train_all(*, configs, rounds, data_dir, work, steps, batch_size, flags,
              perf):
  """{row: [each round's measurements]} of the configs.

  One round runs each configuration once, so that a slow minute of the
  machine weighs on all configurations of a round alike.
  """
  measured = {c.name: [] for c in configs}
  for i in range(rounds):
    for config in configs:
      print('Training, round %d of %d: %s...' % (i + 1, rounds, config.name),
            flush=True)
      name = '%s_%d' % (re.sub(r'\W+', '_', config.name), i)
      if config.peer == 'torch':
        measured[config.name].append(measured_run.run_torch_peer(
            name=name, data_dir=data_dir, work=work, steps=steps,
            batch_size=batch_size, world_size=config.num_workers))
      elif config.peer:
        measured[config.name].append(measured_run.run_peer(
            name=name, data_dir=data_dir, work=work, steps=steps,
            batch_size=batch_size, flags=list(config.flags)))
      else:
        measured[config.name].append(measured_run.run_training(
            name=name, data_dir=data_dir, work=work, num_ps=config.num_ps,
            num_workers=config.num_workers, steps=steps,
            batch_size=batch_size, flags=list(config.flags) + flags,
            perf=perf))
  return measured


def measure_networks(args, *, data_dir, work, flags, bytes_):
  """The slow-network runs the command line asks for; returns (their batch
  sizes, their measurements with the planner's predictions)."""
  rates = args.network_rates if not (
      args.quick and args.network_rates == NETWORK_RATES) else '100'
  batch_sizes = ([int(b) for b in args.network_batch_sizes.split(',')]
                 if args.network_batch_sizes else
                 [max(1, args.batch_size // 2)])
  links = benchmark_network.network_links(
      batch_sizes=batch_sizes,
      rates=sorted({int(r) for r in rates.split(',') if r}, reverse=True),
      wire_dtypes=(['float32'] if args.quick else
                   args.network_transfer_dtypes.split(',')),
      ps_counts=(1,) if args.quick else (1, 2),
      worker_counts=args.network_workers)
  network = benchmark_network.train_over_links(
      links=links, rounds=args.network_rounds or (1 if args.quick else 3),
      data_dir=data_dir, work=work, flags=flags,
      steps=args.network_steps or (10 if args.quick else 60))
  benchmark_report.predict_network(network, bytes_)
  return batch_sizes, network


def startup(training, *, tries):
  """Launch to the first step of the synchronous cluster (the single
  process without it), beyond importing TensorFlow; its shutdown."""
  sync = training.get(SYNC_ROW, training[BASELINE])
  imports = import_seconds(tries)
  return {'import_secs': imports,
          'first_step_secs': sync['first_step_secs'],
          'first_step_beyond_import_secs': sync['first_step_secs'] - imports,
          'shutdown_secs': sync['shutdown_secs']}


def import_seconds(tries):
  """Wall time of a fresh `import tensorflow` (the best of tries), as the
  trainer imports it: without Keras 3 (TF_USE_LEGACY_KERAS)."""
  times = []
  for _ in range(tries):
    start = time.time()
    subprocess.run([sys.executable, '-c', 'import tensorflow'], check=True,
                   capture_output=True,
                   env=dict(os.environ, TF_USE_LEGACY_KERAS='1'))
    times.append(time.time() - start)
  return min(times)


def flop_per_image():
  """FLOP to train on one image: the multiply-adds of the convolutions and
  the dense layer, 2 FLOP each, three times (the forward pass, the
  gradients of the inputs and of the weights); the rest (BatchNorm, ReLU,
  pools, the update) is a few percent of that, left out."""
  with tf.Graph().as_default():
    cifar10_model.inference(tf1.placeholder(tf.float32, [1, 32, 32, 3]))
    macs = 0
    for op in tf1.get_default_graph().get_operations():
      if op.type == 'Conv2D':
        out = op.outputs[0].shape.as_list()
        kernel = op.inputs[1].shape.as_list()
        macs += out[1] * out[2] * int(np.prod(kernel))
      elif op.type == 'MatMul':
        macs += int(np.prod(op.inputs[1].shape.as_list()))
  return 3 * 2 * macs


def bytes_per_step():
  """Bytes a worker pulls (variables) and pushes (gradients) per step, and
  their time on 1 and 10 Gb/s links."""
  with tf.Graph().as_default():
    cifar10_model.inference(tf1.placeholder(tf.float32, [1, 32, 32, 3]))
    trainable = sum(int(np.prod(v.shape)) for v in tf1.trainable_variables())
  bits = trainable * 4 * 2 * 8
  return {'trainable_parameters': trainable, 'pull': trainable * 4,
          'push': trainable * 4,
          # One ps holds everything; two hold what placement gives each.
          'largest_ps_share': plan_cluster.largest_shares(2),
          'ms_at_1gbps': bits / 1e9 * 1e3, 'ms_at_10gbps': bits / 1e10 * 1e3}


if __name__ == '__main__':
  sys.exit(main())
