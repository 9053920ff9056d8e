#!/usr/bin/env python3
"""Downloads the binary CIFAR-10 and unpacks it as --data_dir.

Fetches cifar-10-binary.tar.gz into DATA_DIR.tar.gz.part, next to
--data_dir, with a progress line (bytes, percent, rate, time left); checks
its MD5, unpacks the cifar-10-batches-bin folder into a temporary folder
next to --data_dir and checks every file with the trainer's own validation
(data_layout, which needs no TensorFlow) before moving it to --data_dir in
one rename, and only then deletes the .part file. --data_dir never holds a
partial download.

Interrupted (Ctrl-C, a dropped connection, a full disk), it keeps what it got
in the .part file, says so in one line, and the same command resumes it with
an HTTP Range request (or starts again from the start when the server does
not resume). A corrupt download (wrong MD5, a bad archive) is deleted. Does
nothing when --data_dir already holds valid data, or when another process
running at the same time (another pod on a shared volume) put it there
first; processes sharing a .part file take turns on a lock. A failure is one
line `Error: ...` on stderr, exit status 1; an interruption is one line
`Interrupted: ...`, exit status 130 (143 for SIGTERM). --url and --md5 point
it at a mirror.

  python3 scripts/download_cifar10.py --data_dir=./cifar-10-batches-bin
"""

import argparse
import fcntl
import hashlib
import http.client
import os
import re
import shutil
import signal
import sys
import tarfile
import tempfile
import threading
import urllib.error
import urllib.request
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# Not cifar10_input: it imports TensorFlow, whose start-up log lines would
# come before our one line.
from training import data_layout  # pylint: disable=g-import-not-at-top,wrong-import-position
from progress import Progress, size  # pylint: disable=g-import-not-at-top,wrong-import-position

URL = 'https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz'
MD5 = 'c32a1d4ab5d03f1284b67883e8d87530'
ARCHIVE_DIR = 'cifar-10-batches-bin'
PART_SUFFIX = '.tar.gz.part'
CHUNK = 1 << 16
EXIT_ERROR = 1
# The network's errors: URLError, timeouts and resets are OSErrors; a
# malformed or cut response is an HTTPException.
NETWORK_ERRORS = (OSError, http.client.HTTPException, ValueError)


class DownloadError(Exception):
  """The data could not be fetched or is not what was expected."""


class Interrupted(KeyboardInterrupt):
  """SIGTERM, handled as Ctrl-C is."""


def part_path(data_dir):
  """Where the download is kept until checked: DATA_DIR.tar.gz.part.

  Next to --data_dir, on the same volume (so that a rerun, or another pod
  on a shared volume, finds it), and never inside it (so that nothing reads
  it as data).
  """
  return os.path.normpath(data_dir) + PART_SUFFIX


class State:
  """What an interruption message needs to know."""

  def __init__(self, path):
    self.path = path
    self.done = 0  # Bytes in the .part file.
    self.total = None
    self.start = 0  # Bytes of the .part file kept from an earlier run.
    self.checked = False  # The .part file is complete and its MD5 right.
    self.progress = None


def is_valid(data_dir):
  """True when data_dir holds readable training and test files."""
  try:
    data_layout.check_data(data_dir, eval_data=False)
    data_layout.check_data(data_dir, eval_data=True)
    return True
  except data_layout.DataError:
    return False


def kept(state):
  """`0.3 MB of 0.8 MB kept in PATH`."""
  try:
    state.done = os.path.getsize(state.path)  # What a failed write left.
  except OSError:
    pass
  return '%s%s kept in %s' % (
      size(state.done), ' of %s' % size(state.total) if state.total else '',
      state.path)


def request(url, offset, timeout):
  """Opens url from byte offset; returns (response, status)."""
  headers = {'Range': 'bytes=%d-' % offset} if offset else {}
  try:
    response = urllib.request.urlopen(
        urllib.request.Request(url, headers=headers), timeout=timeout)
    return response, response.status
  except urllib.error.HTTPError as e:
    if e.code == 416 and offset:
      return e, 416  # Nothing after offset: complete, or not ours.
    raise DownloadError('could not download %s: HTTP error %d (%s): check '
                        '--url' % (url, e.code, e.reason))
  except NETWORK_ERRORS as e:
    raise DownloadError('could not download %s: %s: check the network, or '
                        'pass --url=MIRROR' % (
                            url, getattr(e, 'reason', None) or e))


