"""tools/benchmark.py runs end to end and writes consistent numbers.

Its slow-network runs need root and iproute2, as CI has; elsewhere the test
checks that the script says why it skipped them.
"""

import json
import os
import signal
import statistics
import subprocess
import sys

import pytest

import cifar10_model
from helpers import ROOT
import benchmark_network
import benchmark_report
import cpu_profile
import network_namespaces
from training.cluster import planner_model

# What --only picks of --quick, our synchronous cluster and TF2's own
# strategy (the rest, our asynchronous cluster, differs by a flag), and the
# baseline, which --only keeps.
PEER_ROW = "TF2's ParameterServerStrategy, 1 ps + 2 workers (async)"
SYNC_ROW = '1 ps + 2 workers, sync'
RUNS = {'single process', SYNC_ROW, PEER_ROW}
# PyTorch's rows (their runs: test_torch_peer.py).
TORCH_ROW = 'PyTorch, one process'
DDP_ROW = 'PyTorch DDP over gloo, 2 processes'
# The multiply-adds of an image through the net, by hand: each conv's
# output pixels x channels x kernel inputs, and the dense layer.
MULTIPLY_ADDS = (15 * 15 * 32 * 27 + 13 * 13 * 32 * 288 + 13 * 13 * 64 * 288 +
                 6 * 6 * 80 * 64 + 4 * 4 * 192 * 720 + 768 * 10)


@pytest.mark.slow
def test_benchmark_quick_run(tmp_path):
  out = tmp_path / 'bench.json'
  perf = cpu_profile.unavailable() is None  # As root, with perf: --perf.
  # In a session of its own: if it hangs, the group (its PID) is killed with
  # every task it started, not just the script.
  proc = subprocess.Popen(
      [sys.executable, os.path.join(ROOT, 'tools', 'benchmark.py'),
       '--quick', '--steps=16', '--batch_size=16', '--json', str(out),
       '--only=^1 ps \\+ 2 workers, sync$|^TF2.*\\(async\\)$'] +
      ['--perf'] * perf,
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
      cwd=str(tmp_path), start_new_session=True)
  try:
    stdout, _ = proc.communicate(timeout=400)
  finally:
    try:
      os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    proc.wait()
    # And the network namespaces of its slow-network runs, had it no time
    # to delete them.
    leftover = network_namespaces.leftovers(proc.pid)
    network_namespaces.delete(leftover)
  assert proc.returncode == 0, stdout
  assert not leftover
  results = json.loads(out.read_text())
  assert set(results['training']) == RUNS
  assert results['rounds'] == 1
  single = results['training']['single process']['images_per_sec']
  for name, run in results['training'].items():
    assert run['images_per_sec'] > 0, name
    # One round (--quick): the ratio is that round's.
    assert run['ratios'] == [run['images_per_sec'] / single], name
    assert run['ratio'] == run['ratios'][0], name
    # Each row of the printed table is the JSON's, rounded.
    assert '| %s | %.0f | %.2fx | %.2f |' % (
        name, run['images_per_sec'], run['ratio'], run['ratio']) in stdout, name
  # Each process's CPU in the steady state, per image: at the measured rate,
  # all the processes of a run use between a third of a core (they are
  # training) and this machine's cores (the sampler's 0.1 s steps and the
  # window's ends allow some slack).
  cores = len(os.sched_getaffinity(0))
  expected_tasks = {'single process': {'worker0'},
                    SYNC_ROW: {'ps0', 'worker0', 'worker1'},
                    PEER_ROW: {'ps0', 'worker0', 'worker1', 'coordinator'}}
  for name, run in results['training'].items():
    ms = run['cpu_ms_per_image']
    assert set(ms) == expected_tasks[name], name
    assert all(v > 0 for v in ms.values()), (name, ms)
    used = sum(ms.values()) * run['images_per_sec'] / 1e3  # Cores.
    assert 0.33 <= used <= cores * 1.25, (name, ms, used)
  if perf:
    assert_perf(results, stdout)
  assert set(results['input_cpu_ms_per_record']) == set(
      list(results['input'])[:3])
  for name, ms in results['input_cpu_ms_per_record'].items():
    # At most the cores' time per record it delivered, and some.
    assert 0.001 < ms <= cores * 1.25e3 / results['input'][name], name
  # Each row against TF2's strategy: its images/s over the peer's.
  peer = results['training'][PEER_ROW]['images_per_sec']
  for name in ('single process', SYNC_ROW):
    ratio = results['training'][name]['images_per_sec'] / peer
    assert results['against_tf2'][name] == {
        'ratio': pytest.approx(ratio), 'ratios': [pytest.approx(ratio)]}
    assert '| %s | %.2fx | %.2f |' % (name, ratio, ratio) in stdout
  assert set(results['against_tf2']) == {'single process', SYNC_ROW}
  assert results['against_pytorch'] == {}  # Not asked for.
  assert_peak(results, stdout)
  assert all(rate > 0 for rate in results['input'].values())
  assert results['bytes']['trainable_parameters'] == 179962
  startup = results['startup']
  assert 0 < startup['import_secs'] < startup['first_step_secs']
  assert startup['shutdown_secs'] >= 0
  assert_network(results, stdout, tmp_path / 'benchmark_network.png')


