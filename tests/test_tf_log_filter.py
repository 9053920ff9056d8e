"""The terminal: TensorFlow's chatter goes, real problems stay, lines whole.

The lines below are copied from the logs of real runs, one record (a log
line and its continuation lines) an item: ours on TensorFlow 2.21 on AMD
EPYC and Intel Xeon (AVX-512, AMX) machines, and, for the GPU start-up
notes, published logs of TensorFlow 2.1x on GPU machines.
The filter is tested in real processes too: a trainer whose stderr must be
our one error line, the same with TF_CPP_MIN_LOG_LEVEL=0, and a process that
aborts right after writing to file descriptor 2, as a fatal C++ error does.
And the prologue's whole lines: eight threads printing at once.
"""

import glob
import importlib.metadata
import io
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from helpers import ROOT, free_ports

sys.path.insert(0, ROOT)
from training.runtime import log_filter  # pylint: disable=g-import-not-at-top,wrong-import-position
from training.runtime import versions  # pylint: disable=g-import-not-at-top,wrong-import-position

CHATTER = [
    b'WARNING: All log messages before absl::InitializeLog() is called are '
    b'written to STDERR\n',
    b'I0000 00:00:1796093229.437439    8243 cudart_stub.cc:31] Could not find '
    b'cuda drivers on your machine, GPU will not be used.\n',
    b'E0000 00:00:1796093233.083005    8243 cuda_platform.cc:52] failed call '
    b'to cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR '
    b'(303)\n',
    b'I0000 00:00:1796093482.983289   12893 cpu_feature_guard.cc:227] This '
    b'TensorFlow binary is optimized to use available CPU instructions in '
    b'performance-critical operations.\n'
    b'To enable the following instructions: AVX2 FMA, in other operations, '
    b'rebuild TensorFlow with the appropriate compiler flags.\n',
    b'W0000 00:00:1796093235.576267    8462 local_rendezvous.cc:412] Local '
    b'rendezvous is aborting with status: CANCELLED: TakeGrad operation was '
    b'cancelled\n'
    b'\t [[{{node cifar10_sync_replicas/ResourceAccumulatorTakeGradient_8}}]]'
    b" [type.googleapis.com/tensorflow.DerivedStatus='']\n",
    b'W0000 00:00:1796093234.858992    8455 local_rendezvous.cc:412] Local '
    b'rendezvous is aborting with status: ABORTED: Cleanup 9774408963617968 '
    b"[type.googleapis.com/tensorflow.DerivedStatus='']\n",
    # A status passed on from another task, its details over three lines.
    b'W0000 00:00:1796094050.123456   8462 local_rendezvous.cc:412] Local '
    b'rendezvous is aborting with status: CANCELLED: \n'
    b'Additional GRPC error information from remote target /job:ps/replica:0'
    b'/task:1 while calling /tensorflow.WorkerService/RecvTensor:\n'
    b':UNKNOWN:Error received from peer  {grpc_message:"TakeGrad operation '
    b'was cancelled\\n\\t [[{{node cifar10_sync_replicas/ResourceAccumulator'
    b'TakeGradient_9}}]]", grpc_status:1}\n'
    b"\t [[GradientDescent/update/NoOp_1_S164]] [type.googleapis.com/"
    b"tensorflow.DerivedStatus='']\n",
    b'W1201 02:47:15.001122   8462 grpc_worker_service.cc:536] RecvTensor '
    b'cancelled for 99404793507463870\n',
    b'W1201 02:47:15.001122   8462 queue_base.cc:286] sync_token_q: Skipping '
    b'cancelled dequeue attempt with queue not closed\n',
    b'W1201 02:47:15.001122   8462 conditional_accumulator_base.cc:47] '
    b'Attempt to set current_global_step_ to smaller value: '
    b'current_global_step_ = 23 >= 20 = new_global_step.\n',
    # A checkpoint save on a full disk: the op's error and the step's
    # abort, copies of the error the chief reports in one line.
    b'W0000 00:00:1796114236.951683    3515 op_kernel.cc:1858] OP_REQUIRES '
    b'failed at save_restore_v2_ops.cc:163 : RESOURCE_EXHAUSTED: /tmp/disk/'
    b'train/model.ckpt-20_temp/part-00000-of-00001.data-00000-of-00001.'
    b'tempstate174603014330594264; No space left on device\n',
    b'W0000 00:00:1796114236.951910    3515 local_rendezvous.cc:412] Local '
    b'rendezvous is aborting with status: RESOURCE_EXHAUSTED: /tmp/disk/train/'
    b'model.ckpt-20_temp/part-00000-of-00001.data-00000-of-00001.tempstate1746'
    b'03014330594264; No space left on device\n'
    b'\t [[{{node save/SaveV2}}]]\n'
    b'Hint: If you want to see a list of allocated tensors when OOM happens, '
    b'add report_tensor_allocations_upon_oom to RunOptions for current '
    b'allocation info. This isn\'t available when running in Eager mode.\n'
    b'\n',
    # A peer's cancelled TakeGrad on TensorFlow 2.23: its details open with
    # the status code and end with the source location trace (as a test's
    # ps log showed them; the line they follow, which the filter dropped
    # there, as 2.21 writes it).
    b'W0000 00:00:1796093235.576267    8462 local_rendezvous.cc:412] Local '
    b'rendezvous is aborting with status: CANCELLED: TakeGrad operation was '
    b'cancelled\n'
    b'Additional GRPC error information from remote target /job:ps/replica:0'
    b'/task:0 while calling /tensorflow.WorkerService/RecvTensor:\n'
    b':CANCELLED:TakeGrad operation was cancelled\n'
    b'\t [[{{node cifar10_sync_replicas/ResourceAccumulatorTakeGradient_3}}]]\n'
    b"\t [[GradientDescent/update/NoOp_1_S182]] [type.googleapis.com/"
    b"tensorflow.DerivedStatus='']\n"
    b'=== Source Location Trace: ===\n'
    b'external/xla/xla/tsl/distributed_runtime/rpc/grpc_util.h:89\n'
    b'tensorflow/core/common_runtime/executor.cc:1155\n'
    b'\n',
    # Platform notes. Intel Xeon with AVX-512 and AMX, every worker, the
    # evaluator and a single process (the input pipeline's uint8 transpose);
    # AMD EPYC Zen 4 prints it too, with another data type on other graphs.
    b'E0000 00:00:1796108551.653509   17849 util.cc:131] oneDNN supports '
    b'DT_UINT8 only on platforms with AVX-512. Falling back to the default '
    b'Eigen-based implementation if present.\n',
    b'E0000 00:00:1796113605.124844   31650 util.cc:131] oneDNN supports '
    b'DT_BOOL only on platforms with AVX-512. Falling back to the default '
    b'Eigen-based implementation if present.\n',
    b'I0000 00:00:1796113299.714086    2492 port.cc:153] oneDNN custom '
    b'operations are on. You may see slightly different numerical results due '
    b'to floating-point round-off errors from different computation orders. '
    b'To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`'
    b'.\n',
    # A GPU machine's start-up: the CUDA plugins registered twice, one of
    # them in TensorFlow's own format, and the NUMA note of a VM.
    b'2026-04-07 10:13:02.154664: E external/local_xla/xla/stream_executor/'
    b'cuda/cuda_fft.cc:467] Unable to register cuFFT factory: Attempting to '
    b'register factory for plugin cuFFT when one has already been '
    b'registered\n',
    b'E0000 00:00:1775556782.173781    2657 cuda_dnn.cc:8579] Unable to '
    b'register cuDNN factory: Attempting to register factory for plugin cuDNN '
    b'when one has already been registered\n',
    b'E0000 00:00:1775556782.180648    2657 cuda_blas.cc:1407] Unable to '
    b'register cuBLAS factory: Attempting to register factory for plugin '
    b'cuBLAS when one has already been registered\n',
    b'W0000 00:00:1775556782.197549    2657 computation_placer.cc:177] '
    b'computation placer already registered. Please check linkage and avoid '
    b'linking the same target more than once.\n',
    b'W0000 00:00:1731574333.214414 2056327 py_utils.cc:38] TF-TRT Warning: '
    b'Could not find TensorRT\n',
    b'2025-01-08 14:55:54.925839: E external/local_xla/xla/stream_executor/'
    b'cuda/cuda_driver.cc:152] failed call to cuInit: INTERNAL: CUDA error: '
    b'Failed call to cuInit: UNKNOWN ERROR (303)\n',
    b'I0000 00:00:1731574334.026432 2056327 cuda_executor.cc:1015] successful '
    b'NUMA node read from SysFS had negative value (-1), but there must be at '
    b'least one NUMA node, so returning NUMA node zero.\n',
    b'I0000 00:00:1731574334.270163 2056327 gpu_device.cc:2022] Created '
    b'device /job:localhost/replica:0/task:0/device:GPU:0 with 78911 MB '
    b'memory:  -> device: 0, name: NVIDIA H100 80GB HBM3, pci bus id: '
    b'0000:00:05.0, compute capability: 9.0\n',
]

