"""A long run loses nothing: restarts, a lost chief, a ps lost at the end,
an earlier release's checkpoint, a checkpoint rewritten under its name, a
finished run started again writing nothing. Real processes (the restart soak is tests/test_soak.py)."""

import glob
import json
import os
import re
import shutil
import signal
import time

import numpy as np
import pytest
import tensorflow as tf

from helpers import MAX_TO_KEEP, PROGRESS, ROOT, checkpoint_files
from helpers import checkpoint_step, checkpoint_steps, cluster_flags
from helpers import PACED, free_ports, kill9, latest_step, listed
from helpers import single_process_flags, start_cluster, wait_until

tf1 = tf.compat.v1


def printed_steps(log):
  return [int(m['step']) for m in PROGRESS.finditer(log)]


def test_restarts_trim_what_an_earlier_release_left(procs, tiny_data,
                                                    tmp_path):
  # An earlier release forgot its checkpoints at every restart: 8 here.
  train_dir = str(tmp_path / 'train')
  flags = single_process_flags(tiny_data, train_dir)
  procs.trainer('first', '--max_steps=8', '--save_checkpoint_steps=1', *flags)
  assert procs.wait_all(timeout=120)['first'] == 0, procs.tails()
  kept = checkpoint_files(train_dir)
  for step in range(8):  # Copies of the last one under older names.
    if step not in kept:
      for path in glob.glob(os.path.join(train_dir, 'model.ckpt-8.*')):
        suffix = path.split('model.ckpt-8', 1)[1]
        with open(path, 'rb') as src, open(os.path.join(
            train_dir, 'model.ckpt-%d%s' % (step, suffix)), 'wb') as dst:
          dst.write(src.read())
  assert checkpoint_files(train_dir) == list(range(9))
  procs.trainer('again', '--max_steps=10', '--save_checkpoint_steps=1',
                *flags)
  assert procs.wait_all(timeout=120)['again'] == 0, procs.tails()
  assert checkpoint_files(train_dir) == [6, 7, 8, 9, 10]
  assert listed(train_dir) == [6, 7, 8, 9, 10]


# 1 and 2 ps, sync and async; 2 ps sync in tests/test_soak.py.


# Asynchronous, worker 1 trains alone until it sees the chief gone (after
# --lost_worker_secs, 9 s here, and a poll of 2 s), and again as soon as the
# chief's port is back: leave steps for the chief.
@pytest.mark.slow
@pytest.mark.parametrize('num_ps, sync, max_steps', [(2, False, 800),
                                                     (1, True, 100)],
                         ids=['2ps_async', '1ps_sync'])
