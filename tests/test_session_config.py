"""training/cluster/session_config.py: each task's threads are its share of the
cores it may use (the quota's side is in test_machines.py)."""

import os

from training.cluster import session_config

CORES = len(os.sched_getaffinity(0))  # This machine has no CPU quota.
WORKERS = ['localhost:2222', 'localhost:2223', 'other:2222']


def test_a_ps_beside_the_workers_gets_its_share_of_the_host():
  """A ps on a host with 2 workers: a third of the cores, at least 1, for
  each pool; a ps on a host of its own, every core."""
  shared = session_config.session_config(
      'ps', 0, WORKERS, ps_hosts=['localhost:2224', 'ps1:2222'])
  assert (shared.inter_op_parallelism_threads,
          shared.intra_op_parallelism_threads) == (max(1, CORES // 3),) * 2
  alone = session_config.session_config(
      'ps', 1, WORKERS, ps_hosts=['localhost:2224', 'ps1:2222'])
  assert (alone.inter_op_parallelism_threads,
          alone.intra_op_parallelism_threads) == (CORES, CORES)


def test_a_ps_without_the_cluster_keeps_tensorflows_pools():
  """0: TensorFlow sizes the pools (every core)."""
  config = session_config.session_config('ps', 0)
  assert (config.inter_op_parallelism_threads,
          config.intra_op_parallelism_threads) == (0, 0)


def test_workers_on_one_host_share_its_cores_and_only_the_workers_count():
  """A worker's intra-op threads: the cores over the workers on its host
  (the ps tasks, mostly waiting, are not counted); its inter-op pool is
  TensorFlow's."""
  config = session_config.session_config('worker', 0, WORKERS)
  assert (config.inter_op_parallelism_threads,
          config.intra_op_parallelism_threads) == (0, max(1, CORES // 2))
  assert session_config.session_config(
      'worker', 2, WORKERS).intra_op_parallelism_threads == CORES
