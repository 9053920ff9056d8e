"""The scaling run's report (tools/scaling_report.py) through
tools/scaling_run.py --report_only, in a real process: no root, cgroups or
namespaces needed, so it runs wherever the suite does."""

import json
import os
import subprocess
import sys

import pytest

from helpers import ROOT

SCALING = os.path.join(ROOT, 'tools', 'scaling_run.py')


def write_three_rounds(folder):
  """Three rounds of 1 and 2 sync workers at 0.12 core, by hand; their
  one-process steps 224, 179 and 176 ms (spreads 0.1, 0.06, 0.06)."""
  runs = [dict(round=r, gbit=10.0, workers=w, mode='sync', ps=1, mbit=600.0,
               images_per_sec=rate)
          for w, rates in ((1, (120.0, 110.0, 130.0)),
                           (2, (200.0, 190.0, 230.0)))
          for r, rate in enumerate(rates)]
  (folder / 'scaling.json').write_text(json.dumps(dict(
      share=0.12, machine_cores=2.0, batch_size=32, host_cores=2,
      cpu='a CPU', latency_us=0.0, one_process_steps_ms=[224.0, 179.0, 176.0],
      one_process_step_cvs=[0.1, 0.06, 0.06], runs=runs)))


@pytest.mark.slow
def test_the_report_takes_the_median_one_process_step(tmp_path):
  # The planner starts from the median one-process step, 179 ms, and the
  # median spread, 0.06.
  write_three_rounds(tmp_path)
  proc = subprocess.run(
      [sys.executable, SCALING, '--data_dir=unused', '--report_only',
       '--work_dir=' + str(tmp_path)], capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr
  out = proc.stdout
  assert ("one process's step on one machine 179 (176-224) ms; rounds: 3."
          in out)
  # By hand, 600 Mbit/s, machines of 0.12 cores: 1 worker 179 (its link's
  # 9.915 ms, 1.86 x, hide in 0.33 x 179) + (1.3 + 5.35) / 0.12 = 55.417 of
  # RPCs = 234.417 ms: 136.5 images/s. 2 workers: the transfers (1.26 x the
  # ps link's 19.829 + 0.60 x 9.915) hide too, 55.417 of RPCs, the slowest
  # of 2 steps 0.06 x 179 x 0.5642 = 6.060 later: 240.476 ms, 266.1
  # images/s (ps 0: (9.9 + 2 x 4.4) / 0.12 = 155.8 ms, below). Linear:
  # twice each round's 1 worker.
  assert '| 10 Gbit/s | 1 | sync | 1 | 120.0 (110.0-130.0) | 1.00 ' \
         '(1.00-1.00) | 137 | +14% |' in out
  assert '| 10 Gbit/s | 2 | sync | 1 | 200.0 (190.0-230.0) | 0.86 ' \
         '(0.83-0.88) | 266 | +33% |' in out
  assert (tmp_path / 'scaling.png').read_bytes()[:4] == b'\x89PNG'


@pytest.mark.slow
def test_the_report_predicts_with_measured_constants(tmp_path):
  """The first test's rounds, the planner's RPC CPU from a file of
  scripts/calibrate_planner.py's: a synchronous step's 0.1 core-ms, each
  ps's 0.5, ps 0's nothing. By hand, machines of 0.12 cores: 1 worker 179
  + 0.6 / 0.12 = 184 ms, 173.9 images/s; 2 workers 179 + 5 + the slowest of
  2 steps 6.060 = 190.06 ms, 336.7 images/s."""
  write_three_rounds(tmp_path)
  constants = dict.fromkeys(('SYNC_RPC_MS', 'ASYNC_RPC_MS', 'PS_RPC_MS',
                             'PS_WORKER_MS', 'PS_UPDATE_MS', 'PS_ASYNC_MS'),
                            0.0)
  constants.update(SYNC_RPC_MS=0.1, PS_RPC_MS=0.5)
  (tmp_path / 'c.json').write_text(json.dumps(dict(machine='a test machine',
                                                   constants=constants)))
  proc = report('--report_only', '--work_dir=' + str(tmp_path),
                '--constants=%s' % (tmp_path / 'c.json'))
  assert proc.returncode == 0, proc.stderr
  out = proc.stdout
  assert out.startswith('The planner with the constants measured on a test '
                        'machine\n')
  assert '| 10 Gbit/s | 1 | sync | 1 | 120.0 (110.0-130.0) | 1.00 ' \
         '(1.00-1.00) | 174 |' in out
  assert '| 10 Gbit/s | 2 | sync | 1 | 200.0 (190.0-230.0) | 0.86 ' \
         '(0.83-0.88) | 337 |' in out
  (tmp_path / 'bad.json').write_text('{}')
  proc = report('--report_only', '--work_dir=' + str(tmp_path),
                '--constants=%s' % (tmp_path / 'bad.json'))
  assert (proc.returncode, proc.stderr) == (
      2, 'Error: --constants=%s: %s holds no constants; measure them with '
      'scripts/calibrate_planner.py\n' % ((tmp_path / 'bad.json',) * 2))


def write_run(folder, share, steps, rounds, cv=0.05, cpu='a CPU'):
  """A scaling.json of rounds of 1 worker + 1 ps (images/s a round)."""
  os.makedirs(folder, exist_ok=True)
  runs = [dict(round=r, gbit=10.0, workers=1, mode='sync', ps=1, mbit=600.0,
               images_per_sec=rate) for r, rate in enumerate(rounds)]
  with open(os.path.join(folder, 'scaling.json'), 'w') as f:
    json.dump(dict(share=share, machine_cores=2.0, batch_size=32,
                   host_cores=2, cpu=cpu, latency_us=0.0,
                   one_process_steps_ms=steps,
                   one_process_step_cvs=[cv] * len(steps), runs=runs), f)


def report(*flags):
  return subprocess.run([sys.executable, SCALING, '--data_dir=unused'] +
                        list(flags), capture_output=True, text=True,
                        timeout=300)


@pytest.mark.slow
def test_a_pool_of_runs_takes_all_their_rounds(tmp_path):
  write_run(tmp_path / 'a', 0.12, [200.0, 220.0], [110.0, 120.0])
  write_run(tmp_path / 'b', 0.12, [240.0], [130.0], cv=0.2)
  proc = report('--report_only', '--work_dir=%s' % (tmp_path / 'both'),
                '--pool=%s,%s' % (tmp_path / 'a', tmp_path / 'b'))
  assert proc.returncode == 0, proc.stderr
  # The three rounds one after another, the planner from the median of
  # the three one-process steps, 220 ms (of the runs' medians: 225).
  assert ("one process's step on one machine 220 (200-240) ms; rounds: 3."
          in proc.stdout)
  assert '| 10 Gbit/s | 1 | sync | 1 | 120.0 (110.0-130.0) | 1.00 ' \
         '(1.00-1.00) |' in proc.stdout
  pooled = json.loads((tmp_path / 'both' / 'scaling.json').read_text())
  assert [(r['round'], r['images_per_sec']) for r in pooled['runs']] == [
      (0, 110.0), (1, 120.0), (2, 130.0)]
  assert pooled['one_process_step_cvs'] == [0.05, 0.05, 0.2]


def test_a_pool_of_another_host_or_machines_is_one_line(tmp_path):
  write_run(tmp_path / 'a', 0.12, [200.0], [110.0])
  write_run(tmp_path / 'b', 0.25, [100.0], [230.0])
  proc = report('--report_only', '--work_dir=%s' % (tmp_path / 'both'),
                '--pool=%s,%s' % (tmp_path / 'a', tmp_path / 'b'))
  assert proc.returncode == 2
  assert proc.stdout == ''
  assert proc.stderr == (
      'Error: --pool: runs of another host, machines or batch (share 0.25 '
      'against 0.12); pool runs of one command line\n')
  # The same machines on another host: not one run's rounds either.
  write_run(tmp_path / 'c', 0.12, [200.0], [110.0], cpu='another CPU')
  proc = report('--report_only', '--work_dir=%s' % (tmp_path / 'both'),
                '--pool=%s,%s' % (tmp_path / 'a', tmp_path / 'c'))
  assert (proc.returncode, proc.stderr) == (
      2, 'Error: --pool: runs of another host, machines or batch (cpu '
      'another CPU against a CPU); pool runs of one command line\n')


def test_a_pool_without_report_only_is_one_line(tmp_path):
  write_run(tmp_path / 'a', 0.12, [200.0], [110.0])
  proc = report('--work_dir=%s' % tmp_path, '--pool=%s' % (tmp_path / 'a'))
  assert (proc.returncode, proc.stderr) == (
      2, 'Error: --pool makes a report of runs made: add --report_only\n')
