"""The README's path as a user walks it, in order, in one working folder:
the quickstart, its resume with a larger --max_steps, the four terminals,
TensorBoard, the export and the classifier (issue 44, point 3). The
commands are read from README.md (TensorBoard's from docs/running.md, where
the README sends the reader); only what makes a run short changes (fewer
steps, smaller batches, fewer reader threads, a shorter evaluator poll),
and the four terminals' default ports, which may be taken, become free
ones. Not here: the real download, the benchmark, Kubernetes, the CUDA
install. Every line every process prints must be one a user can trust:
no warning, no traceback, no C++ log line of TensorFlow's, no
deprecation, no `Error`."""

import importlib.metadata
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np
from PIL import Image
import pytest

import make_synthetic_cifar10  # From scripts/, on the path helpers sets.
from helpers import OWN_LINE, ROOT, free_ports, run_in_group, suite_env
from training.runtime import log_filter

NAMES = make_synthetic_cifar10.CLASS_NAMES
# A run of the quickstart, its resume, the four terminals: global steps.
QUICKSTART, RESUMED, TERMINALS = 20, 40, 60
# What makes a run short: the script's options, and the trainer's flags.
SHORT_SCRIPT = ['--batch_size=16', '--', '--num_preprocess_threads=2',
                '--eval_interval_secs=0.5']
SHORT_TASK = ['--batch_size=16', '--num_preprocess_threads=2',
              '--eval_interval_secs=0.5']
TRAIN_DIR = './models_cifar10_synthetic'

# What misleads a user: a warning (Python's, absl's, TensorFlow's), a
# deprecation, a traceback, an error on a healthy path, TensorFlow's C++
# log lines (`I0000 ...`, `E0000 ... failed call to cuInit`).
MISLEADING = re.compile(r'warn|deprecat|traceback|\berror\b|cuInit|'
                        r'absl::InitializeLog', re.I)


# The export's probabilities for images.npy, saved to probabilities.npy.
PROBABILITIES = """
import os, sys
import numpy as np
import tensorflow as tf
home = sys.argv[1]
serve = tf.saved_model.load(os.path.join(home, 'export')).signatures[
    'serving_default']
images = tf.constant(np.load(os.path.join(home, 'images.npy')))
np.save(os.path.join(home, 'probabilities.npy'),
        serve(images=images)['probabilities'].numpy())
"""


def misleading(text):
  """The lines of text that would mislead a user."""
  return [l for l in text.splitlines() if MISLEADING.search(l) or
          log_filter.CPP_LOG_LINE.match(l.encode())]


def section(page, heading):
  """The text of a page's `## heading` section, up to the next one."""
  with open(os.path.join(ROOT, page), encoding='utf-8') as f:
    text = f.read()
  return re.search(r'^## %s\n(.*?)(?=^## |\Z)' % re.escape(heading), text,
                   re.M | re.S).group(1)


def sh_commands(text):
  """The commands of text's ```sh blocks, in order, continuations joined,
  without comments."""
  commands = []
  for block in re.findall(r'^```sh\n(.*?)^```', text, re.M | re.S):
    for line in block.replace('\\\n', ' ').splitlines():
      line = ' '.join(line.split())
      if line and not line.startswith('#'):
        commands.append(line)
  return commands


def argv(command, *extra):
  """A README command as this checkout runs it from another folder: its
  python3 this interpreter, its scripts this checkout's; extra appended."""
  words = shlex.split(command)
  if words[0] == 'python3':
    words[0] = sys.executable
  words = [os.path.join(ROOT, w) if os.path.isfile(os.path.join(ROOT, w))
           else w for w in words]
  return words + list(extra)


def with_steps(command, steps):
  """The command with its --max_steps=N made steps."""
  changed = re.sub(r'--max_steps=\d+', '--max_steps=%d' % steps, command)
  assert changed != command, command
  return changed