def test_a_lost_chief_is_said_and_its_return_keeps_the_ps_model(
    procs, tiny_data, tmp_path, num_ps, sync, max_steps):
  train_dir = str(tmp_path / 'train')
  flags = cluster_flags(tiny_data, train_dir, num_ps=num_ps) + [
      '--max_steps=%d' % max_steps, '--save_checkpoint_steps=20',
      '--log_frequency=1', '--lost_worker_secs=9'] + (
          [] if sync else ['--nosync_replicas'])
  chief = flags[1].split('=')[1].split(',')[0]
  for i in range(num_ps):
    procs.trainer('ps%d' % i, '--job_name=ps', '--task_index=%d' % i, *flags)
  # Worker 1 paced (at most 20 steps a second), so that on any machine the
  # run is far from --max_steps when it sees the chief gone.
  procs.trainer('worker1', '--job_name=worker', '--task_index=1', *flags,
                fault=PACED)
  procs.trainer('worker0', '--job_name=worker', '--task_index=0', *flags)
  # Killed with steps on the ps past the last checkpoint (and seen by
  # worker 1), which a chief restoring it would throw away.
  wait_until(lambda: latest_step(train_dir) >= 20 and max(printed_steps(
      procs.log('worker1')) or [0]) >= latest_step(train_dir) + 5, 120,
             'worker 1 past checkpoint 20', procs)
  kill9(procs, 'worker0')
  killed = time.time()
  saved = latest_step(train_dir)
  lost = ('Worker 1: lost the chief, worker 0 at %s (Connection refused); no '
          'checkpoint is written until it is back, and the steps since its '
          'last one are only on the ps tasks, which keep them: start it '
          'again and it goes on from there. This worker waits for it' % chief)
  # Not before --lost_worker_secs, the same threshold as for any task (it
  # was a fixed 6 s: said 6 to 8 s after).
  procs.wait_for_line('worker1', lost, 60)
  assert time.time() - killed >= 9
  before = printed_steps(procs.log('worker1'))
  assert max(before) > saved, (before, saved)
  waiting = procs.log('worker1')
  procs.trainer('worker0_again', '--job_name=worker', '--task_index=0',
                *flags)
  codes = procs.wait_all(timeout=180)
  expected = {'ps%d' % i: 0 for i in range(num_ps)}
  expected.update(worker0=-9, worker1=0, worker0_again=0)
  assert codes == expected, procs.tails()
  log1 = procs.log('worker1')
  back = 'Worker 1: the chief, worker 0 at %s, is back; going on' % chief
  assert back in log1
  # It waited: at most the step it was in when it said so, until the chief
  # was back.
  paused = log1[len(waiting):log1.index(back)]
  assert len(printed_steps(paused)) <= 1, paused
  # The global step never went back: the chief kept what the ps held, the
  # steps worker 1 made after the last checkpoint included.
  steps = printed_steps(log1)
  assert steps == sorted(steps), steps
  log = procs.log('worker0_again')
  assert 'resuming from' not in log, log
  (kept, named), = [(int(s), int(c)) for s, c in re.findall(
      r'^Worker 0: the ps tasks hold the model at global step (\d+), at or '
      r'past the last checkpoint \(model\.ckpt-(\d+)\): going on from there, '
      r'not from the checkpoint$', log, re.M)]
  # The checkpoint read above, or a later one the chief was writing as it
  # was killed (its files there, the list of checkpoints not yet updated).
  assert named >= saved
  assert kept >= max([named] + before)
  # And trained on from there, not from the checkpoint (kept > saved, from
  # the asserts above). Its first line can show kept itself: a synchronous
  # step's global step is read before the sync thread applies the update.
  assert printed_steps(log)[0] >= kept
  name_step, step = checkpoint_steps(train_dir)
  assert max_steps <= name_step <= step <= max_steps + 1
  assert len(checkpoint_files(train_dir)) <= MAX_TO_KEEP


DONE_DRIVER = '''
import os
import sys
import time
sys.path.insert(0, %(root)r)
import tensorflow as tf
tf1 = tf.compat.v1
tf1.disable_eager_execution()
from training.cluster import session_config
from training.health import run_end
ps, worker = %(ps)r, %(worker)r
cluster = tf.train.ClusterSpec({'ps': ps, 'worker': [worker]})
config = session_config.session_config('worker', 0, [worker])
server = tf1.train.Server(cluster, job_name='worker', task_index=0,
                          config=config)
with tf.device('/job:ps/task:0'):
  step = tf1.train.get_or_create_global_step()
print('start', time.time(), flush=True)
result = run_end.tell_cluster_done(
    master=server.target, config=config, task_index=0, ps_hosts=ps,
    global_step=step, close=False)
print('end', time.time(), flush=True)
print('result', result, flush=True)
os._exit(0)  # As the trainer does when a session still waits (stuck).
'''


@pytest.mark.slow
def test_telling_a_lost_ps_that_a_worker_is_done_is_bounded(procs, tmp_path):
  # ps 0 is there, ps 1 killed, ps 2 stopped (SIGSTOP: it takes connections
  # and answers nothing, as a hung machine).
  ports = free_ports(4)
  ps = ['localhost:%d' % p for p in ports[:3]]
  worker = 'localhost:%d' % ports[3]
  hosts = ['--ps_hosts=' + ','.join(ps), '--worker_hosts=' + worker]
  for i in range(3):
    procs.trainer('ps%d' % i, '--job_name=ps', '--task_index=%d' % i, *hosts)
  for i in range(3):
    procs.wait_for_line('ps%d' % i, 'ps %d: serving on' % i, 60)
  kill9(procs, 'ps1')
  procs.procs['ps2'].send_signal(signal.SIGSTOP)
  procs.start('worker0', ['-c', DONE_DRIVER % dict(root=ROOT, ps=ps,
                                                   worker=worker)])
  assert procs.procs['worker0'].wait(timeout=90) == 0, procs.tails()
  assert procs.procs['ps0'].wait(timeout=30) == 0, procs.tails()
  log = procs.log('worker0')
  warnings = [l for l in log.splitlines() if l.startswith('Warning')]
  assert warnings == [
      'Warning: could not tell ps %d at %s that worker 0 is done: %s; it '
      'waits for that until it is stopped (Ctrl-C; the chief\'s checkpoints '
      'hold the model)' % (i, ps[i], why) for i, why in (
          (1, 'it cannot be reached (Connection refused)'),
          (2, 'it did not answer in 10 s'))], log
  assert 'ps 0: all 1 worker(s) finished; exiting' in procs.log('ps0')
  # The global step (not initialized here) could not be read; the session
  # still waiting on ps 2 does not keep the driver from exiting.
  assert 'result None' in log, log
  # From its first word to its last: one 10 s bound, for ps 2 alone.
  # (Searched anywhere in a line: stderr may have written into its start.)
  stamps = dict(re.findall(r'\b(start|end) (\d+\.\d+)$', log, re.M))
  assert 10 <= float(stamps['end']) - float(stamps['start']) < 20, log


