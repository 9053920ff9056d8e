"""The measuring tools' parts that need no cluster: oneDNN's split of a
step (tools/onednn_split.py), ps 0's CPU reading (tools/ps_cpu.py) and the
straggler run's pacer (tools/straggler_run.py), each on hand-made input or
a real process of its own; ps_cpu.py end to end in the slow tier."""

import os
import re
import subprocess
import sys
import threading

import pytest

from helpers import ROOT, run_in_group, suite_env

import onednn_split
import ps_cpu
import straggler_run


def verbose(kind, direction, shape, ms, impl='brg:avx512_core'):
  """One ONEDNN_VERBOSE=1 line of a primitive's run, as oneDNN 3 prints it."""
  return ','.join(['onednn_verbose', 'v1', 'primitive', 'exec', 'cpu', kind,
                   impl, direction, 'src:f32::blocked:acdb::f0', '', 'alg:x',
                   shape, str(ms)])


def test_onednn_split_sums_the_measured_half_a_step():
  """4 steps, one convolution call each (1, 2, 3, 4 ms) and two of a
  pooling (0.5 ms each): the first 2 steps are the warmup, so 3.5 ms and
  1.0 ms a step. Left out, first: an info line, a primitive's creation (not
  a run) and a run whose time is not a number (counted, each would move the
  warmup's cut: 4.5 ms)."""
  lines = ['onednn_verbose,v1,info,oneDNN v3.5',
           verbose('convolution', 'forward_training', 'mb32ic3oc64', 9).replace(
               ',exec,', ',create:cache_miss,'),
           verbose('convolution', 'forward_training', 'mb32ic3oc64', 'n/a')]
  for step in range(4):
    lines.append(verbose('convolution', 'forward_training', 'mb32ic3oc64',
                         step + 1))
    lines += [verbose('pooling', 'forward_training', 'mb32ic64', 0.5,
                      impl='jit:avx512')] * 2
  table = onednn_split.primitives(lines, 4)
  assert table == {
      ('convolution', 'forward_training', 'mb32ic3oc64'):
          ['brg:avx512_core', 3.5],
      ('pooling', 'forward_training', 'mb32ic64'): ['jit:avx512', 1.0]}
  text = onednn_split.table((table, 10.0), ({
      ('convolution', 'forward_training', 'mb32ic3oc64'): ['x', 7.0]}, 20.0))
  assert text.splitlines()[2:] == [
      '| convolution forward_training | mb32ic3oc64 | 3.50 | 7.00 | 0.50 |',
      '| pooling forward_training | mb32ic64 | 1.00 | 0.00 |  |',
      '| all of oneDNN | | 4.5 | 7.0 | 0.64 |',
      '| the step, wall | | 10.0 | 20.0 | 0.50 |',
      '| outside oneDNN | | 5.5 | 13.0 | |']


def test_onednn_split_needs_four_steps(capsys):
  assert onednn_split.parse_args(['--data_dir=x', '--steps=4']).steps == 4
  with pytest.raises(SystemExit) as exit_:
    onednn_split.parse_args(['--data_dir=x', '--steps=3'])
  assert exit_.value.code == 2
  assert capsys.readouterr().err.endswith(
      'error: --steps must be 4 or more, got 3\n')


def test_ps_cpu_reads_a_process_cpu_as_the_kernel_counts_it():
  """This process's CPU by /proc, between two readings of os.times()
  (the same clock ticks), after some work."""
  sum(i * i for i in range(2_000_000))
  before = os.times()
  read = ps_cpu.cpu_ms(os.getpid())
  after = os.times()
  # In whole ms: os.times() gives seconds as floats (9.61 + 1.13 is
  # 10.739999...); both count clock ticks of 10 ms or less.
  assert round(1000 * (before.user + before.system)) <= round(read)
  assert round(read) <= round(1000 * (after.user + after.system))
  assert read > 0


def test_the_straggler_pacer_stops_and_continues_its_process():
  """pace() on a real process: seen stopped (state T in /proc) most of the
  time while it paces (200 ms of every 205), running once told to end, and
  it returns when the process is gone."""
  child = subprocess.Popen([sys.executable, '-c',
                            'import time; time.sleep(600)'])
  try:
    done = threading.Event()
    pacer = threading.Thread(target=straggler_run.pace,
                             args=(child.pid, done, 200, 5))
    pacer.start()

    def state():
      with open('/proc/%d/stat' % child.pid) as f:
        return f.read().rsplit(')', 1)[1].split()[0]

    # Stopped 200 ms of every 205: seen stopped in most of 50 readings
    # 10 ms apart (a pacer with the two swapped: in few).
    seen = []
    for _ in range(50):
      seen.append(state())
      threading.Event().wait(0.01)
    assert seen.count('T') > 25, seen
    done.set()
    pacer.join()
    assert state() in ('S', 'R')  # Continued: asleep in its sleep.
    child.kill()
    child.wait()
    gone = threading.Event()  # Set only if pace() does not return.
    bound = threading.Timer(60, gone.set)
    bound.start()
    straggler_run.pace(child.pid, gone)  # Gone: returns at once.
    bound.cancel()
    assert not gone.is_set()
  finally:
    child.kill()
    child.wait()


@pytest.mark.slow
def test_ps_cpu_measures_two_checkouts_in_rounds(tiny_data, tmp_path):
  """This checkout twice, one round of 1 ps + 2 workers from step 10 to 20:
  a line a run, and each checkout's median, the first's ratio to itself
  1.00."""
  code, out = run_in_group([
      sys.executable, os.path.join(ROOT, 'tools', 'ps_cpu.py'),
      '--data_dir=' + tiny_data, '--checkouts=%s,%s' % (ROOT, ROOT),
      '--workers=2', '--batch_size=16', '--rounds=1', '--from_step=10',
      '--to_step=20'], 600, env=suite_env({'TMPDIR': str(tmp_path)}))
  assert code == 0, out
  assert os.listdir(tmp_path) == []  # Its train dirs gone with it.
  runs = re.findall(r'^round 0, (.+): ([\d.]+) ms of ps 0 a worker step$',
                    out, re.M)
  assert [where for where, _ in runs] == [ROOT, ROOT]
  assert all(float(ms) > 0 for _, ms in runs)
  medians = re.findall(r'^(.+): median ([\d.]+) ms \(([\d.]+)\); x the '
                       r'first, by round: ([\d.]+)$', out, re.M)
  assert [(w, m == r) for w, m, r, _ in medians] == [(ROOT, True)] * 2
  assert medians[0][3] == '1.00'