def content_range(response):
  """(first byte, total or None) from a Content-Range header, or None."""
  match = re.match(r'bytes (?:(\d+)-\d+|\*)/(\d+|\*)$',
                   response.headers.get('Content-Range') or '')
  if not match:
    return None
  first, total = match.groups()
  return (int(first) if first else None,
          int(total) if total != '*' else None)


def restart(part, out, why):
  """Empties the .part file: the download starts from the start."""
  print('  %s: downloading from the start' % why, file=out, flush=True)
  part.seek(0)
  part.truncate()


def why_not_resumed(state, url, status, got):
  """Why the .part file at state.path cannot be resumed, in a few words."""
  if status == 200:
    return '%s does not resume downloads (HTTP 200)' % url
  if status == 416 and got and got[1] is not None and got[1] < state.done:
    return '%s (%s) is bigger than %s (%s)' % (state.path, size(state.done),
                                             url, size(got[1]))
  return 'cannot resume %s from %s (HTTP %d)' % (state.path, url, status)


def open_download(url, part, state, timeout, out):
  """Requests what part lacks; returns (response or None when part is
  complete, MD5 object of part's bytes so far)."""
  offset = state.done = os.fstat(part.fileno()).st_size
  try:
    response, status = request(url, offset, timeout)
  except DownloadError as e:
    if not offset:
      raise
    raise DownloadError('%s; %s: run the same command again to resume' %
                        (e, kept(state)))
  got = content_range(response)
  if offset and status == 206 and got and got[0] == offset:
    state.total = got[1]
    length = response.headers.get('Content-Length') or ''
    if state.total is None and length.isdigit():
      state.total = offset + int(length)
    state.start = offset
    print('Resuming %s: %s' % (url, kept(state)), file=out, flush=True)
    return response, hash_file(part)
  if offset and status == 416 and got and got[1] == offset:
    response.close()
    state.start = state.total = offset
    print('%s is complete: checking it' % state.path, file=out, flush=True)
    return None, hash_file(part)
  if offset:
    restart(part, out, why_not_resumed(state, url, status, got))
    state.done = 0
    if status != 200:  # A 200 response is the whole file: go on with it.
      response.close()
      response, status = request(url, 0, timeout)
  length = response.headers.get('Content-Length')
  state.total = int(length) if length and length.isdigit() else None
  print('Downloading %s%s into %s' % (
      url, ' (%s)' % size(state.total) if state.total else '', state.path),
        file=out, flush=True)
  return response, hashlib.md5()


def hash_file(part):
  """MD5 of part's bytes; leaves part positioned at its end."""
  md5 = hashlib.md5()
  part.seek(0)
  for block in iter(lambda: part.read(1 << 20), b''):
    md5.update(block)
  return md5


def write(part, chunk):
  """Writes all of chunk to part, an unbuffered file (no bytes are left in a
  buffer for close() to write, or fail to)."""
  view = memoryview(chunk)
  while view:
    view = view[part.write(view):]


def fetch(url, part, state, timeout, out):
  """Downloads url into part (an open file), resuming it; returns its MD5.

  Raises:
    DownloadError: naming what failed; what arrived stays in part.
  """
  response, md5 = open_download(url, part, state, timeout, out)
  if response is None:
    return md5.hexdigest()
  with response:
    state.progress = Progress(out, state.total, state.done)
    while True:
      try:
        chunk = response.read1(CHUNK)
      except NETWORK_ERRORS as e:
        raise DownloadError('the download from %s failed: %s; %s: run the '
                            'same command again to resume' % (url, e,
                                                              kept(state)))
      if not chunk:
        break
      try:
        write(part, chunk)
      except OSError as e:
        raise DownloadError('cannot write %s: %s; %s: free some space, or '
                            'choose another --data_dir, and run again' % (
                                state.path, e.strerror or e, kept(state)))
      md5.update(chunk)
      state.done += len(chunk)
      state.progress.update(state.done)
  if state.total is not None and state.done < state.total:
    state.progress.end_line()
    raise DownloadError('the connection to %s closed early; %s: run the same '
                        'command again to resume' % (url, kept(state)))
  state.progress.finish()
  return md5.hexdigest()


