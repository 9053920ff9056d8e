"""scripts/run_local_cluster.sh end to end, and the evaluator's exact count."""

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tensorflow as tf

import cifar10_model
from suite_env import LOCAL_CLUSTER_SCRIPT as SCRIPT
from helpers import ROOT, free_ports, run_in_group

tf1 = tf.compat.v1

FAST = ['--batch_size=16', '--', '--num_preprocess_threads=2',
        '--log_frequency=5', '--save_checkpoint_steps=10',
        '--eval_interval_secs=0.5']


def run_script(tmp_path, data_dir, *args):
  """Starts the script in its own folder and process group; returns it."""
  log = open(tmp_path / 'script.out', 'w')
  proc = subprocess.Popen(
      ['bash', SCRIPT, '--data_dir=' + data_dir,
       '--train_dir=' + str(tmp_path / 'train'),
       '--log_dir=' + str(tmp_path / 'logs')] + list(args),
      stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path),
      start_new_session=True)
  log.close()
  return proc


def processes_mentioning(text):
  """PIDs of live processes whose command line contains text (a check that
  nothing was left, not a way to find what to kill)."""
  out = subprocess.run(['pgrep', '-f', text], capture_output=True, text=True)
  return [int(p) for p in out.stdout.split()]


@pytest.fixture
def script_procs():
  """Kills each script and every task it started, whatever happens.

  The script runs in a process group of its own, whose ID is its PID; the
  tasks it starts stay in that group, so they are found even after the
  script itself has exited.
  """
  started = []
  yield started
  for proc in started:
    try:
      os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    proc.wait()


def wait_for(path, text, proc, timeout):
  deadline = time.time() + timeout
  while time.time() < deadline:
    if os.path.exists(path) and text in open(path).read():
      return
    assert proc.poll() is None, open(path).read() if os.path.exists(path) else ''
    time.sleep(0.2)
  pytest.fail('%r never appeared in %s' % (text, path))


@pytest.mark.slow
def test_script_runs_a_cluster_with_an_evaluator(tmp_path, tiny_data,
                                                 script_procs):
  # --train_dir and --fresh_start given to the tasks, after --, in spellings
  # absl accepts: the script deletes, trains in and reports that directory.
  train_dir = tmp_path / 'elsewhere'
  train_dir.mkdir()
  (train_dir / 'stale.txt').write_text('from an earlier run')
  # And an earlier run's logs, whose lines the script's stream showed when
  # its tail opened a log before the task's own redirection emptied it (a
  # race it often won on a resumed start, not always).
  (tmp_path / 'logs').mkdir()
  for name, kind in (('worker0', 'Train'), ('evaluator', 'Test')):
    (tmp_path / 'logs' / (name + '.log')).write_text(
        '2026-01-01 00:00:00.000000: step 999, loss = 9.99 ,%s accuracy = '
        '0.01 (9 examples)\n' % kind)
  proc = run_script(tmp_path, tiny_data, '--num_ps=2', '--num_workers=3',
                    '--max_steps=20', *FAST, '-train_dir', str(train_dir),
                    '--fresh_start=t', '--eval_flips')
  script_procs.append(proc)
  assert proc.wait(timeout=240) == 0, (tmp_path / 'script.out').read_text()
  out = (tmp_path / 'script.out').read_text()
  assert '--fresh_start: deleting %s' % train_dir in out
  assert not (train_dir / 'stale.txt').exists()
  assert not (tmp_path / 'train').exists()
  assert 'Logs: %s' % (tmp_path / 'logs') in out
  assert 'step 999' not in out
  # The chief's progress, with the cluster's time left to --max_steps.
  assert re.search(r': step \d+, loss = .* ,Train accuracy = .*; '
                   r'(\d+:\d\d:\d\d|\?) left\)$', out, re.M), out
  final = re.search(r'^Final: .*: step 20, loss = \d+\.\d\d ,Test accuracy = '
                    r'(\d\.\d{4}) \(50 examples\)$', out, re.M)
  assert final, out
  assert 'Results: %s/eval/results.jsonl' % train_dir in out
  lines = (train_dir / 'eval' / 'results.jsonl').read_text()
  results = [json.loads(l) for l in lines.splitlines()]
  assert results[-1]['step'] == 20 and results[-1]['examples'] == 50
  assert results[-1]['accuracy'] == float(final.group(1))
  # With --eval_flips, its figure on the next line, the plain one first.
  flips = re.search(r'^Final: .*: step 20, Test accuracy with flips '
                    r'averaged = (\d\.\d{4}) \(--eval_flips\)$', out, re.M)
  assert flips and flips.start() > final.start(), out
  assert '%.4f' % results[-1]['accuracy_flips'] == flips.group(1)
  assert results[-1]['checkpoint'].endswith('model.ckpt-20')
  assert sorted(os.listdir(tmp_path / 'logs')) == [
      'evaluator.log', 'previous', 'ps0.log', 'ps1.log', 'worker0.log',
      'worker1.log', 'worker2.log']
  # The earlier run's logs, kept as they were.
  assert sorted(os.listdir(tmp_path / 'logs' / 'previous')) == [
      'evaluator.log', 'worker0.log']
  assert 'step 999' in (tmp_path / 'logs' / 'previous' /
                        'worker0.log').read_text()
  assert {f for f in os.listdir(train_dir)
          if f.startswith('model.ckpt-20.data-')} == {
              'model.ckpt-20.data-00000-of-00002',
              'model.ckpt-20.data-00001-of-00002'}
  assert not processes_mentioning(str(tmp_path))


