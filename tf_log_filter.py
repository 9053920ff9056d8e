"""Keeps TensorFlow's C++ chatter out of the terminal; real problems pass.

A healthy task printed more TensorFlow C++ log lines than lines of ours, and
several read as failures: `E... failed call to cuInit` on every CPU machine,
`W... Local rendezvous is aborting` at each step's cleanup. Setting
TF_CPP_MIN_LOG_LEVEL is not enough: the lines TensorFlow logs before absl's
logging is initialized (the `WARNING: All log messages before
absl::InitializeLog()` banner, the cudart and cuInit notes) ignore it, and
the rest are warnings and errors that a level high enough to hide them would
hide real ones with.

So `install()` routes the process's stderr (file descriptor 2, where the C++
code writes) through a small filter process that drops:
  * C++ log lines below TF_CPP_MIN_LOG_LEVEL (1, warnings, unless set),
    including those printed before TensorFlow read it;
  * the absl banner and the lines in BENIGN, each an expected event;
and passes every other byte unchanged: real warnings and errors, Python
tracebacks and logging, the suite's own lines. TF_CPP_MIN_LOG_LEVEL=0 turns
the filter off, and TensorFlow then shows everything.

The filter is a child process, not a thread, so that a fatal error's last
lines still reach the terminal when the trainer aborts; it ignores SIGINT
and SIGTERM, and exits when the trainer's end closes the pipe.
"""

import atexit
import os
import re
import select
import signal
import subprocess
import sys

# `I1201 02:47:14.548395   8243 file.cc:31] message`; absl's pre-init lines
# have `0000 00:00:SECONDS.MICROS` for the date and time.
CPP_LOG_LINE = re.compile(rb'^([IWEF])\d{4} [\d:.]+ +\d+ ([\w./-]+):\d+\] ')
LEVELS = {b'I': 0, b'W': 1, b'E': 2, b'F': 3}
# The lines after a log line that belong to it: a status's node list
# (`\t [[{{node ...}}]]`), the details of an error from another task,
# cpu_feature_guard's second line.
CONTINUATION = re.compile(
    rb'^(\t|Additional GRPC error information from remote target |'
    rb':UNKNOWN:Error received from peer |'
    rb'To enable the following instructions: )')
ABSL_BANNER = (b'WARNING: All log messages before absl::InitializeLog() is '
               b'called are written to STDERR')

# (source file, message) of lines that report expected events, not problems.
BENIGN = [(re.compile(f), re.compile(m)) for f, m in [
    # No GPU driver, or none visible (the ps tasks and the evaluator hide
    # the GPUs on purpose); --num_gpus is checked against the visible GPUs.
    (rb'cuda_platform\.cc|cuda_diagnostics\.cc', rb'failed call to cuInit'),
    (rb'cudart_stub\.cc', rb'Could not find cuda drivers'),
    # TensorFlow registers its CUDA plugins twice (tensorflow#62075).
    (rb'cuda_(dnn|fft|blas)\.cc', rb'Unable to register cu\w+ factory'),
    (rb'computation_placer\.cc', rb'computation placer already registered'),
    # A step's or a session's cleanup cancels its pending transfers and
    # queue operations (a lost task shows as UNAVAILABLE, which passes).
    (rb'local_rendezvous\.cc', rb'aborting with status: (ABORTED|CANCELLED)'),
    (rb'grpc_worker_service\.cc', rb'RecvTensor cancelled'),
    (rb'queue_base\.cc', rb'Skipping cancelled dequeue attempt'),
    # SyncReplicasOptimizer drops gradients computed on an older global
    # step, as it is built to do (backup workers, a restarted worker).
    (rb'conditional_accumulator_base\.cc', rb'current_global_step_ to smaller'),
    # --trace_steps on a machine or a task with no GPU.
    (rb'xplane_to_step_stats\.cc', rb'GPU trace was not collected'),
]]

# What drain() writes to stderr for the filter to answer on the ack pipe.
DRAIN_MARK = b'\0tf_log_filter: drained?\0\n'

_ack_fd = None  # Where the filter answers a DRAIN_MARK; None: no filter.
_pipe = None  # (st_dev, st_ino) of the pipe install() put at fd 2.


def is_chatter(line, min_level):
  """Whether a line of stderr is TensorFlow chatter to drop.

  Args:
    line: one line, as bytes.
    min_level: the lowest C++ log level shown (0 info, 1 warning, 2 error).

  Returns:
    True for the absl banner, for a C++ log line below min_level and for a
    line in BENIGN; False for everything else (Python's absl log lines,
    whose own verbosity applies, included).
  """
  if line.rstrip(b'\r\n') == ABSL_BANNER:
    return True
  match = CPP_LOG_LINE.match(line)
  if not match or match.group(2).endswith(b'.py'):
    return False
  if LEVELS[match.group(1)] < min_level:
    return True
  message = line[match.end():]
  return any(f.fullmatch(match.group(2)) and m.search(message)
             for f, m in BENIGN)


def filter_stream(source, sink, min_level, ack_fd=None):
  """Copies source to sink line by line, without the chatter.

  A dropped log line takes its CONTINUATION lines with it. A DRAIN_MARK
  line is answered on ack_fd, once all before it is written.
  """
  dropping = False
  for line in iter(source.readline, b''):
    if line == DRAIN_MARK and ack_fd is not None:
      os.write(ack_fd, b'.')
      continue
    if dropping and CONTINUATION.match(line):
      continue
    dropping = is_chatter(line, min_level)
    if not dropping:
      sink.write(line)
      sink.flush()


def install():
  """Routes this process's stderr through the filter; call before importing
  TensorFlow, whose C++ code logs as its libraries load.
  """
  global _ack_fd, _pipe
  level = os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '1')
  if level not in ('1', '2', '3') or _ack_fd is not None:
    return  # 0 shows everything; TensorFlow reads other values as 0.
  sys.stderr.flush()
  ack_read, ack_write = os.pipe()
  proc = subprocess.Popen(
      [sys.executable, '-S', os.path.abspath(__file__), level,
       str(ack_write)], stdin=subprocess.PIPE, stdout=2,
      pass_fds=(ack_write,))
  os.close(ack_write)
  # fd 2 becomes the pipe's only write end: the filter reads to the end of
  # it when this process ends, however it ends.
  os.dup2(proc.stdin.fileno(), 2)
  proc.stdin.close()
  _ack_fd = ack_read
  _pipe = _identity(2)
  atexit.register(drain)


def drain():
  """Returns once the filter has written out all stderr got so far.

  Called at exit, and before os._exit, so that the process's last lines are
  on the terminal (or in the log file) by the time its exit can be seen.
  The filter stays: what TensorFlow logs while the process tears down goes
  through it too.
  """
  global _ack_fd
  if _ack_fd is None:
    return
  ack_fd, _ack_fd = _ack_fd, None
  sys.stderr.flush()
  if _identity(2) == _pipe:  # Not if someone has put fd 2 elsewhere since.
    os.write(2, DRAIN_MARK)
    # The filter answers at once; the limit is for a filter that died.
    if select.select([ack_fd], [], [], 10)[0]:
      os.read(ack_fd, 1)
  os.close(ack_fd)


def _identity(fd):
  stat = os.fstat(fd)
  return stat.st_dev, stat.st_ino


def _main(level, ack_fd):
  for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(signum, signal.SIG_IGN)  # The trainer decides; EOF ends.
  filter_stream(sys.stdin.buffer, sys.stdout.buffer, int(level), int(ack_fd))


if __name__ == '__main__':
  _main(*sys.argv[1:])