def test_each_of_our_rows_over_its_pytorch_row_round_by_round():
  """The PyTorch table: ours over theirs in each round (each a ratio to
  the round's single process), their median; TF2's table leaves PyTorch's
  rows out. Images/s written by hand, 3 rounds."""
  rates = {'single process': [1000., 1200., 900.],
           SYNC_ROW: [1100., 1150., 990.],
           TORCH_ROW: [800., 1000., 1000.],
           DDP_ROW: [1000., 1000., 900.],
           PEER_ROW: [500., 600., 450.]}
  measured = {name: [{'images_per_sec': r, 'first_step_secs': 1.0,
                      'shutdown_secs': 0.1, 'cpu_ms_per_image': {}}
                     for r in each] for name, each in rates.items()}
  training = benchmark_report.summarize(measured, num_workers={},
                                        num_gpus=0)
  pairs = benchmark_report.against_torch(training)
  assert pairs == {
      'single process': {'pytorch': TORCH_ROW, 'ratio': pytest.approx(1.2),
                         'ratios': [pytest.approx(1.25), pytest.approx(1.2),
                                    pytest.approx(0.9)]},
      SYNC_ROW: {'pytorch': DDP_ROW, 'ratio': pytest.approx(1.1),
                 'ratios': [pytest.approx(1.1), pytest.approx(1.15),
                            pytest.approx(1.1)]}}
  text = benchmark_report.torch_markdown({'against_pytorch': pairs})
  assert '| single process | %s | 1.20x | 1.25, 1.20, 0.90 |' % TORCH_ROW in (
      text)
  assert '| %s | %s | 1.10x | 1.10, 1.15, 1.10 |' % (SYNC_ROW, DDP_ROW) in (
      text)
  assert set(benchmark_report.against_tf2(training)) == {'single process',
                                                         SYNC_ROW}


def assert_peak(results, stdout):
  """FLOP an image trained: 2 a multiply-add, 3 passes; each row's share of
  the peak this machine's /proc/cpuinfo gives."""
  assert results['flop_per_image'] == 6 * MULTIPLY_ADDS == 43624512
  peak = results['peak']
  if peak is None:  # No clock in /proc/cpuinfo (some VMs, some arm64).
    assert '| compute: ' not in stdout
    return
  assert peak['cores'] == len(os.sched_getaffinity(0))
  assert peak['flop_per_cycle'] in (16, 32, 64)
  assert peak['gflops'] == pytest.approx(
      peak['cores'] * peak['ghz'] * peak['flop_per_cycle'])
  for name, run in results['training'].items():
    gflops = run['images_per_sec'] * 43624512 / 1e9
    assert '| %s | %.1f | %.0f%% |' % (
        name, gflops, 100 * gflops / peak['gflops']) in stdout


