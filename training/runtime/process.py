"""How a process of the suite starts and ends.

Every entry point that loads TensorFlow (the trainer, the planner,
show_inputs, the benchmark and its TF2 peer, the elastic run, TensorBoard
through scripts/tensorboard.sh) starts with
start(), from its `if __name__ == '__main__':` block, before TensorFlow is
imported: a test that imports one keeps its own stderr and environment.
exit_now() ends it, whatever other threads wait for.
"""

import logging
import os
import platform
import sys
import threading

from training.runtime import log_filter


def start():
  """The start-up prologue: TensorFlow's C++ chatter filtered, whole lines,
  TensorFlow's settings (tensorflow_defaults).

  Call it before TensorFlow is imported.
  """
  # Before TensorFlow loads: its C++ chatter would bury the suite's lines
  # (and TF_CPP_MIN_LOG_LEVEL alone cannot hide it). Real warnings and
  # errors still show; TF_CPP_MIN_LOG_LEVEL=0 shows everything.
  log_filter.install()
  sys.stdout, sys.stderr = WholeLines(sys.stdout), WholeLines(sys.stderr)
  tensorflow_defaults()
  # And TensorFlow's Python warnings, the TF1 API's deprecation notes at
  # every start (`WARNING:tensorflow:From ...: ... is deprecated`), which
  # the trainer's logger settings drop too; its errors show.
  if os.environ['TF_CPP_MIN_LOG_LEVEL'] in ('1', '2', '3'):
    logging.getLogger('tensorflow').addFilter(
        lambda record: record.levelno != logging.WARNING)


def tensorflow_defaults():
  """What TensorFlow reads from the environment as it loads, where the
  caller's environment does not say: no Keras 3, oneDNN's kernels on every
  x86 CPU.

  Call it before TensorFlow is imported (start() does; the tests' fork
  server too).
  """
  # No Keras 3 (unused: tf-slim has TensorFlow's own Keras 2 layers): a
  # task starts 1-2 s sooner.
  os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')
  # TensorFlow turns oneDNN on by itself only where it finds AVX512_VNNI,
  # AVX512_BF16, AVX_VNNI or AMX: an AVX2 CPU (AMD's Zen 3, Intel's before
  # Cascade Lake) would train on Eigen's slower convolutions
  # (docs/performance.md#cpu-kinds). TF_ENABLE_ONEDNN_OPTS=0 turns it off.
  if platform.machine() in ('x86_64', 'AMD64'):
    os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '1')


class WholeLines:
  """A text stream whose lines reach the stream under it whole.

  print() writes its text and its end in separate calls, so two threads
  printing at once could glue one's line to the other's (the chief's line
  taking a worker back, and a progress line). Each thread's text is held
  until its newline (or a flush) and written in one call, under a lock.
  """

  def __init__(self, stream):
    self._stream = stream
    # Reentrant: a report written while the lock is held (a finalizer's
    # unraisable error, from the garbage collector) writes to it again.
    self._lock = threading.RLock()
    self._held = threading.local()  # .text: this thread's unfinished line.

  def write(self, text):
    lines, newline, rest = (getattr(self._held, 'text', '') +
                            text).rpartition('\n')
    self._held.text = rest
    if newline:
      with self._lock:
        self._stream.write(lines + newline)
    return len(text)

  def writelines(self, lines):
    for line in lines:
      self.write(line)

  def flush(self):
    rest, self._held.text = getattr(self._held, 'text', ''), ''
    with self._lock:
      if rest:  # A line without its end yet (a progress bar's '\r').
        self._stream.write(rest)
      self._stream.flush()

  def __getattr__(self, name):  # fileno(), isatty(), encoding, buffer...
    return getattr(self._stream, name)


def exit_now(status):
  """Exits at once, whatever other threads wait for, with status."""
  sys.stdout.flush()
  log_filter.drain()  # os._exit skips atexit: get the last lines out.
  os._exit(status)
