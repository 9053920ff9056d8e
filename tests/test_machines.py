"""Machines of their own on one host (tools/machines.py, tools/cpu_shares.py)
and the scaling run over them (tools/scaling_run.py): a share holds a task
to its cores, nothing is left after a run that fails or is interrupted, bad
input is one line. Needs root, cgroups and iproute2, as CI has."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from helpers import ROOT, run_in_group, wait_until
import cpu_shares
import machines
import network_namespaces

SCALING = os.path.join(ROOT, 'tools', 'scaling_run.py')
BUSY = 'import time\nend = time.time() + %f\nwhile time.time() < end: pass\n'

pytestmark = pytest.mark.skipif(
    machines.why_unavailable() is not None,
    reason='machines of their own %s' % machines.why_unavailable())


def cpu_of_busy_loop(prefix, secs):
  """Runs a busy loop for secs under prefix; its CPU seconds per second."""
  start = time.time()
  proc = subprocess.Popen(prefix + [sys.executable, '-c', BUSY % secs])
  _, status, usage = os.wait4(proc.pid, 0)
  proc.returncode = os.waitstatus_to_exitcode(status)
  assert proc.returncode == 0
  return (usage.ru_utime + usage.ru_stime) / (time.time() - start)


@pytest.mark.alone  # It measures a process's CPU against the wall clock.
def test_a_task_in_its_own_cgroup_is_held_to_its_share():
  shares = cpu_shares.CpuShares()
  try:
    shares.make('free')  # Not held: a busy loop takes a whole core.
    shares.make('quarter', 0.25)
    free = cpu_of_busy_loop(shares.prefix_for('free'), 2.0)
    quarter = cpu_of_busy_loop(shares.prefix_for('quarter'), 2.0)
    periods, throttled = shares.throttled('quarter')
  finally:
    shares.close()
  assert free > 0.6, free
  # The quota is 2.5 ms of every 10: a quarter of a core, the start of
  # Python included; throttled in nearly every period it ran.
  assert 0.15 < quarter <= 0.25 * 1.1, quarter
  assert throttled >= 0.8 * periods > 0
  assert not cpu_shares.owned(os.getpid())


def test_a_task_held_to_half_a_core_sizes_its_threads_to_it():
  """TensorFlow sizes its pools to every core a process may run on; a task
  in a cgroup held to half a core (a container's limit) counts 1, for a
  worker's intra-op threads and a ps's pools alike."""
  cores = len(os.sched_getaffinity(0))
  if cores < 2:
    pytest.skip('one core: a quota of half of it changes nothing')
  code = ('import sys; sys.path.insert(0, %r)\n'
          'from training.cluster import session_config as s\n'
          'print(s.usable_cores(), s.intra_op_threads(["w:1"], 0), '
          's.ps_threads(["p:1"], ["w:1"], 0))' % ROOT)
  shares = cpu_shares.CpuShares()
  try:
    found = {}
    for task, share in (('free', None), ('half', 0.5)):
      shares.make(task, share)
      found[task] = subprocess.run(
          shares.prefix_for(task) + [sys.executable, '-c', code],
          capture_output=True, text=True, check=True,
          timeout=120).stdout.split()
  finally:
    shares.close()
  assert found == {'free': [str(cores)] * 3, 'half': ['1'] * 3}


def test_a_free_share_gets_its_quota_when_set_and_close_kills_and_removes():
  shares = cpu_shares.CpuShares()
  try:
    path = shares.make('boot')
    quota = 'cpu.max' if shares.version == 'v2' else 'cpu.cfs_quota_us'
    with open(os.path.join(path, quota)) as f:
      assert f.read().split()[0] in ('max', '-1')
    shares.set('boot', 0.3)
    with open(os.path.join(path, quota)) as f:
      assert f.read().split()[0] == '3000'
    # A process still in the group is killed when it is removed.
    sleeper = subprocess.Popen(shares.prefix_for('boot') + ['sleep', '60'])
    wait_until(lambda: cpu_shares.pids_in(path), 10, 'the sleeper in its '
               'group', None)
  finally:
    shares.close()
  assert sleeper.wait(timeout=10) == -signal.SIGKILL
  assert not os.path.exists(path)


def start_scaling(tmp_path, *flags, output=subprocess.PIPE):
  """Starts tools/scaling_run.py in a session of its own."""
  return subprocess.Popen(
      [sys.executable, SCALING, '--work_dir=%s' % (tmp_path / 'work')] +
      list(flags), stdout=output, stderr=subprocess.STDOUT, text=True,
      start_new_session=True)


def end(proc):
  """Kills the run's group if it still runs, reaps it, and removes what a
  killed run left (so a failing test leaks no cgroup or namespace)."""
  if proc.poll() is None:
    os.killpg(proc.pid, signal.SIGKILL)
  proc.wait()
  machines.sweep()


def processes_naming(text):
  """The PIDs of live processes whose command line holds text."""
  found = []
  for pid in os.listdir('/proc'):
    try:
      with open('/proc/%s/cmdline' % pid, 'rb') as f:
        if text.encode() in f.read():
          found.append(int(pid))
    except (OSError, ValueError):
      pass
  return [p for p in found if p != os.getpid()]


def can_unshare():
  return subprocess.run(['unshare', '--user', 'true'],
                        capture_output=True).returncode == 0


@pytest.mark.parametrize('why', ['not_root', 'share_too_large',
                                 'too_many_machines', 'bad_mode'])
def test_bad_input_is_one_line_and_exit_2(tmp_path, tiny_data, why):
  cores = machines.host_cores()
  if why == 'not_root' and not can_unshare():
    pytest.skip('unshare --user is not allowed here')
  # Machines of half a core: one fits a core (0.85 of it is lent), so
  # twice as many workers as cores and a ps need 3 a core on some core.
  flags = {'not_root': [],
           'share_too_large': ['--share=1.5'],
           'too_many_machines': ['--workers=1,%d' % (2 * cores),
                                 '--share=0.5'],
           'bad_mode': ['--modes=sync,lockstep']}[why]
  # A user namespace of its own: the tool runs as nobody (65534), without
  # root's privileges on this host.
  prefix = ['unshare', '--user'] if why == 'not_root' else []
  code, out = run_in_group(prefix + [
      sys.executable, SCALING, '--data_dir=' + tiny_data,
      '--work_dir=%s' % (tmp_path / 'work')] + flags, 120)
  assert code == 2, out
  lines = [l for l in out.splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith('Error: '), out
  assert {'not_root': 'run it with sudo',
          'share_too_large': "--share=1.5: a machine is held to a share of "
                             "one of this host's %d cores" % cores,
          'too_many_machines': '%d machines of 0.5 cores need %d a core' % (
              2 * cores + 1, -(-(2 * cores + 1) // cores)),
          'bad_mode': 'got lockstep'}[why] in lines[0]
  assert not (tmp_path / 'work').exists() or not os.listdir(
      tmp_path / 'work')
  machines.sweep()  # Had it started machines after all.


def leftovers(pid):
  return cpu_shares.owned(pid) + network_namespaces.leftovers(pid)


def test_a_failed_run_leaves_no_cgroup_namespace_or_process(tmp_path):
  # No data: the trainer exits 2 at its start, the run with it.
  proc = start_scaling(tmp_path, '--data_dir=%s' % (tmp_path / 'none'),
                       '--quick')
  try:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, out
    assert 'one_process: worker0 exited with 2 (Error: data directory' in out
    assert not leftovers(proc.pid)
    assert not processes_naming(str(tmp_path / 'work'))
  finally:
    end(proc)


@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_leaves_no_cgroup_namespace_or_process(
    tmp_path, tiny_data, signum):
  proc = start_scaling(tmp_path, '--data_dir=' + tiny_data, '--quick')
  tasks = []
  try:
    # Interrupted once its first machine runs the trainer.
    def running():
      groups = cpu_shares.owned(proc.pid)
      tasks[:] = [p for g in groups for p in cpu_shares.pids_in(g)]
      return tasks
    wait_until(running, 120, 'a task in its machine', None)
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, out
    assert not leftovers(proc.pid)
    for pid in tasks:
      assert not os.path.exists('/proc/%d' % pid) or open(
          '/proc/%d/stat' % pid).read().split()[2] == 'Z'
    assert not processes_naming(str(tmp_path / 'work'))
  finally:
    end(proc)


@pytest.mark.alone  # Another test's run would sweep what this one leaves.
def test_a_killed_runs_machines_are_swept_by_the_next(tmp_path, tiny_data):
  proc = start_scaling(tmp_path, '--data_dir=' + tiny_data, '--quick',
                       output=subprocess.DEVNULL)
  try:
    wait_until(lambda: cpu_shares.owned(proc.pid) and
               network_namespaces.leftovers(proc.pid), 120,
               'its machines', None)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert leftovers(proc.pid)  # SIGKILL: it could remove nothing.
    # The next run removes them first (and then fails: no data).
    after = start_scaling(tmp_path, '--data_dir=%s' % (tmp_path / 'none'),
                          '--quick')
    try:
      out, _ = after.communicate(timeout=300)
    finally:
      end(after)
    assert re.search(r'^Removed \d+ cgroups and namespaces of an earlier run '
                     r'that was killed\.$', out, re.M), out
    assert not leftovers(proc.pid)
  finally:
    end(proc)


def chief_lines(log):
  """[(time, global step)] of a chief's progress lines, read here."""
  from training.runtime import progress  # pylint: disable=g-import-not-at-top
  with open(log) as f:
    return [(l.time.timestamp(), l.step) for l in progress.parse(f.read())]


@pytest.mark.slow
def test_the_quick_scaling_run(tmp_path, tiny_data):
  work = tmp_path / 'work'
  proc = start_scaling(tmp_path, '--data_dir=' + tiny_data, '--quick',
                       '--steps=10', '--one_process_steps=12',
                       '--batch_size=16',
                       # Small machines: steps long enough for the CPU
                       # sampler's 0.1 s.
                       '--share=0.1')
  try:
    out, _ = proc.communicate(timeout=600)
    left = leftovers(proc.pid)  # Before end() sweeps them.
  finally:
    end(proc)
  assert proc.returncode == 0, out
  assert not left
  results = json.loads((work / 'scaling.json').read_text())
  share = results['share']
  assert share == 0.1
  # One round: one process's step measured once, before it, for the planner.
  assert len(results['one_process_steps_ms']) == 1
  assert len(results['one_process_step_cvs']) == 1
  # Its step: the mean over a window of --one_process_steps of its steps.
  lines = chief_lines(work / 'one_process-worker0.log')
  step_s = results['one_process_steps_ms'][0] / 1e3
  assert any(b[1] - a[1] == 12 and b[0] - a[0] == pytest.approx(12 * step_s)
             for a, b in zip(lines, lines[12:]))
  runs = results['runs']
  # 1 and 2 synchronous workers on the first link, once; 1 worker + 1 ps,
  # the baseline of linear, among them.
  assert {(r['workers'], r['mode'], r['round'], r['gbit']) for r in runs} == {
      (1, 'sync', 0, 1.0), (2, 'sync', 0, 1.0)}
  assert any((r['workers'], r['ps']) == (1, 1) for r in runs)
  for r in runs:
    name = 'r0_1g_%dw_sync_%dps' % (r['workers'], r['ps'])
    lines = chief_lines(work / ('%s-worker0.log' % name))
    t0, g0, t1, g1 = r['window']
    # The window: --steps of the chief's own steps, read from its log.
    assert lines.index((t0, g0)) + 10 == lines.index((t1, g1))
    assert r['images_per_sec'] == pytest.approx(
        (g1 - g0) * 16 * r['workers'] / (t1 - t0))
    # Each machine held to its share over the window (the sampler's 0.1 s
    # steps allow some slack).
    for task, cores in r['cpu_cores'].items():
      assert cores <= share * 1.3, (task, cores)
      if task.startswith('worker'):  # Training, not stalled.
        assert cores >= share * 0.3, (task, cores)
    assert ('| 1 Gbit/s | %d | sync | %d |' % (r['workers'], r['ps'])
            in out)
  assert (work / 'scaling.png').read_bytes()[:4] == b'\x89PNG'