def assert_perf(results, stdout):
  """--perf split our runs' CPU (not the peers') by process and kind of
  work; its samples and /proc's counters measure the workers' alike."""
  for name, run in results['training'].items():
    if name in (PEER_ROW, TORCH_ROW, DDP_ROW):
      assert 'perf_ms_per_image' not in run
      continue
    groups = run['perf_ms_per_image']
    ours = {'workers', 'ps'} if name == SYNC_ROW else {'workers'}
    assert ours <= set(groups) <= ours | {'idle', 'other'}, (name, groups)
    by_perf = sum(groups['workers'].values())
    by_proc = sum(v for k, v in run['cpu_ms_per_image'].items()
                  if k.startswith('worker'))
    assert 0.6 * by_proc <= by_perf <= 1.4 * by_proc, (name, groups, by_proc)
    assert groups['workers'].get(cpu_profile.ONEDNN, 0) > 0, (name, groups)
    for group in ours:  # (The ps's few samples are not compared with /proc.)
      assert '| %s: %s | ' % (name, group) in stdout, (name, group)


def assert_network(results, stdout, plot):
  """--quick measures 1 ps on an unlimited link and at 100 Mbit/s where
  namespaces can be made, and says why not elsewhere."""
  why = network_namespaces.why_unavailable()
  network = results['network']
  if why or 'skipped' in network:
    assert network == {'skipped': network['skipped']}
    assert 'Slow networks: skipped, %s' % network['skipped'] in stdout
    assert not plot.exists()
    return
  assert results['network_batch_sizes'] == [8]  # Half of --batch_size=16.
  runs = network['runs']
  # 1 ps unlimited (the planner's starting point), then at 100 Mbit/s.
  assert [(r['num_ps'], r['mbit'], r['batch_size']) for r in runs] == [
      (1, None, 8), (1, 100, 8)]
  share = results['bytes']['largest_ps_share']
  assert share['1'] == 1.0 and 0.5 <= share['2'] <= 0.6
  model = cifar10_model.MODEL_BYTES
  for run in runs:
    assert run['ms_per_step'] == statistics.median(run['ms_per_step_rounds'])
    assert len(run['ms_per_step_rounds']) == 1
    assert run['images_per_sec'] == 1e3 * 2 * 8 / run['ms_per_step']
  free, slow = runs
  # The planner's prediction, from the unlimited run of the same shape.
  assert 'predicted_ms' not in free
  # By hand: 1 ps carries both workers' 719,848 bytes each way at 100
  # Mbit/s (1.033 x 8 bits a byte), 118.97 ms of pull; the push, 0.3 x
  # 118.97 + 59.49 (a worker's own link) = 95.18 ms, hides 0.58 of the step.
  assert slow['predicted_ms'] == pytest.approx(
      free['ms_per_step'] + 118.97 +
      max(0, 95.18 - 0.58 * free['ms_per_step']), abs=0.02)
  assert slow['prediction_error'] == (slow['predicted_ms'] /
                                      slow['ms_per_step'] - 1)
  # 1 ps carries both workers' 719,848 bytes each way at 100 Mbit/s:
  # 1.49 MB on the wire (headers included), 119 ms.
  assert planner_model.link_ms(model, 1.0, 2, 100) == pytest.approx(118.97,
                                                                   abs=0.01)
  row = ('| 1 ps + 2 workers, sync, 100 Mbit/s, batch 8 | %.0f | %.0f | %.0f '
         '| %+.0f%% |  |' % (slow['images_per_sec'], slow['ms_per_step'],
                             slow['predicted_ms'],
                             100 * slow['prediction_error']))
  assert row in stdout
  assert plot.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_eight_workers_on_slow_links_predicted_from_their_own_shape():
  """The 8-worker rows: each slow run's prediction starts from the
  unlimited run of 8 workers with its ps count, and counts 8 workers on the
  busiest link; figures worked by hand from the planner's constants
  (1.033 bytes on the wire a byte, 0.3 of the busiest link and a worker's
  own again for the push, 0.58 of the step hiding it)."""
  def run(num_ps, mbit, ms, num_workers=8, batch_size=16):
    return {'num_ps': num_ps, 'num_workers': num_workers, 'mbit': mbit,
            'batch_size': batch_size, 'transfer_dtype': 'float32',
            'ms_per_step': ms,
            'images_per_sec': 1e3 * num_workers * batch_size / ms}
  network = {'runs': [run(1, None, 200.0), run(1, 100, 800.0),
                      run(2, None, 210.0), run(2, 100, 450.0),
                      # 2 workers of the same shape must not be taken as
                      # the 8 workers' starting point.
                      run(1, None, 90.0, 2, 64), run(1, 100, 300.0, 2, 64)]}
  benchmark_report.predict_network(network, {'pull': 719848,
                                      'largest_ps_share': {1: 1.0, 2: 0.51}})
  one_slow, two_slow, two_free = (network['runs'][1], network['runs'][3],
                                  network['runs'][2])
  # 1 ps carries 8 x 719,848 bytes each way at 100 Mbit/s: 475.906 ms; the
  # push 0.3 x 475.906 + 59.488 (a worker's own link) = 202.260, of which
  # 0.58 x 200 = 116 hides: 200 + 475.906 + 86.260.
  assert one_slow['predicted_ms'] == pytest.approx(762.166, abs=0.01)
  assert one_slow['prediction_error'] == pytest.approx(762.166 / 800 - 1,
                                                       abs=1e-4)
  # 2 ps, the larger holding 0.51: 8 x 0.51 = 4.08 models on its link,
  # 242.712 ms; the push 132.302, of which 0.58 x 210 = 121.8 hides.
  assert two_slow['predicted_ms'] == pytest.approx(
      210 + 242.712 + 10.502, abs=0.01)
  assert 'predicted_ms' not in two_free
  # 2 ps over 1 ps at 100 Mbit/s, both 8 workers: 800 / 450 ms a step.
  assert two_slow['speedup_over_1_ps'] == pytest.approx(800 / 450)
  assert network['runs'][5]['predicted_ms'] == pytest.approx(
      90 + 118.976 + max(0, 0.3 * 118.976 + 59.488 - 0.58 * 90), abs=0.01)
  assert benchmark_network.link_run_name(16, 100, 2, 'float32', 8) == (
      '2 ps + 8 workers, sync, 100 Mbit/s, batch 16')