REAL = [
    b'W1201 02:47:15.001122   8462 local_rendezvous.cc:412] Local rendezvous '
    b'is aborting with status: UNAVAILABLE: Socket closed\n'
    b'Additional GRPC error information from remote target /job:worker/'
    b'replica:0/task:1 while calling /tensorflow.WorkerService/RecvTensor:\n'
    b':UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"Socket '
    b'closed"}\n',
    b'E1201 02:47:15.001122   8462 master_session.cc:1972] Cleanup partition '
    b'error: UNAVAILABLE: sendmsg: Connection reset by peer (104)\n',
    b'E1201 02:47:15.001122   8462 grpc_server_lib.cc:618] UNKNOWN: Could not '
    b'start gRPC server\n',
    b'F1201 02:47:15.001122   8462 tensor.cc:12] Check failed: size >= 0\n',
    # Python's absl logging: its own verbosity applies, even to INFO.
    b'I1201 02:47:15.001122 140211 basic_session_run_hooks.py:784] Saving\n',
    b'Traceback (most recent call last):\n'
    b'\tan indented line after a kept line\n',
    b'Error: --num_gpus must be 0 or more (got -1)\n',
    # Real problems of a GPU machine, in either format.
    b'W0000 00:00:1731574334.000001 2056327 gpu_device.cc:2344] Cannot dlopen '
    b'some GPU libraries. Please make sure the missing libraries mentioned '
    b'above are installed properly if you would like to use GPU.\n',
    b'2026-04-07 10:13:05.000001: E external/local_xla/xla/stream_executor/'
    b'cuda/cuda_driver.cc:1002] failed to allocate 80.00G (85899345920 bytes) '
    b'from device: CUDA_ERROR_OUT_OF_MEMORY: out of memory\n',
    # A real error with the source location trace TensorFlow 2.23 adds: the
    # trace shows with it.
    b'E0000 00:00:1796548177.183145   26656 master_session.cc:1972] Cleanup '
    b'partition error: UNAVAILABLE: Connection reset by peer\n'
    b'=== Source Location Trace: ===\n'
    b'tensorflow/core/distributed_runtime/worker.cc:126\n'
    b'\n',
]