def assert_own_lines(name, text, extra=()):
  """A trainer task printed the suite's lines only (and those of extra,
  regular expressions), none of them misleading."""
  strange = [l for l in text.splitlines() if not OWN_LINE.fullmatch(l) and
             not any(re.fullmatch(e, l) for e in extra)]
  assert not strange and not misleading(text), '%s:\n%s' % (name, text)


SCRIPT_LINES = (r'Wrote 10000 training and 2000 test records of synthetic '
                r'CIFAR-10 to \./synthetic-cifar-10-batches-bin',
                r'Data: synthetic data in .+', r'Starting fresh in .+',
                r'Resuming .+ from step \d+ to --max_steps=\d+',
                r'Logs: .+', r'Cluster: ps .+', r'Final: .+',
                r'Results: .+')


def run_quickstart(home, command, steps, again=False):
  """The quickstart's script with steps (again: after a first run, whose
  logs it keeps in logs/previous/); returns what it printed, after checking
  it and each task's log."""
  code, out = run_in_group(argv(command, '--max_steps=%d' % steps,
                                *SHORT_SCRIPT),
                           timeout=300, cwd=home, env=suite_env())
  assert code == 0, out
  assert_own_lines('run_local_cluster.sh', out, SCRIPT_LINES)
  assert re.search(r'^Final: .*: step %d, loss = \d+\.\d\d ,Test accuracy = '
                   r'\d\.\d{4} \(2000 examples\)$' % steps, out, re.M), out
  logs = os.path.join(home, 'logs')
  tasks = ['evaluator.log', 'ps0.log', 'worker0.log', 'worker1.log']
  assert sorted(os.listdir(logs)) == sorted(tasks + ['previous'] * again)
  if again:
    assert sorted(os.listdir(os.path.join(logs, 'previous'))) == tasks
  for name in tasks:
    with open(os.path.join(logs, name)) as f:
      assert_own_lines(name, f.read())
  with open(os.path.join(logs, 'worker0.log')) as f:
    return out, f.read()


def serving(home, command, port):
  """TensorBoard as documented, on port, until it serves; then Ctrl-C.
  Returns (its lines, its exit status)."""
  log_path = os.path.join(home, 'tensorboard.out')
  with open(log_path, 'w') as log:
    proc = subprocess.Popen(argv(command, '--port=%d' % port), cwd=home,
                            stdout=log, stderr=subprocess.STDOUT,
                            env=suite_env({'PYTHON': sys.executable}))
  try:
    ready = 'TensorBoard %s at http://localhost:%d/ (Press CTRL+C to quit)' % (
        importlib.metadata.version('tensorboard'), port)
    deadline = time.time() + 120  # A bound against a hang.
    while ready not in open(log_path).read():
      assert proc.poll() is None and time.time() < deadline, open(
          log_path).read()
      time.sleep(0.2)
    with urllib.request.urlopen('http://localhost:%d/' % port,
                                timeout=60) as page:
      assert page.status == 200
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=300)  # A bound against a hang (CI beside the
    # suite's other half once took more than 60 s).
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  with open(log_path) as f:
    return f.read(), code


@pytest.mark.slow
def test_the_readme_path_prints_nothing_misleading(tmp_path):
  home = str(tmp_path / 'checkout')  # The user's folder, all relative.
  os.makedirs(home)
  started = []  # The four terminals' processes, killed by PID at the end.
  try:
    walk(home, started)
  finally:
    for proc in started:
      if proc.poll() is None:
        proc.kill()
        proc.wait()


