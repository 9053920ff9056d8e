"""Keeps TensorFlow's C++ chatter out of the terminal; real problems pass;
and a TensorFlow error said in one line (first_line).

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
  * the absl banner and the lines in BENIGN: start-up notes about the
    platform (PLATFORM) and expected events (EVENTS);
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

# absl's format, `I1201 02:47:14.548395   8243 file.cc:31] message` (its
# pre-init lines have `0000 00:00:SECONDS.MICROS` for the date and time),
# or TensorFlow's own, still used by some of its libraries as they load:
# `2026-04-07 10:13:02.154664: E external/.../cuda_fft.cc:467] message`.
CPP_LOG_LINE = re.compile(
    rb'^(?:([IWEF])\d{4} [\d:.]+ +\d+ |'
    rb'\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: ([IWEF]) )'
    rb'(?:[\w.-]+/)*([\w.-]+):\d+\] ')
LEVELS = {b'I': 0, b'W': 1, b'E': 2, b'F': 3}
# The lines after a log line that belong to it: a status's node list
# (`\t [[{{node ...}}]]`), the details of an error from another task, the
# hint that closes a RESOURCE_EXHAUSTED status and the blank line after it,
# cpu_feature_guard's second line, and the source location trace a status
# carries since TensorFlow 2.23 (`=== Source Location Trace: ===`, then a
# `path/file.cc:LINE` a frame and a blank line), matched by their shapes.
# The peer's error, after `Additional GRPC error information ...`, opens
# with its status code (`:UNKNOWN:Error received from peer ...`,
# `:CANCELLED:...`) in the gRPC of TensorFlow 2.17 and later, with
# `:{"created":"@...` (JSON) in 2.16's.
CONTINUATION = re.compile(
    rb'^(\t|Additional GRPC error information from remote target |'
    rb':[A-Z_]+:|:\{"created":"@|'
    rb'Hint: If you want to see a list of allocated tensors when OOM |\r?\n$|'
    rb'To enable the following instructions: |  device=\'|'
    rb'=== Source Location Trace: ===\s*$|'
    rb'(?:\./)?(?:[\w.+-]+/)*[\w.+-]+\.(?:cc|h|c|cpp|hpp|inc):\d+\s*$)')
ABSL_BANNER = (b'WARNING: All log messages before absl::InitializeLog() is '
               b'called are written to STDERR')

# (source file, message) of lines that are no problem, in two kinds.
# PLATFORM: what TensorFlow notes at start-up about the machine it found:
# CPU features and oneDNN, the CUDA/cuDNN/cuFFT/cuBLAS/TensorRT libraries
# and drivers, a GPU's NUMA node. Matched by what the note is about, not by
# one machine's wording: the oneDNN fallback note names whichever data type
# a graph first has (DT_UINT8, DT_BOOL, DT_INT64, DT_HALF seen), on any CPU
# where oneDNN is on; the CUDA notes come from whichever module registers.
# A GPU that was asked for and is missing is caught by --num_gpus's check,
# and a real CUDA failure (out of memory, a launch error) is no start-up note
# and shows.
PLATFORM = [
    # No GPU driver, or none visible (the ps tasks and the evaluator hide
    # the GPUs on purpose); --num_gpus is checked against the visible GPUs.
    (rb'\w+\.cc', rb'failed call to cuInit'),
    (rb'cudart_stub\.cc', rb'Could not find cuda drivers'),
    # TensorFlow registers its CUDA plugins twice (tensorflow#62075).
    (rb'cuda_\w+\.cc', rb'Unable to register cu\w+ factory'),
    (rb'computation_placer\.cc', rb'computation placer already registered'),
    # TensorRT is optional; this suite does not use it.
    (rb'py_utils\.cc', rb'TF-TRT Warning: Could not find TensorRT'),
    # A GPU's NUMA node, unknown in most VMs and containers.
    (rb'\w+\.cc', rb'NUMA node'),
    # oneDNN runs an op of another data type on TensorFlow's own kernel.
    (rb'util\.cc', rb'oneDNN supports DT_\w+ only on platforms with'),
    # Instructions the binary could use (INFO, then W in some builds).
    (rb'cpu_feature_guard\.cc', rb'This TensorFlow binary is optimized'),
    (rb'port\.cc', rb'oneDNN custom operations are on'),
    # Grappler's remapper found no fused kernel for a data type on this CPU
    # (float16 BatchNorm on a Xeon with AVX-512 and no AMX) and keeps the
    # unfused ops; its kernel list follows, one `  device='...'` per line.
    (rb'graph_view\.cc', rb"No registered '_Fused\w+' OpKernel for CPU"),
]
# EVENTS: expected events, and the C++ side's copies of an error that the
# Python side reports (in one line of ours, or as a traceback).
EVENTS = [
    # A step's or a session's cleanup cancels its pending transfers and
    # queue operations, as does the timeout of a ps's wait for the done
    # posts; a step that failed aborts them with its error, which the step
    # raises. A lost task (UNAVAILABLE) passes: it says which task went.
    (rb'local_rendezvous\.cc', rb'aborting with status: (?!UNAVAILABLE)'),
    # An op's error, logged where the op ran (a ps, for a checkpoint shard);
    # the session that ran it raises the same error.
    (rb'op_kernel\.cc', rb'OP_REQUIRES failed at '),
    (rb'grpc_worker_service\.cc', rb'RecvTensor cancelled'),
    (rb'queue_base\.cc', rb'Skipping cancelled dequeue attempt'),
    # SyncReplicasOptimizer drops gradients computed on an older global
    # step, as it is built to do (backup workers, a restarted worker).
    (rb'conditional_accumulator_base\.cc', rb'current_global_step_ to smaller'),
    # --trace_steps on a machine or a task with no GPU.
    (rb'xplane_to_step_stats\.cc', rb'GPU trace was not collected'),
]
BENIGN = [(re.compile(f), re.compile(m)) for f, m in PLATFORM + EVENTS]

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
  if not match or match.group(3).endswith(b'.py'):
    return False
  if LEVELS[match.group(1) or match.group(2)] < min_level:
    return True
  message = line[match.end():]
  return any(f.fullmatch(match.group(3)) and m.search(message)
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


def first_line(error):
  """What a TensorFlow error says first, on one line, without its node list.

  A session's error opens with 'Graph execution error:' and often a line of
  '=' before the status, 'UNAVAILABLE: From /job:ps/replica:0/task:1:',
  then what happened on the next line, 'Socket closed': those two go
  together.
  """
  lines = [l.strip() for l in str(error).splitlines()]
  lines = [l for l in lines if l and l != 'Graph execution error:' and
           not l.startswith(('=', '[['))]
  return ' '.join(lines[:2]) if lines and lines[0].endswith(':') else (
      lines[0] if lines else 'no detail')
