"""Every process of the suite computes with oneDNN's kernels on an x86 CPU
of any kind (training/runtime/process.py), which TensorFlow would turn on by itself
only on CPUs with AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX; the caller's
TF_ENABLE_ONEDNN_OPTS=0 still turns them off."""

import os
import platform
import subprocess
import sys

import pytest

from helpers import ROOT
import helpers
from training.runtime import process

# A process started as the suite's, then TensorFlow loaded: what TensorFlow
# decided (its own switch, read once as it loads; an internal function,
# as TensorFlow's own tests ask it), and a computation.
STARTED = ('import os\n'
           'from training.runtime import process\n'
           'process.start()\n'
           'import tensorflow as tf\n'
           'from tensorflow.python.util import _pywrap_util_port\n'
           'print(tf.reduce_sum(tf.ones([2, 2])).numpy())\n'
           'print(_pywrap_util_port.IsMklEnabled())\n'
           "print(os.environ['TF_ENABLE_ONEDNN_OPTS'])\n")


def start_and_load(**env):
  """(exit status, stdout, stderr) of STARTED."""
  proc = subprocess.run(
      [sys.executable, '-c', STARTED], cwd=ROOT, capture_output=True,
      text=True, timeout=300, env=helpers.suite_env(env))
  return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.slow
@pytest.mark.skipif(platform.machine() not in ('x86_64', 'AMD64'),
                    reason='oneDNN is turned on on x86 CPUs only')
def test_onednn_is_on_whatever_the_cpu_and_off_when_the_caller_says():
  assert 'TF_ENABLE_ONEDNN_OPTS' not in os.environ  # helpers drops TF_*.
  status, out, err = start_and_load()
  assert status == 0, err
  assert out == '4.0\nTrue\n1\n'
  status, out, err = start_and_load(TF_ENABLE_ONEDNN_OPTS='0')
  assert status == 0, err
  assert out == '4.0\nFalse\n0\n'


@pytest.mark.parametrize('machine, given, kept', [
    ('x86_64', None, '1'), ('AMD64', None, '1'), ('x86_64', '0', '0'),
    ('aarch64', None, None), ('arm64', None, None)])
def test_the_default_is_set_on_x86_only_and_never_over_the_callers(
    monkeypatch, machine, given, kept):
  monkeypatch.setattr(platform, 'machine', lambda: machine)
  monkeypatch.delenv('TF_ENABLE_ONEDNN_OPTS', raising=False)
  if given is not None:
    monkeypatch.setenv('TF_ENABLE_ONEDNN_OPTS', given)
  process.tensorflow_defaults()
  assert os.environ.get('TF_ENABLE_ONEDNN_OPTS') == kept