def test_network_workers_must_be_counts(capsys):
  """A bad --network_workers is one line and exit 2, before anything runs;
  --quick keeps to 2 workers unless told otherwise."""
  import benchmark  # pylint: disable=g-import-not-at-top
  for bad in ('0,8', '8,', 'two'):
    with pytest.raises(SystemExit) as exited:
      benchmark.parse_args(['--network_workers=' + bad])
    assert exited.value.code == 2
    # (The program's name is pytest's here.)
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        ': error: --network_workers must be worker counts of 1 or more, '
        'comma-separated, e.g. 2,8 (got "%s")' % bad)
  assert benchmark.parse_args([]).network_workers == [2, 8]
  assert benchmark.parse_args(['--quick']).network_workers == [2]
  assert benchmark.parse_args(['--quick', '--network_workers=8,2,8'
                               ]).network_workers == [2, 8]


def test_perf_where_perf_cannot_record_is_one_line(capsys, monkeypatch,
                                                   tmp_path):
  """--perf on a machine without the perf command: exit 2 before anything
  runs, saying what is missing and what to do."""
  import benchmark  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv('PATH', str(tmp_path))  # An empty folder: no perf.
  with pytest.raises(SystemExit) as exited:
    benchmark.parse_args(['--perf'])
  assert exited.value.code == 2
  assert capsys.readouterr().err.splitlines()[-1].endswith(
      ': error: --perf: no perf command (Debian: apt-get install '
      'linux-perf); run without it, or where perf may record every CPU (as '
      'root)')