@pytest.mark.parametrize('spelling, deletes', [
    ('--fresh_start', True), ('-fresh_start=1', True),
    ('--fresh_start=True', True), ('--nofresh_start', False),
    ('--fresh_start=f', False), ('no_data', False)])
def test_script_reads_fresh_start_as_absl_does(tmp_path, tiny_data, spelling,
                                               deletes):
  # The script stops before starting any task (its --log_dir cannot be
  # made), after deciding whether to delete the --train_dir given after --.
  # The last spelling wins, as in absl. Without data nothing is deleted.
  train_dir = tmp_path / 'train'
  train_dir.mkdir()
  data_dir = str(tmp_path / 'none') if spelling == 'no_data' else tiny_data
  if spelling == 'no_data':  # Made for the download: the script fills it.
    os.mkdir(data_dir)
  proc = subprocess.run(
      ['bash', SCRIPT, '--train_dir=/not/this/one', '--log_dir=/proc/none',
       '--', '--train_dir=' + str(train_dir), '--data_dir', data_dir,
       '--fresh_start=t'] + ([] if spelling == 'no_data' else [spelling]),
      capture_output=True, text=True, timeout=60, cwd=str(tmp_path),
      # No download: with no data, the downloader fails at once.
      env=dict(os.environ, PYTHON='false'))
  assert proc.returncode == 2, proc.stdout + proc.stderr
  assert train_dir.exists() != deletes
  assert ('--fresh_start: deleting %s' % train_dir in proc.stdout) == deletes
  if spelling == 'no_data':
    assert 'no CIFAR-10 in %s' % data_dir in proc.stderr
  else:
    assert 'cannot create --log_dir=/proc/none' in proc.stderr


def test_a_data_dir_with_a_typo_is_one_line_naming_the_nearest(tmp_path):
  """A --data_dir that does not exist (not the default) downloads nothing
  and makes nothing: one line, with the existing folder it most resembles.
  (A folder made for the download is filled: the no_data case above.)"""
  (tmp_path / 'synthetic-cifar-10-batches-bin').mkdir()
  # Were the check gone, the download would fail at once, not fetch.
  code, out = run_in_group(
      ['bash', SCRIPT, '--data_dir=./synthetic-cifar10-batches-bin'],
      timeout=60, cwd=str(tmp_path), env=dict(
          os.environ, PYTHON=sys.executable,
          CIFAR10_URL=str(tmp_path / 'no.tar.gz')))
  assert code == 2, out
  assert out == (
      'run_local_cluster.sh: error: --data_dir=./synthetic-cifar10-batches-bin '
      'does not exist (did you mean ./synthetic-cifar-10-batches-bin?): give '
      'the folder that holds the data, or make it (mkdir) to have the script '
      'fill it\n')
  assert sorted(os.listdir(tmp_path)) == ['synthetic-cifar-10-batches-bin']