# Run in the chief before the trainer: ps 1 is killed (and its port checked
# closed) just before the chief's final save, or just before its done
# posts, a window too short to hit from outside.
KILL_PS1_BEFORE = '''
import os, signal, time
from training.health import liveness
from training.health import run_end
from training.session import hooks
target = %(target)s
real = getattr(target, %(name)r)
def kill_ps1_first(*args, **kwargs):
  os.kill(%(pid)d, signal.SIGKILL)
  while not liveness.unreachable([%(host)r], timeout=0.2):
    time.sleep(0.05)
  return real(*args, **kwargs)
setattr(target, %(name)r, kill_ps1_first)
'''


@pytest.mark.slow
@pytest.mark.parametrize('moment', ['done_posts', 'final_save'])
def test_a_ps_lost_at_the_end_is_named_and_nothing_hangs(procs, tiny_data,
                                                         tmp_path, moment):
  train_dir = str(tmp_path / 'train')
  flags = cluster_flags(tiny_data, train_dir, num_ps=2, num_workers=1) + [
      '--max_steps=25', '--save_checkpoint_steps=10']
  ps = flags[0].split('=')[1].split(',')
  procs.trainer('ps0', '--job_name=ps', '--task_index=0', *flags)
  procs.trainer('ps1', '--job_name=ps', '--task_index=1', *flags)
  target, name = {'done_posts': ('run_end', 'tell_cluster_done'),
                  'final_save': ('hooks.CheckpointSaverHook', 'end')
                  }[moment]
  procs.trainer('worker0', '--job_name=worker', '--task_index=0', *flags,
                fault=KILL_PS1_BEFORE % dict(
                    target=target, name=name, host=ps[1],
                    pid=procs.procs['ps1'].pid))
  log = procs.log
  if moment == 'done_posts':
    # The last checkpoint is written; ps 0 is told, ps 1 named; done: 0.
    assert procs.wait_all(timeout=120) == {'ps0': 0, 'ps1': -9,
                                           'worker0': 0}, procs.tails()
    assert checkpoint_step(train_dir) == 25
    assert [l for l in log('worker0').splitlines()
            if l.startswith(('Warning', 'Error'))] == [
                'Warning: could not tell ps 1 at %s that worker 0 is done: '
                'it cannot be reached (Connection refused); it waits for '
                'that until it is stopped (Ctrl-C; the chief\'s checkpoints '
                'hold the model)' % ps[1]], log('worker0')
    assert 'Worker 0: training finished at global step 25' in log('worker0')
  else:
    # The last save names the lost ps, and the chief exits 3 at once; ps 0
    # is not told that the run is done: it is not.
    assert procs.procs['worker0'].wait(60) == 3, procs.tails()
    assert [l for l in log('worker0').splitlines()
            if l.startswith(('Warning', 'Error'))] == [
                'Error: cannot write the checkpoint of step 25 in %s: ps 1 at '
                '%s (Connection refused). The last good checkpoint, '
                '%s/model.ckpt-20, is kept; start the lost task again, then '
                'this one: it resumes from there' % (
                    train_dir, ps[1], train_dir)], log('worker0')
    assert checkpoint_step(train_dir) == 20
    assert procs.procs['ps0'].poll() is None
    # As the line says: ps 1 again, then the chief, and the run ends.
    procs.trainer('ps1_again', '--job_name=ps', '--task_index=1', *flags)
    procs.trainer('worker0_again', '--job_name=worker', '--task_index=0',
                  *flags)
    assert procs.wait_all(timeout=120) == {
        'ps0': 0, 'ps1': -9, 'worker0': 3, 'ps1_again': 0,
        'worker0_again': 0}, procs.tails()
    assert ('resuming from %s/model.ckpt-20' % train_dir in
            log('worker0_again'))
    assert checkpoint_step(train_dir) == 25
  assert 'closed Session' not in log('worker0'), log('worker0')
  assert 'Traceback' not in log('worker0'), log('worker0')
  assert 'ps 0: all 1 worker(s) finished; exiting' in log('ps0')


