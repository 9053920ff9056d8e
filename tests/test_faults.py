"""Faults: killed and restarted tasks, signals, bad input. Each bounded."""

import os
import re
import shutil
import signal
import socket
import time

import pytest
import tensorflow as tf

from helpers import FAST, checkpoint_step, checkpoint_steps, cluster_flags
from helpers import free_ports, kill9, last_step, latest_step, shard_counts
from helpers import hosts, paused, start_cluster, steps, wait_until
from training.graph import sync_protocol

tf1 = tf.compat.v1


OBSERVE_SECS = 4


def test_sigterm_makes_the_chief_checkpoint_and_exit(procs, tiny_data,
                                                     tmp_path):
  train_dir = str(tmp_path / 'train')
  procs.trainer('single', '--ps_hosts=', '--data_dir=' + tiny_data,
                '--train_dir=' + train_dir, '--max_steps=100000',
                '--save_checkpoint_steps=100000', *FAST)
  wait_until(lambda: last_step(procs, 'single') >= 10, 90, 'step 10', procs)
  procs.procs['single'].send_signal(signal.SIGTERM)
  assert procs.wait_all(timeout=15) == {'single': 143}
  assert 'Worker 0: SIGTERM: wrote %s/model.ckpt-' % train_dir in procs.log(
      'single')
  assert checkpoint_step(train_dir) >= 10


def test_backup_worker_killed_and_restarted(procs, tiny_data, tmp_path):
  flags = cluster_flags(tiny_data, str(tmp_path / 'train')) + [
      '--max_steps=100000', '--replicas_to_aggregate=1']
  start_cluster(procs, flags)  # ps0, worker1, worker0.
  wait_until(lambda: last_step(procs, 'worker1') >= 5, 90, 'worker 1 steps',
             procs)
  kill9(procs, 'worker1')
  killed_at = last_step(procs, 'worker0')
  # One gradient per update: the chief goes on alone.
  wait_until(lambda: last_step(procs, 'worker0') >= killed_at + 20, 60,
             'the chief advancing without worker 1', procs)
  procs.trainer('worker1_again', '--job_name=worker', '--task_index=1',
                *flags)
  wait_until(lambda: steps(procs, 'worker1_again'), 60, 'worker 1 rejoining',
             procs)
  assert min(steps(procs, 'worker1_again')) > killed_at
  assert procs.procs['worker0'].poll() is None

  # Ctrl-C to a non-chief worker and SIGTERM to the ps: each exits at once.
  procs.procs['worker1_again'].send_signal(signal.SIGINT)
  assert procs.procs['worker1_again'].wait(timeout=10) == 130
  assert 'Worker 1: SIGINT; exiting' in procs.log('worker1_again')
  procs.procs['ps0'].send_signal(signal.SIGTERM)
  assert procs.procs['ps0'].wait(timeout=10) == -signal.SIGTERM


@pytest.mark.slow
def test_full_sync_waits_for_a_lost_worker_and_resumes(procs, tiny_data,
                                                       tmp_path):
  train_dir = str(tmp_path / 'train')
  flags = cluster_flags(tiny_data, train_dir) + [
      '--max_steps=100000', '--save_checkpoint_steps=100000',
      '--log_frequency=1']
  start_cluster(procs, flags)  # ps0, worker1, worker0.
  wait_until(lambda: last_step(procs, 'worker0') >= 5, 90, 'chief steps',
             procs)
  kill9(procs, 'worker1')
  lines, killed_at = len(steps(procs, 'worker0')), last_step(procs, 'worker0')
  # Not a synchronization: what the cluster does without worker 1 is
  # observed over a few seconds.
  time.sleep(OBSERVE_SECS)
  # Every update still aggregates two gradients. Tokens are not per worker:
  # if worker 1 died before taking its token for the next step, the chief
  # takes it and goes on alone, two of its own steps (a line each, with
  # --log_frequency=1) per global step; otherwise it waits. Either way, no
  # crash. (+1: a step worker 1 sent its gradient for before it died.)
  local_steps = len(steps(procs, 'worker0')) - lines
  assert last_step(procs, 'worker0') - killed_at <= local_steps // 2 + 1, (
      procs.tails())
  assert procs.procs['worker0'].poll() is None
  procs.trainer('worker1_again', '--job_name=worker', '--task_index=1',
                *flags)
  resumed_at = last_step(procs, 'worker0')
  wait_until(lambda: steps(procs, 'worker1_again'), 60, 'worker 1 rejoining',
             procs)
  wait_until(lambda: last_step(procs, 'worker0') >= resumed_at + 10, 60,
             'training going on', procs)

  # SIGTERM while the chief is blocked on a lost worker: it still writes a
  # checkpoint and exits at once.
  kill9(procs, 'worker1_again')
  blocked_at = last_step(procs, 'worker0')
  procs.procs['worker0'].send_signal(signal.SIGTERM)
  assert procs.procs['worker0'].wait(timeout=15) == 143
  assert 'Worker 0: SIGTERM: wrote' in procs.log('worker0')
  # If the chief was going on alone, its sync thread may have applied a step
  # between the read of the step that names the checkpoint and the save.
  name_step, step = checkpoint_steps(train_dir)
  assert blocked_at <= name_step <= step


