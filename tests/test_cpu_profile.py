"""tools/cpu_profile.py: perf's samples by process and kind of work, from
lines as perf prints them, and from a real recording where perf may
record every CPU."""

import os
import subprocess
import sys
import time

import pytest

import cpu_profile  # From tools/, on the path helpers.py sets.

TF = '/usr/lib/python3/site-packages/tensorflow/libtensorflow_cc.so.2'
# Lines of `perf script -F pid,time,ip,sym,dso` from a real cluster step.
LINES = [
    '14526 72927.488739:      7fe5c3ab5e09 [unknown] (/tmp/perf-14526.map)',
    '14526 72929.625013:      7fe66db2b480 tensorflow::OpKernelContext::'
    'allocate_output (%s)' % TF,
    '14526 72936.114100:      7fe659e07040 Eigen::internal::TensorExecutor<'
    'Eigen::TensorAssignOp<float> >::run (%s)' % TF,
    '14527 72936.200000:      7fe659e07040 Eigen::ThreadPoolTempl<tsl::'
    'thread::EigenEnvironment>::GlobalSteal (%s)' % TF,
    '14527 72936.300000:  ffffffff81000000 finish_task_switch.isra.0 '
    '([kernel.kallsyms])',
    '14527 72936.400000:      7fe600000000 grpc_core::Chttp2Transport::'
    'PerformOp (%s)' % TF,
    '14527 72936.500000:      7fe600000010 __memmove_avx512_unaligned_erms '
    '(/usr/lib/x86_64-linux-gnu/libc.so.6)',
    '14527 72936.600000:      7fe600000020 _PyEval_EvalFrameDefault '
    '(/usr/lib/libpython3.11.so.1.0)',
    '14527 72936.700000:      7fe600000030 dnnl::impl::cpu::x64::'
    'brgemm_convolution_fwd_t::execute (%s)' % TF,
    '    0 72946.975724:  ffffffff822613eb pv_native_safe_halt '
    '([kernel.kallsyms])',
    # C++ names with spaces and parentheses; Python's C functions; code
    # perf's JIT support names.
    '14527 72947.000000:      7fe600000040 std::_Function_handler<void (long,'
    ' long), tensorflow::Executor>::_M_invoke (%s)' % TF,
    '14527 72947.100000:      7fe600000050 time_time '
    '(/usr/lib/libpython3.11.so.1.0)',
    '14527 72947.200000:      7fe600000060 [unknown] ([JIT] tid 14530)',
    'a line of another shape',
]


def test_each_line_gets_its_process_time_and_kind():
  assert list(cpu_profile.parse(LINES)) == [
      (14526, 72927.488739, 'compute: oneDNN kernels'),  # Generated code.
      (14526, 72929.625013, 'TensorFlow runtime, the rest'),
      (14526, 72936.1141, 'compute: Eigen and other kernels'),
      (14527, 72936.2, 'thread pools spinning'),
      (14527, 72936.3, 'kernel: scheduling, syscalls'),
      (14527, 72936.4, 'gRPC, sockets, protobuf'),
      (14527, 72936.5, 'memory: copies, allocation'),
      (14527, 72936.6, 'Python'),
      (14527, 72936.7, 'compute: oneDNN kernels'),
      (0, 72946.975724, 'TensorFlow runtime, the rest'),
      (14527, 72947.0, 'TensorFlow runtime, the rest'),
      (14527, 72947.1, 'Python'),
      (14527, 72947.2, 'compute: oneDNN kernels'),
  ]
  # The function's name whole, the file apart.
  line = LINES[10]
  assert cpu_profile.SAMPLE.match(line).group(3, 4) == (
      'std::_Function_handler<void (long, long), tensorflow::Executor>::'
      '_M_invoke', TF)


