"""Every process of the suite computes with oneDNN's kernels on an x86 CPU
of any kind (training/process.py), which TensorFlow would turn on by itself
only on CPUs with AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX; the caller's
TF_ENABLE_ONEDNN_OPTS=0 still turns them off."""

import os
import platform
import subprocess
import sys

import pytest

from helpers import ROOT
import helpers

# What TensorFlow logs (at level 0) as it loads when oneDNN is on.
ON = 'oneDNN custom operations are on'
# A process started as the suite's are, then TensorFlow loaded.
STARTED = ('from training import process\n'
           'process.start()\n'
           'import os\n'
           'import tensorflow as tf\n'
           'print(tf.reduce_sum(tf.ones([2, 2])).numpy())\n'
           "print(os.environ['TF_ENABLE_ONEDNN_OPTS'])\n")


def start_and_load(**env):
  """(exit status, stdout, stderr) of STARTED at TF_CPP_MIN_LOG_LEVEL=0."""
  proc = subprocess.run(
      [sys.executable, '-c', STARTED], cwd=ROOT, capture_output=True,
      text=True, timeout=300,
      env=helpers.suite_env(dict(env, TF_CPP_MIN_LOG_LEVEL='0')))
  return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.skipif(platform.machine() not in ('x86_64', 'AMD64'),
                    reason='oneDNN is turned on on x86 CPUs only')
def test_onednn_is_on_whatever_the_cpu_and_off_when_the_caller_says():
  assert 'TF_ENABLE_ONEDNN_OPTS' not in os.environ  # helpers drops TF_*.
  status, out, err = start_and_load()
  assert status == 0, err
  assert out == '4.0\n1\n'
  assert ON in err, err
  status, out, err = start_and_load(TF_ENABLE_ONEDNN_OPTS='0')
  assert status == 0, err
  assert out == '4.0\n0\n'
  assert ON not in err, err