def kill_at_checkpoint_20(procs, tiny_data, tmp_path, victim, num_ps=1):
  """A sync cluster to 60 steps, checkpointing every 10; kills `victim`
  once a checkpoint of step 20 or later exists.

  Returns:
    (train_dir, flags, the latest checkpoint's step after the kill).
  """
  train_dir = str(tmp_path / 'train')
  flags = cluster_flags(tiny_data, train_dir, num_ps=num_ps) + [
      '--max_steps=60', '--save_checkpoint_steps=10']
  start_cluster(procs, flags, num_ps=num_ps)
  wait_until(lambda: latest_step(train_dir) >= 20, 90, 'checkpoint 20',
             procs)
  kill9(procs, victim)
  return train_dir, flags, checkpoint_step(train_dir)


@pytest.mark.slow
@pytest.mark.parametrize('num_ps, victim', [(1, 0), (2, 1)],
                         ids=['1ps_kill_ps0', '2ps_kill_ps1'])
def test_killed_ps_is_survived_from_the_latest_checkpoint(procs, tiny_data,
                                                          tmp_path, num_ps,
                                                          victim):
  train_dir, flags, _ = kill_at_checkpoint_20(procs, tiny_data, tmp_path,
                                             'ps%d' % victim, num_ps)
  wait_until(lambda: 'lost a task of the cluster' in procs.log('worker0'),
             60, 'the chief noticing', procs)
  # Read now: a save the chief was making when the ps died has finished
  # (or failed) before the chief's next step found the ps gone.
  saved = checkpoint_step(train_dir)
  procs.trainer('ps_again', '--job_name=ps', '--task_index=%d' % victim,
                *flags)
  codes = procs.wait_all(timeout=150)
  expected = {'ps%d' % i: 0 for i in range(num_ps)}
  expected.update({'ps%d' % victim: -9, 'worker1': 0, 'worker0': 0,
                   'ps_again': 0})
  assert codes == expected, procs.tails()
  # The ps that was not killed kept serving, and its shard is written again.
  for i in range(num_ps):
    assert 'ps %d: all 2 worker(s) finished' % i in procs.log(
        'ps_again' if i == victim else 'ps%d' % i)
  log = procs.log('worker0')
  assert 'Worker 0: the cluster is back; restoring the latest checkpoint' in log
  # Restarted from the checkpoint, exactly; and trained on from there.
  assert 'Worker 0: restored the model at global step %d' % saved in log
  assert checkpoint_step(train_dir) == 60
  assert shard_counts(train_dir, 60) == {num_ps}


def tokens_on_ps0(ps_host):
  """The tokens in SyncReplicasOptimizer's queue, read from ps 0 at
  ps_host, which holds the global step and the queue beside it (the read
  of the step fails on any other ps)."""
  with tf.Graph().as_default():
    with tf1.device('/job:ps/task:0'):
      step = tf1.get_variable('global_step', [], tf.int64, use_resource=True)
      queue = tf1.FIFOQueue(-1, tf.int64, shapes=(),
                            shared_name=sync_protocol.TOKEN_QUEUE)
    with tf1.Session('grpc://' + ps_host) as sess:
      return sess.run([step.read_value(), queue.size()])[1]