def extract(tar, work):
  """Extracts tar into work, refusing members that would land outside it
  (tarfile's 'data' filter, where this Python has it: 3.10.12, 3.11.4 and
  later; the same checks by hand before)."""
  if hasattr(tarfile, 'data_filter'):
    tar.extractall(work, filter='data')
    return
  for member in tar.getmembers():
    parts = member.name.split('/')
    if (member.name.startswith('/') or '..' in parts or
        not (member.isfile() or member.isdir())):
      raise tarfile.TarError('unsafe member %s' % member.name)
  tar.extractall(work)


def unpack(archive, data_dir, url, state):
  """Unpacks and checks archive next to data_dir, renames it to data_dir.

  Returns False when another process put valid data there first.
  """
  parent = os.path.dirname(os.path.abspath(data_dir))
  try:
    work = tempfile.mkdtemp(prefix='.cifar10-download-', dir=parent)
  except OSError as e:
    raise DownloadError('cannot unpack into %s: %s: choose another '
                        '--data_dir' % (parent, e.strerror or e))
  try:
    try:
      with tarfile.open(archive, 'r:gz') as tar:
        extract(tar, work)
    except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
      if isinstance(e, OSError) and e.errno is not None:
        raise DownloadError(
            'cannot unpack %s into %s: %s: free some space and run again '
            '(the checked download stays in %s)' % (
                archive, parent, e.strerror or e, state.path))
      os.remove(archive)
      raise DownloadError('the archive from %s is not a valid tar.gz (%s); '
                          '%s is deleted: check --url and --md5' %
                          (url, e, archive))
    unpacked = os.path.join(work, ARCHIVE_DIR)
    try:
      if not os.path.isdir(unpacked):
        raise data_layout.DataError('it has no %s folder' % ARCHIVE_DIR)
      data_layout.check_data(unpacked, eval_data=False)
      data_layout.check_data(unpacked, eval_data=True)
    except data_layout.DataError as e:
      os.remove(archive)
      raise DownloadError('the archive from %s is not valid CIFAR-10: %s; %s '
                          'is deleted: check --url and --md5' %
                          (url, e, archive))
    return move_into_place(unpacked, data_dir)
  finally:
    shutil.rmtree(work, ignore_errors=True)


def move_into_place(unpacked, data_dir):
  """Renames unpacked to data_dir; False when another process was first."""
  try:
    if os.path.isdir(data_dir) and not os.listdir(data_dir):
      try:
        os.rmdir(data_dir)
      except FileNotFoundError:
        pass  # Another process removed it first; the rename decides.
    os.rename(unpacked, data_dir)
  except OSError as e:
    # Several processes may fetch into one shared volume at once (the
    # pods of a TFJob): when another one got there first, all is well.
    if is_valid(data_dir):
      return False
    raise DownloadError('cannot move the data to %s: %s' % (data_dir, e))
  return True