def test_a_run_keeps_the_logs_of_the_run_before(tmp_path, tiny_data):
  """The run before's logs go to previous/ (an older previous/ goes), and
  nothing else moves: this run stops at its data check (PYTHON=false)."""
  logs = tmp_path / 'logs'
  (logs / 'previous').mkdir(parents=True)
  (logs / 'previous' / 'worker0.log').write_text('the run before that\n')
  (logs / 'previous' / 'ps1.log').write_text('that run had 2 ps\n')
  (logs / 'worker0.log').write_text('the run before\n')
  (logs / 'evaluator.log').write_text('its evaluator\n')
  (logs / 'cluster.flags').write_text('--max_steps=1\n')
  proc = subprocess.run(
      ['bash', SCRIPT, '--data_dir=' + tiny_data, '--log_dir=' + str(logs),
       '--train_dir=' + str(tmp_path / 'train')],
      capture_output=True, text=True, timeout=60, cwd=str(tmp_path),
      env=dict(os.environ, PYTHON='false'))
  assert proc.returncode == 2, proc.stdout + proc.stderr
  assert sorted(os.listdir(logs)) == ['cluster.flags', 'previous']
  assert {f: (logs / 'previous' / f).read_text()
          for f in os.listdir(logs / 'previous')} == {
              'worker0.log': 'the run before\n',
              'evaluator.log': 'its evaluator\n'}


@pytest.mark.slow
def test_a_failing_worker_fails_the_script_and_leaves_no_process(
    tmp_path, tiny_data, script_procs):
  # A flag only the workers check, and refuse; the ps and the evaluator
  # would wait forever.
  proc = run_script(tmp_path, tiny_data, '--max_steps=20', *FAST,
                    '--mixed_precision_dtype=float16')
  script_procs.append(proc)
  assert proc.wait(timeout=120) == 1
  out = (tmp_path / 'script.out').read_text()
  assert re.search(r'worker[01] exited with status 2; the end of', out), out
  # Once: the failed task's log, not also the chief's stream of lines.
  assert out.count('--mixed_precision_dtype=float16 needs --mixed_precision'
                   ) == 1, out
  assert not processes_mentioning(str(tmp_path))


def test_bad_data_is_one_line_before_any_task(tmp_path, tiny_data,
                                              script_procs):
  data_dir = tmp_path / 'data'
  shutil.copytree(tiny_data, data_dir)
  with open(data_dir / 'data_batch_2.bin', 'r+b') as f:
    f.write(b'\x0c')
  proc = subprocess.Popen(
      ['bash', SCRIPT, '--data_dir=' + str(data_dir), '--log_dir=logs'],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      cwd=str(tmp_path), start_new_session=True)
  script_procs.append(proc)  # Its group is killed, whatever happens.
  proc.stdout, proc.stderr = proc.communicate(timeout=60)
  assert proc.returncode == 2, proc.stdout + proc.stderr
  assert proc.stderr.splitlines() == [
      'Error: %s/data_batch_2.bin: record 0 has label 12, but labels must be '
      '0..9 (%s/batches.meta.txt names 10 classes): the file is corrupt, or '
      'not CIFAR-10 data' % (data_dir, data_dir)]
  assert 'Cluster:' not in proc.stdout  # No task was started.
  assert not os.listdir(tmp_path / 'logs')


@pytest.mark.parametrize('content', [None, b'not CIFAR-10'])
def test_a_failed_download_names_what_the_script_reads(tmp_path, content,
                                                        script_procs):
  # The downloader's line names its flags, --url and --md5; through the
  # script, which reads CIFAR10_URL and CIFAR10_MD5, it names those.
  tarball = tmp_path / 'cifar-10-binary.tar.gz'
  if content is None:
    why = ('cannot read %s: No such file or directory: pass CIFAR10_URL=PATH '
           'of a cifar-10-binary.tar.gz on this machine, or the URL to '
           'download it from' % tarball)
  else:
    tarball.write_bytes(content)
    why = ('%s has MD5 %s, expected c32a1d4ab5d03f1284b67883e8d87530: it is '
           'damaged or not the CIFAR-10 binary version '
           '(cifar-10-binary.tar.gz): check CIFAR10_URL and CIFAR10_MD5' % (
               tarball, hashlib.md5(content).hexdigest()))
  env = dict(os.environ, CIFAR10_URL=str(tarball))
  env.pop('CIFAR10_MD5', None)
  proc = subprocess.Popen(['bash', SCRIPT, '--log_dir=logs'],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, cwd=str(tmp_path), env=env,
                          start_new_session=True)
  script_procs.append(proc)  # Its group is killed, whatever happens.
  _, stderr = proc.communicate(timeout=60)
  assert proc.returncode == 2
  assert stderr.splitlines() == [
      'Error: ' + why, 'run_local_cluster.sh: error: no CIFAR-10 in '
      './cifar-10-batches-bin (use --synthetic to train on generated data)']


# With TensorBoard once (it is the script's to stop too); test_tensorboard.py
# checks what it serves.
@pytest.mark.slow
@pytest.mark.parametrize('sig, code, with_tensorboard', [
    (signal.SIGTERM, 143, True), (signal.SIGINT, 130, False)])