@pytest.mark.slow
def test_ps_lost_while_the_chief_waits_for_a_token(procs, tiny_data, tmp_path):
  """ps 1 killed while the chief's step waits on ps 0 for a token that only
  its sync thread, which ps 1's loss stops, would give: the chief still
  sees the loss, and the cluster restores and finishes."""
  train_dir = str(tmp_path / 'train')
  flags = cluster_flags(tiny_data, train_dir, num_ps=2) + [
      '--max_steps=40', '--save_checkpoint_steps=10', '--log_frequency=1',
      '--lost_worker_secs=120']  # Worker 1 paused is not judged hung.
  start_cluster(procs, flags, num_ps=2)
  wait_until(lambda: latest_step(train_dir) >= 10, 90, 'checkpoint 10',
             procs)
  with paused(procs, 'worker1'):
    # Paused in its step (its token taken), worker 1 holds up the update
    # and the chief's step waits for a token. Paused between its gradient
    # and its next token, it leaves that token to the chief, which goes on
    # alone: then it is paused again.
    for _ in range(20):
      time.sleep(1)  # The chief's step in flight ends.
      stalled_at = last_step(procs, 'worker0')
      time.sleep(OBSERVE_SECS)
      if last_step(procs, 'worker0') == stalled_at and tokens_on_ps0(
          hosts(flags, 'ps_hosts')[0]) == 0:
        break
      procs.procs['worker1'].send_signal(signal.SIGCONT)
      time.sleep(0.5)
      procs.procs['worker1'].send_signal(signal.SIGSTOP)
    else:
      pytest.fail('the chief never waited for worker 1:\n' + procs.tails())
    saved = checkpoint_step(train_dir)
    kill9(procs, 'ps1')
    wait_until(lambda: 'lost a task of the cluster' in procs.log('worker0'),
               150, 'the chief noticing', procs)
  procs.trainer('ps_again', '--job_name=ps', '--task_index=1', *flags)
  codes = procs.wait_all(timeout=150)
  assert codes == {'ps0': 0, 'ps1': -9, 'worker1': 0, 'worker0': 0,
                   'ps_again': 0}, procs.tails()
  log = procs.log('worker0')
  assert 'Worker 0: restored the model at global step %d' % saved in log
  assert checkpoint_step(train_dir) == 40


VISIBLE_GPUS = len(tf.config.list_physical_devices('GPU'))


def write_other_model_checkpoint(train_dir):
  with tf.Graph().as_default():
    tf.compat.v1.train.get_or_create_global_step()
    tf.compat.v1.get_variable('InceptionResnetV2/Logits/weights', [3, 3])
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      saver.save(sess, os.path.join(train_dir, 'model.ckpt'), global_step=7)


MORE_BAD_INPUT = {
    'port_taken': 'could not start the ps 0 server',
    'train_dir_is_a_file': 'cannot create --train_dir=',
    'other_model': 'holds a checkpoint of a different model',
    'truncated': 'not a positive multiple of the 3073-byte',
    # One more GPU than this machine shows.
    'too_many_gpus': '--num_gpus=%d but %d GPU(s) are visible' % (
        VISIBLE_GPUS + 1, VISIBLE_GPUS),
    'fresh_start_bad_data': 'data directory /nonexistent does not exist',
    'evaluator_other_model': 'is a checkpoint of a different model',
}


def bad_input_case(case, tiny_data, train_dir, taken):
  """Prepares the case's files; returns (data_dir, the trainer's flags).

  Args:
    taken: A listening socket whose port the port_taken case asks for.
  """
  data_dir = tiny_data
  args = ['--ps_hosts=', '--max_steps=5']
  if case == 'port_taken':
    port, = free_ports(1)
    args = ['--job_name=ps', '--task_index=0',
            '--ps_hosts=localhost:%d' % taken.getsockname()[1],
            '--worker_hosts=localhost:%d' % port]
  elif case == 'train_dir_is_a_file':
    train_dir.write_text('not a directory')
  elif case in ('other_model', 'evaluator_other_model',
                'fresh_start_bad_data'):
    train_dir.mkdir()
    write_other_model_checkpoint(str(train_dir))
  elif case == 'truncated':
    data_dir = str(train_dir) + '_data'
    shutil.copytree(tiny_data, data_dir)
    with open(os.path.join(data_dir, 'data_batch_3.bin'), 'r+b') as f:
      f.truncate(3073 * 2 + 100)
  elif case == 'too_many_gpus':
    args.append('--num_gpus=%d' % (VISIBLE_GPUS + 1))
  if case == 'evaluator_other_model':  # It would wait forever.
    args = ['--job_name=evaluator', '--eval_interval_secs=0.5']
  elif case == 'fresh_start_bad_data':  # The mistake must not cost the run.
    data_dir = '/nonexistent'
    args.append('--fresh_start')
  return data_dir, args