def walk(home, started):
  quickstart = section('README.md', 'Quickstart')
  install, command = sh_commands(quickstart)[0].split(' && ')
  assert install == 'pip install -r requirements.txt'  # Done already.
  assert command == 'bash scripts/run_local_cluster.sh --synthetic'

  # (1) The quickstart, from scratch.
  out, chief = run_quickstart(home, command, QUICKSTART)
  assert re.search(r'^Data: synthetic data in %s/synthetic-cifar-10-batches-'
                   r'bin \(5 files, 10000 records, sha256 [0-9a-f]{12}\.\.\.'
                   r'\)$' % re.escape(home), out, re.M), out
  assert 'Starting fresh in %s\n' % TRAIN_DIR in out

  # (2) Again, with a larger --max_steps: it resumes. The default
  # (exponential) schedule does not depend on --max_steps: no word of
  # another schedule.
  out, chief = run_quickstart(home, command, RESUMED, again=True)
  assert 'Resuming %s from step %d to --max_steps=%d\n' % (
      TRAIN_DIR, QUICKSTART, RESUMED) in out, out
  assert ('Worker 0: resuming from %s/models_cifar10_synthetic/model.ckpt-%d'
          % (home, QUICKSTART)) in chief.splitlines(), chief
  assert 'learning-rate schedule' not in chief, chief
  assert 'give every task the earlier flags' not in chief, chief

  # (3) The four terminals on the synthetic data, as the README says
  # offline, in a folder of their own (not the quickstart's, at its end):
  # the data (again: the same files), then each task, each its own
  # process, in the terminals' order; free ports for the defaults.
  four = section('README.md', 'A cluster in four terminals')
  said = ' '.join(four.split())
  make_data = re.search(r'offline: `(python3 [^`]+)`', said).group(1)
  folders = shlex.split(re.search(r'give each task `([^`]+)`',
                                  said).group(1))
  assert folders == ['--data_dir=./synthetic-cifar-10-batches-bin',
                     '--train_dir=./models_four_terminals']
  made = subprocess.run(argv(make_data), cwd=home, capture_output=True,
                        text=True, timeout=120, env=suite_env())
  assert (made.returncode, made.stderr) == (0, '')
  assert made.stdout == ('Wrote 10000 training and 2000 test records of '
                         'synthetic CIFAR-10 to ./synthetic-cifar-10-'
                         'batches-bin\n')
  tasks = [c for c in sh_commands(four) if 'train_distributed.py' in c]
  assert [re.search(r'--job_name=(\w+)( --task_index=(\d))?', c).group(0)
          for c in tasks] == ['--job_name=ps --task_index=0',
                              '--job_name=worker --task_index=1',
                              '--job_name=worker --task_index=0',
                              '--job_name=evaluator']
  ps, worker1, worker0 = ('localhost:%d' % p for p in free_ports(3))
  hosts = ['--ps_hosts=' + ps, '--worker_hosts=%s,%s' % (worker0, worker1)]
  names = ['ps0', 'worker1', 'worker0', 'evaluator']
  terminals = os.path.join(os.path.dirname(home), 'terminals')
  os.makedirs(terminals)
  for name, task in zip(names, tasks):
    with open(os.path.join(terminals, name + '.log'), 'w') as log:
      started.append(subprocess.Popen(
          argv(with_steps(task, TERMINALS), *folders, *SHORT_TASK,
               *(hosts if name != 'evaluator' else [])),
          cwd=home, stdout=log, stderr=subprocess.STDOUT, env=suite_env()))
  codes = [p.wait(timeout=300) for p in started]  # A bound against a hang.
  logs = {}
  for name in names:
    with open(os.path.join(terminals, name + '.log')) as f:
      logs[name] = f.read()
  assert codes == [0, 0, 0, 0], logs
  for name in names:
    assert_own_lines(name, logs[name])
  assert logs['ps0'].splitlines() == [
      'job_name : ps', 'task_index : 0',
      'ps 0: serving on %s; waiting for 2 worker(s) to finish' % ps,
      'ps 0: all 2 worker(s) finished; exiting']
  assert 'resuming from' not in logs['worker0'], logs['worker0']
  for name in 'worker0', 'worker1':
    assert logs[name].splitlines()[-1] == (
        'Worker %s: training finished at global step %d' % (name[-1],
                                                            TERMINALS))
  assert re.fullmatch(r'.*: step %d, loss = \d+\.\d\d ,Test accuracy = '
                      r'\d\.\d{4} \(2000 examples\)' % TERMINALS,
                      logs['evaluator'].splitlines()[-1]), logs['evaluator']

  # (4) TensorBoard, as docs/running.md (the README's link for it) gives
  # it for the quickstart's run: TensorBoard's own lines, as documented.
  board = section('docs/running.md', 'TensorBoard')
  said = ' '.join(board.split())
  found = re.search(r'Watch it with `(bash scripts/tensorboard\.sh '
                    r'--logdir=)\./models_cifar10` \(the quickstart\'s: `'
                    r'([^`]+)`', said)
  assert found and found.group(2) == TRAIN_DIR, said
  port, = free_ports(1)
  out, code = serving(home, found.group(1) + found.group(2), port)
  documented = re.search(r'TensorBoard\'s own\s+lines only:\n\n```\n(.*?)```',
                         board, re.S).group(1)
  # (Its version the one installed: TensorFlow before 2.21 brings its own.)
  assert out == re.sub(
      r'TensorBoard [\d.]+ at', 'TensorBoard %s at' % importlib.metadata.version(
          'tensorboard'), documented.replace(':6006/', ':%d/' % port)), out
  assert not [l for l in out.splitlines() if log_filter.CPP_LOG_LINE.match(
      l.encode()) or re.search(r'warn|deprecat|traceback|cuInit', l, re.I)]
  assert code == 0, out

  # (5) The export and the classifier, as the README gives them, on a
  # PNG of a test record the model gets right.
  export, classify = sh_commands(section(
      'README.md', 'From a trained run to a classified photo'))
  done = subprocess.run(argv(export), cwd=home, capture_output=True,
                        text=True, timeout=120, env=suite_env())
  # The quickstart's run, as the README says: at its resume's step.
  checkpoint = '%s/models_cifar10_synthetic/model.ckpt-%d' % (home, RESUMED)
  assert (done.returncode, done.stderr) == (0, ''), done.stderr
  assert done.stdout.splitlines() == [
      'Exported %s (global step %d, the moving averages of its weights) to '
      '%s/export' % (checkpoint, RESUMED, home),
      'serving_default: images uint8 [N,32,32,3], standardized -> '
      'probabilities [N,10], class_index [N], class_name [N] of 10 classes: '
      + ', '.join(NAMES)]
  records = np.fromfile(os.path.join(
      home, 'synthetic-cifar-10-batches-bin', 'test_batch.bin'),
                        np.uint8).reshape(-1, 3073)
  images = records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
  # In a fresh interpreter, eager as a user's (this one may be in graph
  # mode, left so by another test).
  np.save(os.path.join(home, 'images.npy'), images)
  done = subprocess.run([sys.executable, '-c', PROBABILITIES, home],
                        capture_output=True, text=True, timeout=120,
                        env=suite_env())
  assert done.returncode == 0, done.stderr
  probabilities = np.load(os.path.join(home, 'probabilities.npy'))
  right = np.flatnonzero(np.argmax(probabilities, 1) == records[:, 0])
  assert right.size, 'the model got no test record right'
  record = right[0]
  Image.fromarray(images[record]).save(os.path.join(home, 'record.png'))
  words = shlex.split(classify)
  assert words[-2:] == ['ring.png', 'disc.jpg']  # The README's photos.
  done = subprocess.run(argv(shlex.join(words[:-2]), 'record.png'),
                        cwd=home, capture_output=True, text=True,
                        timeout=120, env=suite_env())
  assert (done.returncode, done.stderr) == (0, ''), done.stderr
  top = np.argsort(-probabilities[record], kind='stable')[:3]
  assert done.stdout == 'record.png: %s\n' % ', '.join(
      '%s %.2f' % (NAMES[i], probabilities[record][i]) for i in top)
  assert done.stdout.startswith('record.png: %s ' % NAMES[records[record,
                                                                   0]])