def test_interrupting_the_script_stops_everything_it_started(
    tmp_path, tiny_data, script_procs, sig, code, with_tensorboard):
  tensorboard, = free_ports(1)
  proc = run_script(tmp_path, tiny_data, '--max_steps=100000',
                    *(['--tensorboard=%d' % tensorboard] if with_tensorboard
                      else []), *FAST)
  script_procs.append(proc)
  wait_for(str(tmp_path / 'script.out'), 'Train accuracy', proc, 120)
  out = (tmp_path / 'script.out').read_text()
  ports = [int(p) for p in re.findall(r'localhost:(\d+)', out)]
  assert len(ports) == 3 + with_tensorboard
  if with_tensorboard:
    assert 'TensorBoard: http://localhost:%d/' % tensorboard in out
    # TensorBoard answers, with the chief's scalars once it has read them.
    deadline = time.time() + 60
    tags = {}
    while 'loss' not in tags.get('.', {}) and time.time() < deadline:
      try:
        with urllib.request.urlopen('http://localhost:%d/data/plugin/'
                                    'scalars/tags' % tensorboard,
                                    timeout=5) as r:
          tags = json.load(r)
      except (urllib.error.URLError, ConnectionError):
        pass
      time.sleep(0.5)
    assert 'loss' in tags.get('.', {}), tags
  proc.send_signal(sig)
  assert proc.wait(timeout=30) == code
  assert not processes_mentioning(str(tmp_path))
  for port in ports:  # Nothing listens there any more.
    with socket.socket() as s:
      # As a server would: connections of the killed tasks in TIME_WAIT
      # do not count, a listening socket would.
      s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      s.bind(('', port))
      s.listen()


@pytest.mark.slow
def test_a_free_worker_slot_takes_a_worker_started_by_hand(
    tmp_path, tiny_data, script_procs):
  # Workers that come and go, locally (issue 44): 2 slots, 1 started; the
  # script prints the command that starts the other, which joins; Ctrl-C
  # stops it, and the chief says so.
  proc = run_script(tmp_path, tiny_data, '--num_workers=1',
                    '--worker_slots=2', '--max_steps=100000', *FAST,
                    '--lost_worker_secs=3')
  script_procs.append(proc)
  out_path = str(tmp_path / 'script.out')
  wait_for(out_path, 'Train accuracy', proc, 120)
  out = (tmp_path / 'script.out').read_text()
  workers = re.search(r'^Cluster: ps localhost:\d+; workers (\S+);', out,
                      re.M).group(1).split(',')
  flagfile = tmp_path / 'logs' / 'cluster.flags'
  command = ('%s %s/train_distributed.py --flagfile=%s --job_name=worker '
             '--task_index=1' % ('python3', ROOT, flagfile))
  assert ('Worker slot 1 free, at %s: start worker 1 with `%s`, stop it with '
          'Ctrl-C' % (workers[1], command)) in out.splitlines(), out
  assert flagfile.read_text().splitlines()[:4] == [
      '--ps_hosts=' + re.search(r'ps (\S+);', out).group(1),
      '--worker_hosts=' + ','.join(workers), '--data_dir=' + tiny_data,
      '--train_dir=%s' % (tmp_path / 'train')]
  with open(tmp_path / 'worker1.log', 'w') as log:  # As a user types it.
    joiner = subprocess.Popen(command.split(), stdout=log,
                              stderr=subprocess.STDOUT, cwd='/',
                              start_new_session=True)
  script_procs.append(joiner)
  wait_for(str(tmp_path / 'worker1.log'), 'Train accuracy', joiner, 120)
  joiner.send_signal(signal.SIGINT)
  assert joiner.wait(timeout=60) == 130
  assert 'Worker 1: SIGINT; exiting' in (tmp_path / 'worker1.log').read_text()
  wait_for(out_path, 'Worker 0: lost worker 1 at %s (Connection refused for '
           '3 s)' % workers[1], proc, 60)
  proc.send_signal(signal.SIGINT)
  assert proc.wait(timeout=30) == 130
  assert not processes_mentioning(str(tmp_path))