# Run in the chief before the trainer: its sync thread's 10th update fails
# as a cancelled step does, before it runs (an update half run, on one ps of
# two, is not covered), and the training loop's steps do not (the workers'
# gradients wait in the accumulators). The next update says how long after.
FAILS_ONCE = """
import sys, time
import tensorflow as tf
from training.session import hooks
start = hooks.SyncReplicasHook.after_create_session
class FailsOnce:
  def __init__(self, session, sync_op):
    self.session, self.sync_op, self.updates = session, sync_op, 0
  def run(self, fetches, *args, **kwargs):
    if fetches is self.sync_op:
      self.updates += 1
      if self.updates == 10:
        self.failed = time.monotonic()
        raise tf.errors.CancelledError(None, None, 'injected by the test')
      if self.updates == 11:
        print('FailsOnce: updating again after %.1f s' % (
            time.monotonic() - self.failed), file=sys.stderr, flush=True)
    return self.session.run(fetches, *args, **kwargs)
def after_create_session(self, session, coord):
  if getattr(self, '_sync_op', None) is not None:  # The chief's.
    session = FailsOnce(session, self._sync_op)
  start(self, session, coord)
hooks.SyncReplicasHook.after_create_session = after_create_session
"""


@pytest.mark.slow
def test_an_update_that_fails_with_no_task_lost_runs_again(procs, tiny_data,
                                                          tmp_path):
  """The chief's update fails once, and no step of the training loop fails
  with it: after --lost_worker_secs the chief says so and updates again;
  before, every worker waited for a token forever."""
  train_dir = str(tmp_path / 'train')
  flags = cluster_flags(tiny_data, train_dir) + ['--max_steps=30',
                                                 '--lost_worker_secs=3']
  start_cluster(procs, flags, faults={'worker0': FAILS_ONCE})
  line = ('Worker 0: an update of the gradients failed (CancelledError: '
          'injected by the test), yet the training steps go on: updating '
          'again')
  procs.wait_for_line('worker0', line, 300)  # Else the run stands still.
  assert procs.wait_all(timeout=300) == {'ps0': 0, 'worker0': 0,
                                         'worker1': 0}, procs.tails()
  log = procs.log('worker0')
  assert log.splitlines().count(line) == 1
  # Not at once (a retry at once would give back a token each time): after
  # the --lost_worker_secs in which a recovery would have come.
  after, = re.findall(r'^FailsOnce: updating again after ([\d.]+) s$', log,
                      re.M)
  assert float(after) >= 3, log
  # No step failed with it: no recovery.
  assert 'lost a task of the cluster' not in log
  assert 'the cluster is back' not in log
  assert checkpoint_step(train_dir) == 30


def test_more_bad_input(procs, tiny_data, tmp_path):
  # All cases at once, each a process of its own (as in test_cluster.py).
  before = {}
  with socket.socket() as taken:
    taken.bind(('', 0))
    taken.listen()
    for case in MORE_BAD_INPUT:
      train_dir = tmp_path / case
      data_dir, args = bad_input_case(case, tiny_data, train_dir, taken)
      if train_dir.is_dir():
        before[case] = sorted(os.listdir(train_dir))
      procs.trainer(case, '--data_dir=' + data_dir,
                    '--train_dir=' + str(train_dir), *args)
    codes = procs.wait_all(timeout=120)
  assert codes == dict.fromkeys(MORE_BAD_INPUT, 2), procs.tails()
  for case, message in MORE_BAD_INPUT.items():
    log = procs.log(case)
    errors = [l for l in log.splitlines() if l.startswith('Error: ')]
    assert len(errors) == 1 and message in errors[0], (case, log)
    assert 'Traceback' not in log, (case, log)
  for case, files in before.items():  # Nothing deleted or overwritten.
    assert sorted(os.listdir(tmp_path / case)) == files, case