@pytest.mark.parametrize('level, kept', [
    (1, REAL),
    # At level 2 warnings go too, unless they are ours or Python's.
    (2, [r for r in REAL if not r.startswith(b'W')]),
])
def test_filter_stream_drops_the_chatter_and_keeps_the_rest(level, kept):
  interleaved = [record for pair in zip(CHATTER, REAL) for record in pair]
  interleaved += CHATTER[len(REAL):]
  sink = io.BytesIO()
  log_filter.filter_stream(io.BytesIO(b''.join(interleaved)), sink, level)
  assert sink.getvalue() == b''.join(kept)


# The lines of ours in a task's log: the task's name, its own lines, the
# progress and accuracy lines.
OURS = re.compile(r'^(job_name : |task_index : |Worker \d+: |ps \d+: |'
                  r'Evaluator: |\d{4}-\d\d-\d\d [\d:.]+: step \d+, )')
RECORDED = sorted(glob.glob(os.path.join(ROOT, 'tests', 'data', 'tf_logs',
                                         '*.log')))


@pytest.mark.parametrize('path', RECORDED, ids=os.path.basename)
def test_each_versions_recorded_run_leaves_only_our_lines(path):
  # The quickstart's four task logs at TF_CPP_MIN_LOG_LEVEL=0 on one
  # TensorFlow (the file's name; each kind of record up to three times).
  with open(path, 'rb') as f:
    raw = f.read()
  sink = io.BytesIO()
  log_filter.filter_stream(io.BytesIO(raw), sink, 1)
  ours = [line for line in raw.decode().splitlines(keepends=True)
          if OURS.match(line)]
  assert len(ours) > 20
  assert sink.getvalue().decode().splitlines(keepends=True) == ours


def test_the_recorded_runs_span_the_tested_range():
  # The range the trainer calls tested (training/runtime/versions.py), by hand,
  # and a recorded run at each of its ends and at the pinned version.
  assert versions.TESTED == ((2, 16), (2, 23))
  names = [os.path.basename(p)[:-len('.log')] for p in RECORDED]
  minors = sorted(tuple(int(x) for x in n.split('.')[:2]) for n in names)
  assert (minors[0], minors[-1]) == ((2, 16), (2, 23))
  assert '2.21.0' in names