def lock(path, out):
  """Opens and locks the .part file at path (waiting for another process
  downloading into it); returns the open file."""
  while True:
    part = os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT, 0o644), 'r+b',
                     buffering=0)
    try:
      try:
        fcntl.flock(part, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        print('Waiting for another process downloading into %s' % path,
              file=out, flush=True)
        fcntl.flock(part, fcntl.LOCK_EX)
      except OSError:
        pass  # A file system without locks: go on without.
      if os.path.exists(path) and os.path.samefile(path, part.fileno()):
        return part
    except BaseException:
      part.close()
      raise
    part.close()  # The other process deleted it, done: look again.


def release(part, path, delete=False):
  """Deletes the .part file if asked or if empty, then unlocks it."""
  try:
    if delete or os.fstat(part.fileno()).st_size == 0:
      if os.path.exists(path) and os.path.samefile(path, part.fileno()):
        os.remove(path)
  finally:
    part.close()


def remove_stale(path):
  """Deletes a .part file left next to valid data, unless in use."""
  try:
    with open(path, 'rb') as part:
      fcntl.flock(part, fcntl.LOCK_EX | fcntl.LOCK_NB)
      if os.path.samefile(path, part.fileno()):
        os.remove(path)
  except OSError:
    pass  # None there, or another process holds it.


def download(data_dir, url=URL, md5=MD5, timeout=60, state=None, out=None):
  """Makes data_dir hold CIFAR-10; returns False when it already did.

  Raises:
    DownloadError: with one line saying what went wrong; --data_dir is left
      as it was, and a resumable download stays in its .part file.
    KeyboardInterrupt: likewise.
  """
  out = out or sys.stdout
  state = state or State(part_path(data_dir))
  if is_valid(data_dir):
    remove_stale(state.path)
    return False
  if os.path.exists(data_dir) and (not os.path.isdir(data_dir) or
                                   os.listdir(data_dir)):
    if is_valid(data_dir):  # Another process put it there just now.
      return False
    raise DownloadError(
        '%s exists but does not hold valid CIFAR-10 data; move it away or '
        'choose another --data_dir' % data_dir)
  try:
    os.makedirs(os.path.dirname(os.path.abspath(data_dir)), exist_ok=True)
    part = lock(state.path, out)
  except OSError as e:
    raise DownloadError('cannot write %s: %s: choose another --data_dir' %
                        (state.path, e.strerror or e))
  finished = False  # Then the .part file goes.
  try:
    if is_valid(data_dir):  # Another process finished while we waited.
      finished = True
      return False
    got = fetch(url, part, state, timeout, out)
    if got != md5.lower():
      finished = True
      raise DownloadError(
          '%s has MD5 %s, expected %s: the download is corrupt or not the '
          'CIFAR-10 binary version; %s is deleted%s: check --url and --md5' %
          (url, got, md5, state.path,
           ' (%s of it came from an earlier run)' % size(state.start)
           if state.start else ''))
    state.checked = True
    moved = unpack(state.path, data_dir, url, state)
    finished = True
    return moved
  finally:
    release(part, state.path, delete=finished)


def interrupted_line(state):
  """The one line for Ctrl-C: what is kept, and how to go on."""
  if state.checked:
    return ('Interrupted: the download is complete in %s; run the same '
            'command again to unpack it' % state.path)
  if not state.done or not os.path.exists(state.path):
    return 'Interrupted: nothing downloaded yet'
  return ('Interrupted: %s; run the same command again to resume' %
          kept(state))


def on_sigterm(signum, frame):
  del signum, frame
  raise Interrupted()


def handle_sigterm(handler):
  """Installs handler for SIGTERM; returns the one before (None when this
  is not the main thread, where no handler can be installed)."""
  if threading.current_thread() is not threading.main_thread():
    return None
  return signal.signal(signal.SIGTERM, handler)


def one_line(error):
  """An error's text on one line, whatever the exception put in it."""
  return re.sub(r'\s*\n\s*', '; ', str(error).strip())


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--data_dir', default='./cifar-10-batches-bin',
                      help='where the files go (default: %%(default)s); the '
                      'download is kept in DATA_DIR%s until checked' %
                      PART_SUFFIX)
  parser.add_argument('--url', default=URL, help='default: %(default)s')
  parser.add_argument('--md5', default=MD5, help='default: %(default)s')
  parser.add_argument('--timeout', type=float, default=60,
                      help='seconds without data before giving up '
                      '(default: %(default)s)')
  args = parser.parse_args(argv)
  state = State(part_path(args.data_dir))
  previous = handle_sigterm(on_sigterm)
  try:
    if download(args.data_dir, args.url, args.md5, args.timeout, state):
      print('CIFAR-10 is in %s' % args.data_dir)
    else:
      print('%s already holds CIFAR-10; nothing to do' % args.data_dir)
  except DownloadError as e:
    if state.progress:
      state.progress.end_line()
    print('Error: %s' % one_line(e), file=sys.stderr)
    return EXIT_ERROR
  except OSError as e:  # Not foreseen above; still one line.
    if state.progress:
      state.progress.end_line()
    print('Error: %s' % one_line(e), file=sys.stderr)
    return EXIT_ERROR
  except KeyboardInterrupt as e:
    if state.progress:
      state.progress.end_line()
    print(interrupted_line(state), file=sys.stderr)
    return 128 + (signal.SIGTERM if isinstance(e, Interrupted) else
                  signal.SIGINT)
  finally:
    if previous is not None:
      handle_sigterm(previous)
  return 0


if __name__ == '__main__':
  sys.exit(main())
