"""scripts/cpu_profile.py: perf's samples by process and kind of work, from
lines as perf prints them, and from a real recording where perf may
record every CPU."""

import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'scripts'))
import cpu_profile  # pylint: disable=g-import-not-at-top,wrong-import-position

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
  ]


def test_samples_in_the_window_count_2_ms_each_per_image():
  samples = [(10, 5.0, 'Python'),  # At the window's start: outside.
             (10, 5.5, 'Python'), (10, 6.0, 'Python'),
             (11, 5.5, 'gRPC, sockets, protobuf'),
             (0, 5.7, 'kernel: scheduling, syscalls'),
             (99, 5.8, 'Python'),
             (10, 6.1, 'Python')]  # After its end: outside.
  # A sample is 1/499 s: 2.004 ms; over 4 images 0.501 ms an image.
  assert cpu_profile.ms_per_image(samples, {10: 'workers', 11: 'ps'}, 5.0,
                                  6.0, 4) == {
      'workers': {'Python': pytest.approx(1.002004)},
      'ps': {'gRPC, sockets, protobuf': pytest.approx(0.501002)},
      'idle': {'kernel: scheduling, syscalls': pytest.approx(0.501002)},
      'other': {'Python': pytest.approx(0.501002)}}
  assert cpu_profile.ms_per_image(samples, {10: 'workers'}, 5.0, 6.0, 0) == {}


@pytest.mark.skipif(cpu_profile.unavailable() is not None,
                    reason='perf cannot record every CPU here: %s' %
                    cpu_profile.unavailable())
def test_a_recording_gives_a_busy_process_its_cpu_time(tmp_path):
  recorder = cpu_profile.Recorder(str(tmp_path / 'rec.perf'))
  recorder.start()
  time.sleep(0.5)  # perf's start.
  busy = subprocess.Popen([sys.executable, '-c',
                           'import time\nend = time.time() + 2.5\n'
                           'while time.time() < end: pass'])
  try:
    time.sleep(0.5)
    start = time.time()
    time.sleep(1.0)
    end = time.time()
    busy.wait(10)
  finally:
    busy.kill()
    recorder.stop()
  # One image in a window of 1 s in which it kept one CPU busy: 1000 ms
  # of its CPU, most of it in Python's interpreter.
  table = cpu_profile.profile(recorder, {busy.pid: 'busy'}, start, end, 1)
  total = sum(table['busy'].values())
  assert 850 <= total <= 1050, table
  assert table['busy']['Python'] >= 0.5 * total, table