def test_sigterm_to_a_chief_whose_ps_is_lost_names_the_ps(procs, tiny_data,
                                                          tmp_path):
  train_dir = str(tmp_path / 'train')
  flags = cluster_flags(tiny_data, train_dir) + [
      '--max_steps=100000', '--save_checkpoint_steps=10']
  ps = flags[0].split('=')[1]
  start_cluster(procs, flags)
  wait_until(lambda: latest_step(train_dir) >= 10, 120, 'checkpoint 10',
             procs)
  kill9(procs, 'ps0')
  procs.wait_for_line('worker0', 'Worker 0: lost a task of the cluster', 60)
  saved = tf.train.latest_checkpoint(train_dir)
  procs.procs['worker0'].send_signal(signal.SIGTERM)
  assert procs.procs['worker0'].wait(timeout=30) == 143
  assert ('Worker 0: SIGTERM: could not write a checkpoint: ps 0 at %s '
          '(Connection refused) cannot be reached; the last one, %s, is '
          'kept; exiting' % (ps, saved)) in procs.log('worker0')
  assert 'closed Session' not in procs.log('worker0')


def write_checkpoint_without_averages(train_dir, step):
  """A checkpoint of the network as the release before the moving
  averages wrote it: weights, BatchNorm statistics, global step, nothing
  else. Returns {name: value} of what it holds."""
  import cifar10_model  # pylint: disable=g-import-not-at-top
  os.makedirs(train_dir)
  with tf.Graph().as_default():
    tf1.set_random_seed(3)
    global_step = tf1.train.get_or_create_global_step()
    cifar10_model.inference(tf.zeros([1, 32, 32, 3]), is_training=True)
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      sess.run(global_step.assign(step))
      tf1.train.Saver().save(sess, os.path.join(train_dir, 'model.ckpt'),
                             global_step=step)
      return {v.op.name: sess.run(v) for v in tf1.global_variables()}


def test_an_earlier_release_checkpoint_resumes_with_averages_from_weights(
    procs, tiny_data, tmp_path):
  train_dir = str(tmp_path / 'train')
  old = write_checkpoint_without_averages(train_dir, 7)
  assert not [n for n in old if 'ExponentialMovingAverage' in n]
  # 2 ps (two kernels are split), one synchronous worker: nothing updates
  # the model before the chief saves what it resumed.
  flags = cluster_flags(tiny_data, train_dir, num_workers=1, num_ps=2)
  # And a schedule of the learning rate that the earlier release had not.
  start_cluster(procs, flags + ['--max_steps=12', '--lr_schedule=cosine'],
                num_workers=1, num_ps=2)
  assert set(procs.wait_all(timeout=180).values()) == {0}, procs.tails()
  log = procs.log('worker0')
  path = os.path.join(train_dir, 'model.ckpt-7')
  weights = [n for n in old if n.endswith(('weights', 'biases', 'beta'))]
  assert log.count(
      'Worker 0: %s has no moving averages of the weights (an earlier '
      'release wrote it): resuming from it, the %d averages starting '
      'from its weights' % (path, len(weights))) == 1, log
  assert 'fresh_start' not in log and 'Error' not in log, log
  assert 'Worker 0: resuming from %s' % path in log
  # Its learning rate was the reference's: the chief says that it changes.
  assert ("Worker 0: %s was trained with the learning rate of an earlier "
          "release (the reference's exponential schedule, unscaled, no "
          "warmup); from global step 7 on it follows this one (--lr_schedule "
          "exponential -> cosine); give every task the earlier flags to keep "
          "it: --lr_schedule=exponential --lr_scaling=none --warmup_steps=0" %
          train_dir) in log, log
  assert checkpoint_step(train_dir) == 12
  # The chief saved what it resumed from at once, under the same name: its
  # weights and its averages are the old checkpoint's weights, exactly.
  reader = tf.train.load_checkpoint(path)
  assert reader.get_tensor('global_step') == 7
  for name in weights:
    assert np.array_equal(reader.get_tensor(name), old[name]), name
    assert np.array_equal(
        reader.get_tensor(name + '/ExponentialMovingAverage'), old[name]), name