def test_samples_in_the_window_count_2_ms_each_per_image():
  samples = [(10, 5.0, 'Python'),  # At the window's start: outside.
             (10, 5.5, 'Python'), (12, 6.0, 'Python'),  # Two workers.
             (11, 5.5, 'gRPC, sockets, protobuf'),
             (0, 5.7, 'kernel: scheduling, syscalls'),
             (99, 5.8, 'Python'),
             (10, 6.1, 'Python')]  # After its end: outside.
  # A sample is 1/499 s: 2.004 ms; over 4 images 0.501 ms an image.
  assert cpu_profile.ms_per_image(
      samples, {10: 'workers', 11: 'ps', 12: 'workers'}, 5.0, 6.0, 4) == {
      'workers': {'Python': pytest.approx(1.002004)},
      'ps': {'gRPC, sockets, protobuf': pytest.approx(0.501002)},
      'idle': {'kernel: scheduling, syscalls': pytest.approx(0.501002)},
      'other': {'Python': pytest.approx(0.501002)}}
  assert cpu_profile.ms_per_image(samples, {10: 'workers'}, 5.0, 6.0, 0) == {}


MISSING = cpu_profile.unavailable()


def cpu_secs(pid):
  """A live process's user + system CPU seconds, from /proc."""
  with open('/proc/%d/stat' % pid) as f:
    fields = f.read().rsplit(')', 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


@pytest.mark.skipif(MISSING is not None, reason='perf cannot record every '
                    'CPU here: %s' % MISSING)
@pytest.mark.alone  # A busy process's CPU, which another test would share.
def test_a_recording_gives_a_busy_process_the_cpu_proc_counts(tmp_path):
  recorder = cpu_profile.Recorder(str(tmp_path / 'rec.perf'))
  busy = None
  try:
    recorder.start()
    time.sleep(0.5)  # perf's start.
    busy = subprocess.Popen([sys.executable, '-c',
                             'import time\nend = time.time() + 2.5\n'
                             'while time.time() < end: pass'])
    time.sleep(0.5)
    start, cpu_start = time.time(), cpu_secs(busy.pid)
    time.sleep(1.0)
    end, cpu_end = time.time(), cpu_secs(busy.pid)
    busy.wait(10)
    gone = time.time()
    time.sleep(0.5)
    after = time.time()
  finally:
    if busy:
      busy.kill()
      busy.wait()
    recorder.stop()
  # One image in the window: its CPU ms, as the kernel counted them (in
  # ticks of 10 ms: the bounds allow 20 ms either way), most of them in
  # Python's interpreter.
  table = cpu_profile.profile(recorder, {busy.pid: 'busy'}, start, end, 1)
  counted = 1e3 * (cpu_end - cpu_start)
  total = sum(table['busy'].values())
  assert 0.9 * counted - 20 <= total <= 1.1 * counted + 20, (table, counted)
  assert counted > 300, counted  # It ran: the comparison means something.
  assert table['busy'].get('Python', 0) >= 0.5 * total, table
  # After it ended, nothing of it: the clocks agree to better than 0.5 s.
  assert 'busy' not in cpu_profile.profile(recorder, {busy.pid: 'busy'},
                                           gone, after, 1)


def write_perf(folder, status, stderr):
  """A fake perf command in folder: prints stderr and exits with status."""
  perf = folder / 'perf'
  perf.write_text('#!/bin/sh\necho "%s" >&2\nexit %d\n' % (stderr, status))
  perf.chmod(0o755)


def test_unavailable_says_what_is_missing(tmp_path, monkeypatch):
  monkeypatch.setenv('PATH', str(tmp_path))
  assert cpu_profile.unavailable() == (
      'no perf command (Debian: apt-get install linux-perf)')
  write_perf(tmp_path, 255, 'Error:\nAccess to performance monitoring and '
             'observability operations is limited.')
  assert cpu_profile.unavailable() == (
      'perf record -a refused: Access to performance monitoring and '
      'observability operations is limited.')
  write_perf(tmp_path, 1, '')
  assert cpu_profile.unavailable() == 'perf record -a refused: exit status 1'
  write_perf(tmp_path, 0, '')
  assert cpu_profile.unavailable() is None