def run_python(code, level):
  """Runs code that installed the filter; returns (status, stderr bytes)."""
  env = dict(os.environ, PYTHONPATH=ROOT)
  env.pop('TF_CPP_MIN_LOG_LEVEL', None)
  if level is not None:
    env['TF_CPP_MIN_LOG_LEVEL'] = level
  proc = subprocess.run(
      [sys.executable, '-c', 'import os\nfrom training.runtime import log_filter\n'
       'log_filter.install()\n' + code],
      stderr=subprocess.PIPE, env=env, timeout=60)
  return proc.returncode, proc.stderr


def test_lines_written_just_before_an_abort_still_show():
  # What a fatal C++ error does: write to fd 2, then abort the process. The
  # filter is another process, so it still writes the lines out.
  status, stderr = run_python(
      'os.write(2, %r)\nos.abort()' % b''.join(CHATTER + REAL), None)
  assert status == -signal.SIGABRT
  assert stderr == b''.join(REAL)


def test_drain_writes_out_everything_before_os_exit(tmp_path):
  # os._exit skips atexit: the trainer's signal handler drains first, so
  # the file has its last line by the time the exit can be seen.
  log = tmp_path / 'log'
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL='1')
  with open(log, 'wb') as f:
    proc = subprocess.Popen(
        [sys.executable, '-c', 'import os\nfrom training.runtime import log_filter\n'
         'log_filter.install()\n'
         'os.write(2, %r)\n'
         'log_filter.drain()\n'
         'os._exit(3)' % (CHATTER[1] + b'worker 0: SIGINT; exiting\n')],
        stderr=f, env=env)
    assert proc.wait(timeout=60) == 3
    assert log.read_bytes() == b'worker 0: SIGINT; exiting\n'


def test_level_0_turns_the_filter_off():
  status, stderr = run_python('os.write(2, %r)' % b''.join(CHATTER), '0')
  assert status == 0
  assert stderr == b''.join(CHATTER)


THREADS_PRINTING = r'''
import sys, threading
from training.runtime import process
process.start()
sys.setswitchinterval(1e-6)  # Threads take turns between any two writes.

def talk(name):
  for i in range(200):
    print('thread', name, 'line', i, flush=i % 2)  # Eight writes each.
    sys.stderr.write('thread %d error %d\nthread %d error %d.1\n' % (
        name, i, name, i))  # Two lines in one write.

threads = [threading.Thread(target=talk, args=(n,)) for n in range(8)]
for t in threads:
  t.start()
for t in threads:
  t.join()
print('flushed before', end=' ', flush=True)  # Neither lost nor doubled.
print('its end')
'''


def test_threads_printing_at_once_print_whole_lines():
  # print() writes its words and its newline separately: without whole
  # lines, another thread's words land inside a line (as a progress line
  # once did after the chief's line taking a worker back).
  proc = subprocess.run([sys.executable, '-c', THREADS_PRINTING],
                        capture_output=True, text=True, timeout=120,
                        env=dict(os.environ, PYTHONPATH=ROOT))
  assert proc.returncode == 0, proc.stderr
  for stream, word in ((proc.stdout, 'line'), (proc.stderr, 'error')):
    each = [['%d' % i] + (['%d.1' % i] if word == 'error' else [])
            for i in range(200)]
    lines = stream.splitlines()
    assert len(lines) == 8 * sum(map(len, each)) + (word == 'line')
    for n in range(8):
      assert [line for line in lines if line.startswith('thread %d ' % n)
             ] == ['thread %d %s %s' % (n, word, i) for e in each for i in e]
  assert proc.stdout.splitlines()[-1] == 'flushed before its end'


def trainer(level):
  """Starts a trainer that imports TensorFlow, then stops on a bad flag."""
  env = dict(os.environ)
  env.pop('TF_CPP_MIN_LOG_LEVEL', None)
  if level is not None:
    env['TF_CPP_MIN_LOG_LEVEL'] = level
  return subprocess.Popen(
      [sys.executable, os.path.join(ROOT, 'train_distributed.py'),
       '--job_name=nonsense'], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      env=env)


def test_a_trainer_prints_only_its_own_lines_unless_level_0():
  message = "Error: --job_name must be ps, worker or evaluator (got 'nonsense')"
  procs = [trainer(None), trainer('0')]  # Side by side: each imports TF.
  try:
    (out, quiet), (out_0, everything) = [p.communicate(timeout=120)
                                         for p in procs]
  finally:
    for p in procs:
      p.kill()
      p.wait()
  assert [p.returncode for p in procs] == [2, 2]
  assert out == out_0 == b''
  assert quiet.decode() == message + '\n'
  # TF_CPP_MIN_LOG_LEVEL=0 shows all TensorFlow says while it loads: on any
  # machine at least one C++ log line (the CPU feature or CUDA notes).
  everything = everything.decode()
  assert message in everything
  assert any(log_filter.CPP_LOG_LINE.match(line.encode())
             for line in everything.splitlines()), everything


