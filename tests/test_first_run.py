"""The first real run: a run records its data, synthetic data never takes
the real data's place, and the local-cluster script says what it resumes.
Real processes, real files, a local HTTP server for the download."""

import hashlib
import http.server
import io
import os
import re
import shutil
import tarfile
import threading

import pytest
import tensorflow as tf

from suite_env import LOCAL_CLUSTER_SCRIPT as SCRIPT
from helpers import run_in_group, single_process_flags

SHORT = ['--batch_size=16', '--num_workers=1', '--max_steps=10', '--',
         '--num_preprocess_threads=2', '--log_frequency=5',
         '--eval_interval_secs=0.5']


def sha256_of_training_files(data_dir):
  """The digest a run records, computed here on its own."""
  digest = hashlib.sha256()
  for i in range(1, 6):
    with open(os.path.join(data_dir, 'data_batch_%d.bin' % i), 'rb') as f:
      digest.update(f.read())
  return digest.hexdigest()


def error_lines(log):
  return [l for l in log.splitlines() if l.startswith('Error')]


@pytest.mark.slow
def test_a_train_dir_resumes_only_on_its_data(procs, tiny_data, tmp_path):
  train_dir = str(tmp_path / 'train')
  other = str(tmp_path / 'other')
  shutil.copytree(tiny_data, other)
  with open(os.path.join(other, 'data_batch_3.bin'), 'r+b') as f:
    f.seek(5000)
    f.write(b'\x01')  # One pixel of one image.
  ours, theirs = (sha256_of_training_files(d) for d in (tiny_data, other))
  flags = single_process_flags(tiny_data, train_dir)
  procs.trainer('first', '--max_steps=10', *flags)
  assert procs.wait_all(timeout=120)['first'] == 0, procs.tails()
  assert ('Worker 0: training on synthetic data in %s (5 files, 200 records, '
          'sha256 %s...)' % (tiny_data, ours[:12])) in procs.log('first')
  before = {n: open(os.path.join(train_dir, n), 'rb').read()
            for n in os.listdir(train_dir)}

  other_flags = single_process_flags(other, train_dir)
  procs.trainer('other', '--max_steps=20', *other_flags)
  assert procs.wait_all(timeout=120)['other'] == 2, procs.tails()
  assert error_lines(procs.log('other')) == [
      'Error: --train_dir=%s was trained on synthetic data in %s (5 files, '
      '200 records, sha256 %s...), not on the --data_dir given, synthetic '
      'data in %s (5 files, 200 records, sha256 %s...): pass the --data_dir '
      'it was trained on, another --train_dir, --fresh_start to start over, '
      'or --new_data to train it on this data' % (
          train_dir, tiny_data, ours[:12], other, theirs[:12])]
  assert {n: open(os.path.join(train_dir, n), 'rb').read()  # Untouched.
          for n in os.listdir(train_dir)} == before

  procs.trainer('fine_tune', '--max_steps=20', '--new_data', *other_flags)
  assert procs.wait_all(timeout=120)['fine_tune'] == 0, procs.tails()
  log = procs.log('fine_tune')
  assert 'Worker 0: --new_data: %s was trained on synthetic data in %s' % (
      train_dir, tiny_data) in log
  assert 'resuming from %s/model.ckpt-10' % train_dir in log
  # The record is the new data's now: the old one is other data.
  procs.trainer('back', '--max_steps=30', *flags)
  assert procs.wait_all(timeout=120)['back'] == 2, procs.tails()
  assert 'sha256 %s...), not on the --data_dir given' % theirs[:12] in (
      error_lines(procs.log('back'))[0])

  procs.trainer('evaluator', '--job_name=evaluator', '--run_once',
                '--data_dir=' + tiny_data, '--train_dir=' + train_dir)
  assert procs.wait_all(timeout=120)['evaluator'] == 0, procs.tails()
  assert ('Evaluator: testing on %s/test_batch.bin, 50 records of synthetic '
          'data; the chief trains on synthetic data in %s' % (
              tiny_data, other)) in procs.log('evaluator')


def serve(body):
  """Serves body at /cifar-10-binary.tar.gz on 127.0.0.1; returns the
  server (its thread runs until server.shutdown())."""

  class Handler(http.server.BaseHTTPRequestHandler):

    def do_GET(self):  # pylint: disable=invalid-name
      self.send_response(200)
      self.send_header('Content-Length', str(len(body)))
      self.end_headers()
      self.wfile.write(body)

    def log_message(self, *args):
      pass

  server = http.server.HTTPServer(('127.0.0.1', 0), Handler)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  return server


def run(tmp_path, *args, env=None):
  """The script as the README gives it, in tmp_path as its checkout's
  working directory; returns (exit status, what it printed)."""
  return run_in_group(['bash', SCRIPT, '--log_dir=logs'] + list(args),
                      timeout=240, cwd=str(tmp_path),
                      env=dict(os.environ, **(env or {})))


@pytest.mark.slow
def test_the_quickstart_then_the_real_data_never_mix(tmp_path, tiny_data):
  # The quickstart, then the real-data command, as a new user runs them.
  code, out = run(tmp_path, '--synthetic', *SHORT)
  assert code == 0, out
  synthetic = tmp_path / 'synthetic-cifar-10-batches-bin'
  assert re.search(r'^Data: synthetic data in %s \(5 files, 10000 records, '
                   r'sha256 [0-9a-f]{12}\.\.\.\)$' % synthetic, out, re.M), out
  assert 'Starting fresh in ./models_cifar10_synthetic' in out
  assert not (tmp_path / 'cifar-10-batches-bin').exists()
  assert not (tmp_path / 'models_cifar10').exists()

  # Again: the run is over, and the script says so before it starts.
  code, out = run(tmp_path, '--synthetic', *SHORT)
  assert code == 0, out
  assert ('./models_cifar10_synthetic is at step 10, at or past '
          '--max_steps=10: the tasks start, find nothing to train and stop'
          in out), out
  assert re.search(r'^Final: .*: step 10, ', out, re.M), out
  # Not one step more.
  assert tf.train.latest_checkpoint(
      str(tmp_path / 'models_cifar10_synthetic')).endswith('model.ckpt-10')

  # The real data, from a local server: downloaded into its own folder,
  # trained in its own train_dir, from scratch.
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode='w:gz') as tar:
    for name in sorted(os.listdir(tiny_data)):
      if name != 'SYNTHETIC.txt':  # As the real archive: no such mark.
        tar.add(os.path.join(tiny_data, name),
                arcname='cifar-10-batches-bin/' + name)
  body = buf.getvalue()
  server = serve(body)
  try:
    code, out = run(tmp_path, *SHORT, env={
        'CIFAR10_URL': 'http://127.0.0.1:%d/cifar-10-binary.tar.gz' %
                       server.server_port,
        'CIFAR10_MD5': hashlib.md5(body).hexdigest()})
  finally:
    server.shutdown()
    server.server_close()
  assert code == 0, out
  real = tmp_path / 'cifar-10-batches-bin'
  assert re.search(r'^Data: CIFAR-10 layout data in %s \(5 files, 200 '
                   r'records, sha256 %s\.\.\.\)$' % (
                       real, sha256_of_training_files(str(real))[:12]),
                   out, re.M), out
  assert 'Starting fresh in ./models_cifar10\n' in out
  assert tf.train.latest_checkpoint(str(tmp_path / 'models_cifar10')).endswith(
      'model.ckpt-10')