@pytest.mark.slow
def test_evaluator_counts_every_test_record_exactly_once(procs, tmp_path,
                                                        tiny_data):
  train_dir = str(tmp_path / 'train')
  common = ['--data_dir=' + tiny_data, '--train_dir=' + train_dir,
            '--batch_size=16', '--num_preprocess_threads=2']
  procs.trainer('single', '--ps_hosts=', '--max_steps=8', *common)
  assert procs.wait_all(timeout=120) == {'single': 0}, procs.tails()
  procs.trainer('evaluator', '--job_name=evaluator', '--run_once', *common)
  assert procs.wait_all(timeout=120)['evaluator'] == 0, procs.tails()
  out = procs.log('evaluator')
  got = re.search(r'step 8, loss = (\d+\.\d\d) ,Test accuracy = (\d\.\d{4}) '
                  r'\((\d+) examples\)', out)
  assert got, out

  # The same numbers computed independently: decode test_batch.bin with
  # numpy, run the network on all 50 images at once, with the moving
  # averages of the weights restored into it, as the evaluator tests them.
  records = np.fromfile(os.path.join(tiny_data, 'test_batch.bin'), np.uint8)
  records = records.reshape(-1, 3073)
  labels = records[:, 0].astype(np.int32)
  images = records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
  with tf.Graph().as_default():
    x = tf.image.per_image_standardization(tf.constant(images, tf.float32))
    logits = cifar10_model.inference(x, is_training=False)
    loss = cifar10_model.loss(logits, labels)
    with tf1.Session() as sess:
      averages = cifar10_model.moving_averages().variables_to_restore(
          tf1.trainable_variables())
      tf1.train.Saver(averages).restore(sess,
                                        tf.train.latest_checkpoint(train_dir))
      logits_v, loss_v = sess.run([logits, loss])
  accuracy = np.mean(np.argmax(logits_v, 1) == labels)
  assert int(got.group(3)) == 50
  assert float(got.group(2)) == pytest.approx(accuracy, abs=1e-4)
  assert float(got.group(1)) == pytest.approx(loss_v, abs=0.006)
  assert_show_inputs(tmp_path, tiny_data, train_dir,
                     round((1 - accuracy) * 50))


def assert_show_inputs(tmp_path, data_dir, train_dir, wrong):
  """scripts/show_inputs.py draws the records' own labels, and as many
  misclassified test images as the evaluator counted."""
  png = tmp_path / 'inputs.png'
  out = subprocess.run(
      [sys.executable, os.path.join(ROOT, 'scripts', 'show_inputs.py'),
       '--data_dir=' + data_dir, '--out=' + str(png), '--num=8',
       '--train_dir=' + train_dir], check=True, capture_output=True,
      text=True, timeout=120).stdout
  with open(os.path.join(data_dir, 'batches.meta.txt')) as f:
    names = f.read().split()
  records = np.fromfile(os.path.join(data_dir, 'data_batch_1.bin'), np.uint8)
  first = records.reshape(-1, 3073)[:8, 0]
  assert 'training images: %s\n' % ', '.join(names[l] for l in first) in out
  assert 'misclassified: %d of 50 test images; shown: ' % wrong in out, out
  shown = re.search(r'shown: (.*)$', out, re.M).group(1).split(', ')
  assert len(shown) == min(8, wrong)
  assert all(re.fullmatch(r'(\w+) -> (\w+)', p) for p in shown)
  data = png.read_bytes()
  assert data[:8] == b'\x89PNG\r\n\x1a\n'
  width, height = struct.unpack('>II', data[16:24])
  # 8 columns of 1.7 in at 72 dpi; three panels of one row (1.7 in) under a
  # title row (0.3 of that).
  assert (width, height) == (979, int(3 * 1.3 * 1.7 * 72)), (width, height)


def test_evaluator_reads_a_checkpoint_without_moving_averages(procs, tmp_path,
                                                             tiny_data):
  # Written as a run of an earlier version did: the weights, no averages.
  train_dir = str(tmp_path / 'train')
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    cifar10_model.inference(tf.zeros([1, 32, 32, 3]), is_training=False)
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      tf1.train.Saver().save(sess, os.path.join(train_dir, 'model.ckpt'),
                             global_step=0)
  procs.trainer('evaluator', '--job_name=evaluator', '--run_once',
                '--data_dir=' + tiny_data, '--train_dir=' + train_dir)
  assert procs.wait_all(timeout=120) == {'evaluator': 0}, procs.tails()
  out = procs.log('evaluator')
  assert ('Evaluator: %s/model.ckpt-0 has no moving averages of the weights '
          '(an older run); evaluating its weights as they are' % train_dir
          ) in out, out
  assert re.search(r'step 0, loss = \d+\.\d\d ,Test accuracy = \d\.\d{4} '
                   r'\(50 examples\)', out), out
