"""Chaos: kill -9 workers, the chief and each ps of a 2-ps cluster in turn.

Each kill happens when a checkpoint step is reached (not after a sleep), and
the task is restarted with the same command. The run must still finish at
--max_steps with every task exiting 0, and after each kill training must go
on from no earlier than the last checkpoint taken before it.
"""

import re

import tensorflow as tf

from test_cluster import cluster_flags, latest_step, start_cluster
from test_faults import kill9, wait_until

MAX_STEPS = 60
# The task killed once the checkpoint of step 10, 20, ... exists.
VICTIMS = ['worker2', 'worker0', 'ps1', 'worker1', 'ps0']


def restored_steps(log):
  """Steps the chief (re)started from: on start-up, or after a lost ps."""
  return [int(s) for s in re.findall(
      r'(?:resuming from \S+model\.ckpt-|restored the model at global step )'
      r'(\d+)', log)]


def test_kill_every_kind_of_task_in_turn(procs, tiny_data, tmp_path):
  train_dir = str(tmp_path / 'train')
  flags = cluster_flags(tiny_data, train_dir, num_workers=3, num_ps=2) + [
      '--replicas_to_aggregate=2', '--max_steps=%d' % MAX_STEPS,
      '--save_checkpoint_steps=10']
  start_cluster(procs, flags, num_workers=3, num_ps=2)
  live = {name: name for name in ('ps0', 'ps1', 'worker0', 'worker1',
                                  'worker2')}
  killed = []
  for n, victim in enumerate(VICTIMS):
    at = 10 * (n + 1)
    wait_until(lambda a=at: latest_step(train_dir) >= a, 120,
               'checkpoint %d' % at, procs)
    chief = live['worker0']
    lost_before = procs.log(chief).count('lost a task of the cluster')
    restored_before = len(restored_steps(procs.log(chief)))
    killed.append(live[victim])
    kill9(procs, live[victim])
    saved = latest_step(train_dir)  # The last checkpoint before the kill.
    if victim.startswith('ps'):
      # The chief must see the ps go before a new one takes its port.
      wait_until(lambda: procs.log(chief).count(
          'lost a task of the cluster') > lost_before, 60,
                 'the chief noticing the lost %s' % victim, procs)
    live[victim] = '%s_again%d' % (victim, n)
    job, index = re.match(r'(ps|worker)(\d)', victim).groups()
    procs.trainer(live[victim], '--job_name=' + job, '--task_index=' + index,
                  *flags)
    if victim == 'worker0':
      chief, restored_before = live[victim], 0
    elif not victim.startswith('ps'):
      continue  # The chief goes on; nothing is restored.
    # The chief starts again from a checkpoint: the last one, or a later one.
    wait_until(lambda: len(restored_steps(procs.log(chief))) > restored_before,
               120, 'the chief restoring after the kill of %s' % victim, procs)
    assert restored_steps(procs.log(chief))[-1] >= saved, procs.tails()

  codes = procs.wait_all(timeout=180)
  assert codes == dict({n: -9 for n in killed},
                       **{n: 0 for n in live.values()}), procs.tails()
  assert latest_step(train_dir) == MAX_STEPS
  name = tf.train.latest_checkpoint(train_dir)
  assert int(tf.train.load_variable(name, 'global_step')) == MAX_STEPS