# Scripts that load TensorFlow: each must start as the trainer does.
LOADS_TENSORFLOW = re.compile(
    r'^\s*(import tensorflow|from tensorflow|import (cifar10_(input|model|eval)'
    r'|train_graph|train_distributed)\b)', re.M)


def test_every_script_that_loads_tensorflow_starts_as_the_trainer():
  # scripts/ and tools/: what imports TensorFlow, directly or through the
  # article's modules, calls process.start() (the filter, TensorFlow's
  # Python warnings off); the others (the download, the converters) load
  # no TensorFlow at all.
  paths = glob.glob(os.path.join(ROOT, 'scripts', '*.py')) + glob.glob(
      os.path.join(ROOT, 'tools', '*.py'))
  for path in paths:
    with open(path) as f:
      text = f.read()
    if "__name__ == '__main__'" in text and LOADS_TENSORFLOW.search(text):
      assert 'process.start()' in text, path
  light = ['download_cifar10', 'make_cifar_binary', 'make_synthetic_cifar10']
  got = subprocess.run(
      [sys.executable, '-c', 'import sys; sys.path.insert(0, "scripts")\n'
       'import %s\nprint(sorted(m for m in sys.modules if m.split(".")[0] in '
       '("tensorflow", "keras")))' % ', '.join(light)],
      cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
  assert got.stdout == '[]\n' and got.stderr == ''


def is_tensorflows(line):
  """Whether a line of stderr is TensorFlow's C++ log or a deprecation."""
  return bool(log_filter.CPP_LOG_LINE.match(line.encode()) or re.search(
      r'cuInit|absl::InitializeLog|deprecat|WARNING:tensorflow', line))


def read_lines(stream, lines):
  """Appends each line of stream to lines, without its newline."""
  for line in stream:
    lines.append(line.rstrip('\n'))


@pytest.mark.slow
def test_scripts_and_tensorboard_print_only_their_own_lines(tiny_data,
                                                            tmp_path):
  # As a user runs them, side by side: what the network is fed, the
  # planner, and the documented TensorBoard command, stopped once it serves.
  env = dict(os.environ, PYTHON=sys.executable)  # tensorboard.sh's Python.
  env.pop('TF_CPP_MIN_LOG_LEVEL', None)
  port, = free_ports(1)
  commands = {
      'show_inputs': [sys.executable, 'scripts/show_inputs.py',
                      '--data_dir=' + tiny_data, '--num=4',
                      '--out=' + str(tmp_path / 'inputs.png')],
      'plan_cluster': [sys.executable, 'scripts/plan_cluster.py',
                       '--step_ms=45', '--num_workers=32', '--link_gbit=10'],
      'tensorboard': ['bash', 'scripts/tensorboard.sh',
                      '--logdir=' + str(tmp_path), '--port=%d' % port]}
  procs = {name: subprocess.Popen(command, cwd=ROOT, env=env, text=True,
                                  stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
           for name, command in commands.items()}
  try:
    serving = 'TensorBoard %s at http://localhost:%d/' % (
        importlib.metadata.version('tensorboard'), port)
    tensorboard = procs.pop('tensorboard')
    lines = []  # Its stderr, line by line, read by a thread of its own.
    reader = threading.Thread(target=read_lines,
                              args=(tensorboard.stderr, lines), daemon=True)
    reader.start()
    deadline = time.time() + 120  # A bound against a hang.
    while not any(l.startswith(serving) for l in lines):  # Until it serves,
      assert tensorboard.poll() is None and time.time() < deadline, lines
      time.sleep(0.2)
    # and does (Ctrl-C before that is a KeyboardInterrupt in its start-up).
    with urllib.request.urlopen('http://localhost:%d/' % port, timeout=60):
      pass
    tensorboard.send_signal(signal.SIGINT)  # Ctrl-C.
    tensorboard.wait(timeout=60)
    reader.join(timeout=60)
    assert not [l for l in lines if is_tensorflows(l) or 'Traceback' in l], (
        lines)
    for name, proc in procs.items():
      out, err = proc.communicate(timeout=120)
      assert proc.returncode == 0, (name, err)
      assert out and err == '', (name, err)
  finally:
    for proc in list(procs.values()) + [tensorboard]:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
