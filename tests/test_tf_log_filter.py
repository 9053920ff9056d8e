"""The terminal filter: TensorFlow's chatter goes, real problems stay.

The lines below are copied from the logs of real runs on TensorFlow 2.21,
one record (a log line and its continuation lines) an item.
The filter is tested in real processes too: a trainer whose stderr must be
our one error line, the same with TF_CPP_MIN_LOG_LEVEL=0, and a process that
aborts right after writing to file descriptor 2, as a fatal C++ error does.
"""

import io
import os
import signal
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, ROOT)
import tf_log_filter  # pylint: disable=g-import-not-at-top,wrong-import-position

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
]


@pytest.mark.parametrize('level, kept', [
    (1, REAL),
    # At level 2 warnings go too, unless they are ours or Python's.
    (2, REAL[1:]),
])
def test_filter_stream_drops_the_chatter_and_keeps_the_rest(level, kept):
  interleaved = [record for pair in zip(CHATTER, REAL) for record in pair]
  interleaved += CHATTER[len(REAL):]
  sink = io.BytesIO()
  tf_log_filter.filter_stream(io.BytesIO(b''.join(interleaved)), sink, level)
  assert sink.getvalue() == b''.join(kept)


def run_python(code, level):
  """Runs code that installed the filter; returns (status, stderr bytes)."""
  env = dict(os.environ, PYTHONPATH=ROOT)
  env.pop('TF_CPP_MIN_LOG_LEVEL', None)
  if level is not None:
    env['TF_CPP_MIN_LOG_LEVEL'] = level
  proc = subprocess.run(
      [sys.executable, '-c', 'import os, tf_log_filter\n'
       'tf_log_filter.install()\n' + code],
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
        [sys.executable, '-c', 'import os, tf_log_filter\n'
         'tf_log_filter.install()\n'
         'os.write(2, %r)\n'
         'tf_log_filter.drain()\n'
         'os._exit(3)' % (CHATTER[1] + b'worker 0: SIGINT; exiting\n')],
        stderr=f, env=env)
    assert proc.wait(timeout=60) == 3
    assert log.read_bytes() == b'worker 0: SIGINT; exiting\n'


def test_level_0_turns_the_filter_off():
  status, stderr = run_python('os.write(2, %r)' % b''.join(CHATTER), '0')
  assert status == 0
  assert stderr == b''.join(CHATTER)


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
  assert any(tf_log_filter.CPP_LOG_LINE.match(line.encode())
             for line in everything.splitlines()), everything
