"""BatchNorm's decay from the workers, in real processes: without
--batch_norm_decay a synchronous update of N gradients keeps 0.995^N of the
moving statistics (they are updated once an update), a resumed run follows
its own N (the gradients an update aggregates, not the workers), a given
value wins, and one process and asynchronous workers keep 0.995. Read where
the trainer put it: the rate of every update of a statistic in the graph
the chief wrote (graph.pbtxt)."""

import os
import re

import pytest
from google.protobuf import text_format
from tensorflow.core.framework import graph_pb2

from helpers import assert_clean_logs, checkpoint_steps, cluster_flags
from helpers import single_process_flags, start_cluster

MOVES = 10  # Moving means and variances of the network's 5 BatchNorm layers.


def decays(train_dir):
  """The decay of every update of a BatchNorm moving statistic in the graph
  the chief wrote (graph.pbtxt), slim's and those the trainer's placement
  rebuilds: each moves its statistic by (1 - decay) x its distance, a
  constant in the graph."""
  graph = graph_pb2.GraphDef()
  with open(os.path.join(train_dir, 'graph.pbtxt')) as f:
    text_format.Parse(f.read(), graph)
  nodes = {n.name: n for n in graph.node}
  moves = [n for n in graph.node if n.op == 'AssignSubVariableOp' and
           re.search(r'/BatchNorm/moving_(mean|variance)$', n.input[0])]
  rates = [nodes[i] for m in moves for i in nodes[m.input[1]].input
           if nodes[i].op == 'Const']
  assert len(rates) == len(moves) >= MOVES, (len(rates), len(moves))
  return [1 - float(r.attr['value'].tensor.float_val[0]) for r in rates]


def assert_decays(train_dir, expected):
  found = decays(train_dir)
  assert all(d == pytest.approx(expected, abs=1e-7) for d in found), found


def chief_line(log):
  """The chief's line on BatchNorm's decay, or None."""
  found = [l for l in log.splitlines() if "BatchNorm's moving statistics" in l]
  assert len(found) <= 1, found
  return found[0] if found else None


def run_cluster(procs, data_dir, train_dir, workers, max_steps, suffix,
                *flags):
  start_cluster(procs, cluster_flags(data_dir, train_dir, workers) + [
      '--max_steps=%d' % max_steps] + list(flags), workers, suffix=suffix)
  codes = procs.wait_all(timeout=240)
  assert set(codes.values()) == {0}, procs.tails()
  # (Asynchronous: another worker's update may land as the chief saves.)
  name_step, step = checkpoint_steps(train_dir)
  assert max_steps <= name_step <= step <= max_steps + 1
  return procs.log('worker0' + suffix)


def derived(decay, gradients):
  """The chief's line for a decay of 0.995^gradients, written out."""
  return ("Worker 0: BatchNorm's moving statistics keep %s an update "
          '(0.995^%d: %d gradients an update; --batch_norm_decay sets '
          'another)' % (decay, gradients, gradients))


# One train_dir resumed run after run: (suffix, workers, max_steps, flags,
# the chief's line or None, the decay).
RUNS = [
    ('', 2, 4, [], derived('0.99', 2), 0.995**2),
    # Resumed by 3 workers: their own count.
    ('_three', 3, 8, [], derived('0.9851', 3), 0.995**3),
    # 3 workers of which 2 make an update (one a backup): the gradients an
    # update aggregates, not the workers.
    ('_backup', 3, 12, ['--replicas_to_aggregate=2'], derived('0.99', 2),
     0.995**2),
    # Asynchronous: each worker's step updates them, as one process's.
    ('_async', 2, 16, ['--nosync_replicas'], None, 0.995),
    # A value given wins, whatever the workers.
    ('_given', 2, 20, ['--batch_norm_decay=0.9'],
     "Worker 0: BatchNorm's moving statistics keep 0.9 an update "
     '(--batch_norm_decay)', 0.9),
]


@pytest.mark.slow
def test_the_decay_follows_the_gradients_an_update_aggregates(
    procs, tiny_data, tmp_path):
  train_dir = str(tmp_path / 'train')
  # One process beside the first run: a statistic updated every batch.
  alone = str(tmp_path / 'alone')
  procs.trainer('alone', *single_process_flags(tiny_data, alone),
                '--max_steps=3')
  for suffix, workers, max_steps, flags, line, decay in RUNS:
    log = run_cluster(procs, tiny_data, train_dir, workers, max_steps,
                      suffix, *flags)
    assert chief_line(log) == line, suffix
    assert_decays(train_dir, decay)
  assert chief_line(procs.log('worker1')) is None  # The chief's alone.
  assert chief_line(procs.log('alone')) is None
  assert_decays(alone, 0.995)
  assert_clean_logs(procs)