@pytest.mark.slow
def test_a_resumed_run_says_when_its_learning_rate_changed(procs, tiny_data,
                                                           tmp_path):
  train_dir = str(tmp_path / 'train')
  flags = single_process_flags(tiny_data, train_dir)
  procs.trainer('first', '--max_steps=10', *flags)
  assert procs.wait_all(timeout=120)['first'] == 0, procs.tails()
  assert not re.search('trained with|follows this one|cannot be read',
                       procs.log('first')), procs.log('first')
  record = os.path.join(train_dir, 'learning_rate.json')
  # Batches of 16 from 200 records: 12.5 steps an epoch, 350 epochs a decay.
  with open(record) as f:
    assert json.load(f) == {
        'kind': 'exponential', 'initial': 0.1, 'examples_per_update': 16,
        'scaling': 'none', 'warmup_steps': 0, 'max_steps': 10,
        'decay_steps': 4375, 'decay_factor': 0.1}
  # A new --max_steps leaves the exponential schedule as it was (the
  # README's resume, issue 44): nothing said, the new length recorded.
  procs.trainer('longer', '--max_steps=20', *flags)
  assert procs.wait_all(timeout=120)['longer'] == 0, procs.tails()
  assert not re.search('trained with|follows this one|Warning',
                       procs.log('longer')), procs.log('longer')
  with open(record) as f:
    assert json.load(f)['max_steps'] == 20
  # The same command again: nothing changed, nothing said or written.
  with open(record, 'rb') as f:
    written = f.read()
  procs.trainer('again', '--max_steps=20', *flags)
  assert procs.wait_all(timeout=120)['again'] == 0, procs.tails()
  assert not re.search('trained with|follows this one|cannot be read',
                       procs.log('again')), procs.log('again')
  with open(record, 'rb') as f:
    assert f.read() == written
  # A damaged record is said, not taken for an earlier release's, and
  # written again.
  with open(record, 'w') as f:
    f.write('{"kind": ')
  procs.trainer('damaged', '--max_steps=20', *flags)
  assert procs.wait_all(timeout=120)['damaged'] == 0, procs.tails()
  log = procs.log('damaged')
  assert re.search(r'^Worker 0: %s cannot be read \(.+\): it is written '
                   r'again, with this run\'s learning rate$' % re.escape(
                       record), log, re.M), log
  assert 'earlier release' not in log and 'follows this one' not in log, log
  with open(record, 'rb') as f:
    assert f.read() == written
  # A cosine falls to 0 at --max_steps: a new one moves it, which is said.
  cosine = flags + ['--lr_schedule=cosine']
  procs.trainer('cosine', '--max_steps=20', *cosine)
  assert procs.wait_all(timeout=120)['cosine'] == 0, procs.tails()
  assert '(--lr_schedule exponential -> cosine)' in procs.log('cosine'), (
      procs.log('cosine'))
  procs.trainer('cosine_longer', '--max_steps=25', *cosine)
  assert procs.wait_all(timeout=120)['cosine_longer'] == 0, procs.tails()
  assert ('Worker 0: %s was trained with another learning-rate schedule; '
          'from global step 20 on it follows this one (--max_steps 20 -> '
          '25); give every task the earlier flags to keep it' % train_dir
          ) in procs.log('cosine_longer').splitlines(), procs.log(
              'cosine_longer')


