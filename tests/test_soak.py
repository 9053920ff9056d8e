"""The restart soak: a synchronous 2 ps + 3 worker cluster (one backup
worker) whose tasks of every role are killed (-9) and started again with the
same command, as Kubernetes does, 9 times, the chief 4 of them; then a
worker killed that never comes back.

Each kill comes when a checkpoint step is reached (not after a sleep). The
run must end at --max_steps, each ps exiting by itself without the worker
lost for good, with every task it started gone and every restarted one
exiting 0; after each kill, training goes on from no earlier
than the last checkpoint taken before it (restored, or kept on the ps tasks
when only the chief was lost); and at most the saver's max_to_keep
checkpoints remain.
"""

import re

import pytest
import tensorflow as tf

from helpers import MAX_TO_KEEP, checkpoint_files, cluster_flags, kill9
from helpers import latest_step, listed, start_cluster, wait_until

MAX_STEPS = 150
# The task killed once the checkpoint of step 10, 20, ... exists.
VICTIMS = ['worker2', 'worker0', 'ps1', 'worker0', 'worker1', 'ps0',
           'worker0', 'worker2', 'worker0']


def went_on_from(log):
  """Steps the chief went on from: resumed, restored, or kept on the ps."""
  return [int(s) for s in re.findall(
      r'(?:resuming from \S+model\.ckpt-|restored the model at global step |'
      r'the ps tasks hold the model at global step )(\d+)', log)]


@pytest.mark.slow
def test_kill_and_restart_every_role_again_and_again(procs, tiny_data,
                                                     tmp_path):
  train_dir = str(tmp_path / 'train')
  flags = cluster_flags(tiny_data, train_dir, num_workers=3, num_ps=2) + [
      '--replicas_to_aggregate=2', '--max_steps=%d' % MAX_STEPS,
      '--save_checkpoint_steps=10', '--lost_worker_secs=3']
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
    went_before = len(went_on_from(procs.log(chief)))
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
      chief, went_before = live[victim], 0
    elif not victim.startswith('ps'):
      continue  # The chief goes on; nothing is restored.
    wait_until(lambda: len(went_on_from(procs.log(chief))) > went_before,
               120, 'the chief going on after the kill of %s' % victim,
               procs)
    assert went_on_from(procs.log(chief))[-1] >= saved, procs.tails()
    last = procs.log(chief).strip().splitlines()
    how = [l for l in last if re.search(
        r'restored the model at|the ps tasks hold the model|resuming from',
        l)][-1]
    # Only the chief lost: the ps model kept; a ps lost: the checkpoint.
    assert ('the ps tasks hold the model' in how) == (victim == 'worker0'), how

  # Last, a worker lost for good: the run ends without it.
  wait_until(lambda: latest_step(train_dir) >= 100, 120, 'checkpoint 100',
             procs)
  gone = live.pop('worker1')
  killed.append(gone)
  kill9(procs, gone)

  codes = procs.wait_all(timeout=180)
  assert codes == dict({n: -9 for n in killed},
                       **{n: 0 for n in live.values()}), procs.tails()
  assert latest_step(train_dir) == MAX_STEPS
  name = tf.train.latest_checkpoint(train_dir)
  assert int(tf.train.load_variable(name, 'global_step')) == MAX_STEPS
  assert len(checkpoint_files(train_dir)) <= MAX_TO_KEEP
  assert listed(train_dir) == checkpoint_files(train_dir)