def test_perf_tables_take_the_median_of_each_kind_over_the_rounds():
  rounds = [
      {'workers': {'Python': 1.0, 'gRPC, sockets, protobuf': 0.2},
       'ps': {'Python': 0.1}},
      {'workers': {'Python': 3.0}, 'idle': {'TensorFlow runtime, the rest':
                                            0.05}},
      {'workers': {'Python': 2.0, 'gRPC, sockets, protobuf': 0.4},
       'ps': {'Python': 0.3}}]
  # A kind a round did not sample counts 0 there: median(0.2, 0, 0.4).
  median = {'workers': {'Python': 2.0, 'gRPC, sockets, protobuf': 0.2},
            'ps': {'Python': 0.1}, 'idle': {'TensorFlow runtime, the rest':
                                            0.0}}
  assert benchmark_report.median_profile(rounds) == median
  lines = benchmark_report.perf_markdown({'single process': {
      'perf_ms_per_image': median}, 'a peer': {'images_per_sec': 1.0}})
  # Columns: spinning, kernel, memory, gRPC, Python, oneDNN, Eigen, the
  # rest, all; rows: workers, ps, other, idle.
  assert lines[-3:] == [
      '| single process: workers | 0.000 | 0.000 | 0.000 | 0.200 | 2.000 | '
      '0.000 | 0.000 | 0.000 | 2.200 |',
      '| single process: ps | 0.000 | 0.000 | 0.000 | 0.000 | 0.100 | 0.000 '
      '| 0.000 | 0.000 | 0.100 |',
      '| single process: idle | 0.000 | 0.000 | 0.000 | 0.000 | 0.000 | '
      '0.000 | 0.000 | 0.000 | 0.000 |']
  assert len(lines) == 6 and lines[0] == ''
  assert benchmark_report.perf_markdown({'single process': {}}) == []


def test_the_plain_graph_row_runs_beside_the_packed_one():
  """--nopack_transfers on the synchronous cluster's shape, next to it in
  the table, picked by --only as any row is (with the baseline)."""
  import benchmark  # pylint: disable=g-import-not-at-top
  names = [c.name for c in benchmark.CONFIGS]
  sync = names.index('1 ps + 2 workers, sync')
  plain = benchmark.CONFIGS[sync + 1]
  assert plain == ('1 ps + 2 workers, sync, plain graph', 1, 2,
                   ('--nopack_transfers',), '')
  assert [c.name for c in benchmark.chosen_configs(
      quick=False, only='plain graph')] == ['single process', plain.name]
  assert plain.name not in [c.name for c in benchmark.chosen_configs(
      quick=True, only=None)]


@pytest.mark.parametrize('vendor, family, flags, per_cycle', [
    ('AuthenticAMD', 25, 'avx avx2 fma', 32),  # Zen 3.
    ('AuthenticAMD', 25, 'avx2 fma avx512f avx512_bf16', 32),  # Zen 4.
    ('AuthenticAMD', 26, 'avx2 fma avx512f', 64),  # Zen 5.
    ('GenuineIntel', 6, 'avx2 fma avx512f amx_bf16', 64),  # Xeon, AMX.
    ('GenuineIntel', 6, 'avx avx2 fma', 32),
    ('GenuineIntel', 6, 'sse4_2 avx', 16)])
def test_the_float32_peak_of_each_cpu_kind(tmp_path, vendor, family, flags,
                                           per_cycle):
  import cpu_peak  # pylint: disable=g-import-not-at-top
  info = tmp_path / 'cpuinfo'
  # The first CPU's fields count (a core's clock may differ).
  info.write_text('processor\t: 0\nvendor_id\t: %s\ncpu family\t: %d\n'
                  'cpu MHz\t\t: 2500.000\nflags\t\t: fpu %s\n\nprocessor\t: 1'
                  '\nvendor_id\t: %s\ncpu MHz\t\t: 3700.000\nflags\t\t: fpu\n'
                  % (vendor, family, flags, vendor))
  assert cpu_peak.float32_peak(str(info), cores=2) == {
      'cores': 2, 'ghz': 2.5, 'flop_per_cycle': per_cycle,
      'gflops': 2 * 2.5 * per_cycle}


def test_no_peak_without_a_clock(tmp_path):
  import cpu_peak  # pylint: disable=g-import-not-at-top
  info = tmp_path / 'cpuinfo'
  info.write_text('processor\t: 0\nflags\t\t: avx2 fma\n')
  assert cpu_peak.float32_peak(str(info)) is None
  info.write_text('processor\t: 0\ncpu MHz\t\t: unknown\nflags\t\t: fma\n')
  assert cpu_peak.float32_peak(str(info)) is None
  assert cpu_peak.float32_peak(str(tmp_path / 'missing')) is None