def test_evaluator_evaluates_a_checkpoint_written_again_under_its_name(
    procs, tiny_data, tmp_path):
  train_dir = str(tmp_path / 'train')
  flags = single_process_flags(tiny_data, train_dir) + [
      '--save_checkpoint_steps=10']
  procs.trainer('first', '--max_steps=20', *flags)
  assert procs.wait_all(timeout=120)['first'] == 0, procs.tails()
  data, = glob.glob(os.path.join(train_dir, 'model.ckpt-20.data-*'))
  with open(data, 'r+b') as f:  # Damaged, as by a crash mid-write.
    f.truncate(os.path.getsize(data) // 2)
  procs.trainer('evaluator', '--job_name=evaluator', '--max_steps=20',
                '--eval_interval_secs=0.5', '--data_dir=' + tiny_data,
                '--train_dir=' + train_dir)
  procs.wait_for_line('evaluator', 'Evaluator: cannot read the checkpoint '
                      '%s/model.ckpt-20' % train_dir, 90)
  # The chief falls back past it and writes a good model.ckpt-20.
  procs.trainer('second', '--max_steps=20', *flags)
  codes = procs.wait_all(timeout=120)
  assert codes == {'first': 0, 'evaluator': 0, 'second': 0}, procs.tails()
  assert 'resuming from %s/model.ckpt-10' % train_dir in procs.log('second')
  results = re.findall(r': step (\d+), loss = \S+ ,Test accuracy = \d\.\d{4} '
                       r'\(50 examples\)', procs.log('evaluator'))
  assert results[-1] == '20', procs.log('evaluator')
  # Once each: the damaged one said once, the good one evaluated once.
  assert results.count('20') == 1, results
  assert procs.log('evaluator').count('cannot read the checkpoint') == 1


def test_evaluator_evaluates_each_checkpoint_content_once(procs, tiny_data,
                                                        tmp_path):
  """model.ckpt-N written anew, the same model (as a chief before this one
  did at every start): neither the evaluator watching nor a later one
  evaluates it again (issue 44: four identical lines in results.jsonl)."""
  train_dir = str(tmp_path / 'train')
  flags = single_process_flags(tiny_data, train_dir)
  procs.trainer('first', '--max_steps=5', *flags)
  assert procs.wait_all(timeout=120)['first'] == 0, procs.tails()
  path = os.path.join(train_dir, 'model.ckpt-5')
  evaluator = ['--job_name=evaluator', '--eval_interval_secs=0.5',
               '--data_dir=' + tiny_data, '--train_dir=' + train_dir]
  procs.trainer('watching', '--max_steps=6', *evaluator)  # Past 5: it stays.
  procs.wait_for_line('watching', ': step 5, loss = ', 90)
  written = os.stat(path + '.index').st_mtime_ns
  # Written anew, byte for byte, each file replaced whole, the index last.
  for name in sorted(glob.glob(path + '.*'), key=lambda n: n.endswith(
      '.index')):
    shutil.copyfile(name, name + '.tmp')
    os.replace(name + '.tmp', name)
  assert os.stat(path + '.index').st_mtime_ns != written
  said = ('Evaluator: %s holds the model evaluated already (model.ckpt-5, '
          'results.jsonl): not evaluated again' % path)
  procs.wait_for_line('watching', said, 60)
  procs.procs['watching'].send_signal(signal.SIGINT)
  assert procs.procs['watching'].wait(60) == 130
  results = os.path.join(train_dir, 'eval', 'results.jsonl')
  with open(results) as f:
    lines = f.read().splitlines()
  assert len(lines) == 1, lines
  result = json.loads(lines[0])
  assert result['index_sha256'] and result['test_file'] == os.path.join(
      tiny_data, 'test_batch.bin')
  # A later evaluator at --max_steps: the result it has, as first printed.
  procs.trainer('later', '--max_steps=5', *evaluator)
  assert procs.procs['later'].wait(90) == 0, procs.tails()
  log = procs.log('later')
  printed = [l for l in procs.log('watching').splitlines()
             if 'Test accuracy' in l]
  assert log.splitlines()[-2:] == [said, printed[0]], log
  with open(results) as f:
    assert f.read().splitlines() == lines


EMPTY_TEST_SET = (
    'Error: %s/test_batch.bin has 0 bytes, not a positive multiple of the '
    '3073-byte CIFAR-10 record: the file is truncated or not CIFAR-10 binary '
    'data; download or generate it again')


def events(paths):
  """Every event in the events files at paths."""
  return [e for path in paths for e in tf1.train.summary_iterator(path)]


@pytest.mark.slow
def test_a_finished_run_started_again_writes_nothing(procs, tiny_data,
                                                     tmp_path):
  """The quickstart run again: nothing to train, so no checkpoint written
  anew (an evaluator would see it again) and no events file (each held the
  graph again, 1.4 MB); a start that trains on adds no graph either."""
  train_dir = str(tmp_path / 'train')
  flags = single_process_flags(tiny_data, train_dir)
  procs.trainer('first', '--max_steps=5', *flags)
  assert procs.wait_all(timeout=120)['first'] == 0, procs.tails()
  first = glob.glob(os.path.join(train_dir, 'events.out.tfevents.*'))
  assert len(first) == 1
  assert sum(bool(e.graph_def) for e in events(first)) == 1
  written = {f: os.stat(os.path.join(train_dir, f)).st_mtime_ns
             for f in os.listdir(train_dir)}
  procs.trainer('again', '--max_steps=5', *flags)
  assert procs.wait_all(timeout=120)['again'] == 0, procs.tails()
  assert 'nothing to train' in procs.log('again')
  assert {f: os.stat(os.path.join(train_dir, f)).st_mtime_ns
          for f in os.listdir(train_dir)} == written
  procs.trainer('longer', '--max_steps=7', *flags)
  assert procs.wait_all(timeout=120)['longer'] == 0, procs.tails()
  assert checkpoint_step(train_dir) == 7
  later = set(glob.glob(os.path.join(train_dir, 'events.out.tfevents.*')))
  assert len(later - set(first)) == 1
  assert not any(e.graph_def or e.meta_graph_def
                 for e in events(later - set(first)))


def test_evaluator_on_an_empty_test_set_is_one_line(procs, tiny_data,
                                                   tmp_path):
  data_dir = str(tmp_path / 'data')
  shutil.copytree(tiny_data, data_dir)
  open(os.path.join(data_dir, 'test_batch.bin'), 'w').close()  # 0 bytes.
  train_dir = str(tmp_path / 'train')
  procs.trainer('first', '--max_steps=5',
                *single_process_flags(tiny_data, train_dir))
  assert procs.wait_all(timeout=120)['first'] == 0, procs.tails()
  procs.trainer('evaluator', '--job_name=evaluator', '--run_once',
                '--data_dir=' + data_dir, '--train_dir=' + train_dir)
  assert procs.wait_all(timeout=120)['evaluator'] == 2, procs.tails()
  log = procs.log('evaluator')
  errors = [l for l in log.splitlines() if l.startswith('Error')]
  assert errors == [EMPTY_TEST_SET % data_dir], log
  assert 'Traceback' not in log, log


def test_a_checkpoint_is_named_after_the_step_it_holds(tmp_path):
  """The step is read before the save; an update applied in between (the
  chief's sync thread, the other workers) must rename the checkpoint."""
  from training.storage import checkpoints  # pylint: disable=import-outside-toplevel
  train_dir = str(tmp_path)
  with tf.Graph().as_default():
    step = tf1.train.get_or_create_global_step()
    weight = tf1.get_variable('w', initializer=1.5)
    advance = step.assign_add(4)  # Two updates of 2 workers each, say.
    saver = tf1.train.Saver(max_to_keep=2)
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      sess.run(step.assign(5))
      first = checkpoints.save(saver, sess, train_dir, 5)
      sess.run(advance)
      read = sess.run(step)  # 9: then the update lands before the save.
      sess.run(advance)
      second = checkpoints.save(saver, sess, train_dir, read)
      assert listed(train_dir) == [5, 13]  # The `checkpoint` file, renamed.
      sess.run(advance)
      third = checkpoints.save(saver, sess, train_dir, sess.run(step))
  prefix = os.path.join(train_dir, 'model.ckpt')
  assert (first, second, third) == (prefix + '-5', prefix + '-13',
                                    prefix + '-17')
  # max_to_keep=2 deleted model.ckpt-5 and kept the renamed one.
  assert checkpoint_files(train_dir) == [13, 17]
  assert listed(train_dir) == [13, 17]
  assert sorted(os.listdir(train_dir)) == [
      'checkpoint', 'model.ckpt-13.data-00000-of-00001', 'model.ckpt-13.index',
      'model.ckpt-13.meta', 'model.ckpt-17.data-00000-of-00001',
      'model.ckpt-17.index', 'model.ckpt-17.meta']
  assert tf.train.load_variable(prefix + '-13', 'global_step') == 13
  assert tf.train.load_variable(prefix + '-13', 'w') == 1.5
