#!/usr/bin/env python3
"""Downloads the binary CIFAR-10 and unpacks it as --data_dir.

Fetches cifar-10-binary.tar.gz into DATA_DIR.tar.gz.part, next to
--data_dir, with a progress bar; checks its MD5, unpacks it next to
--data_dir, checks every file with the trainer's own validation
(data_layout, which needs no TensorFlow), moves it to --data_dir in one
rename, and only then deletes the .part file: --data_dir never holds a
partial download.

Interrupted (Ctrl-C, SIGTERM, a dropped connection, a full disk), it keeps
what it got in the .part file and says so in one line; the same command
resumes it with an HTTP Range request (or starts again where the server
does not resume). A corrupt download is deleted. Does nothing when
--data_dir already holds valid data, put there by this or another process
(another pod on a shared volume); processes sharing a .part file take turns
on a lock. A failure is one line `Error: ...` on stderr, exit status 1; an
interruption one line `Interrupted: ...`, exit status 130 (143 for
SIGTERM). --url and --md5 point it at a mirror.

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

from tqdm import tqdm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# Not cifar10_input: it imports TensorFlow, whose start-up log lines would
# come before our one line.
from training import data_layout  # pylint: disable=g-import-not-at-top,wrong-import-position

URL = 'https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz'
MD5 = 'c32a1d4ab5d03f1284b67883e8d87530'
ARCHIVE_DIR = 'cifar-10-batches-bin'
PART_SUFFIX = '.tar.gz.part'
CHUNK = 1 << 16
EXIT_ERROR = 1
# The network's errors: URLError, timeouts and resets are OSErrors; a
# malformed or cut response is an HTTPException; a bad URL a ValueError.
NETWORK_ERRORS = (OSError, http.client.HTTPException, ValueError)
RESUME = 'run the same command again to resume'


class DownloadError(Exception):
  """The data could not be fetched or is not what was expected."""


class Interrupted(KeyboardInterrupt):
  """SIGTERM, handled as Ctrl-C is."""


class State:
  """What the download got so far, for the lines that say so."""

  def __init__(self, path):
    self.path = path  # The .part file.
    self.done = 0  # Bytes in it.
    self.total = None  # The file's bytes, when the server says.
    self.start = 0  # Bytes kept from an earlier run.
    self.checked = False  # It is complete and its MD5 right.


def part_path(data_dir):
  """DATA_DIR.tar.gz.part: next to --data_dir, on the same volume (a rerun,
  or another pod, finds it), never inside it (nothing reads it as data)."""
  return os.path.normpath(data_dir) + PART_SUFFIX


def size(n):
  """A byte count for people: 512 B, 12.3 kB, 170.5 MB, 1.23 GB."""
  if n < 1e3:
    return '%d B' % n
  for unit, scale in (('kB', 1e3), ('MB', 1e6)):
    if n < 1e3 * scale:
      return '%.1f %s' % (n / scale, unit)
  return '%.2f GB' % (n / 1e9)


def check(data_dir):
  """Raises data_layout.DataError unless data_dir holds readable training
  and test files."""
  data_layout.check_data(data_dir, eval_data=False)
  data_layout.check_data(data_dir, eval_data=True)


def is_valid(data_dir):
  """Whether check(data_dir) passes."""
  try:
    check(data_dir)
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


def request(url, offset, timeout, state):
  """Opens url from byte offset; returns (response, HTTP status)."""
  headers = {'Range': 'bytes=%d-' % offset} if offset else {}
  try:
    response = urllib.request.urlopen(
        urllib.request.Request(url, headers=headers), timeout=timeout)
    return response, response.status
  except urllib.error.HTTPError as e:
    if e.code == 416 and offset:
      return e, 416  # Nothing after offset: complete, or not ours.
    why = 'HTTP error %d (%s): check --url' % (e.code, e.reason)
  except NETWORK_ERRORS as e:
    why = '%s: check the network, or pass --url=MIRROR' % (
        getattr(e, 'reason', None) or e)
  raise DownloadError('could not download %s: %s%s' % (
      url, why, '; %s: %s' % (kept(state), RESUME) if offset else ''))


def content_range(response):
  """(first byte or None, total or None) of its Content-Range header."""
  match = re.match(r'bytes (?:(\d+)-\d+|\*)/(\d+|\*)$',
                   response.headers.get('Content-Range') or '')
  if not match:
    return None, None
  first, total = match.groups()
  return int(first) if first else None, None if total == '*' else int(total)


def open_download(url, part, state, timeout, out):
  """Requests what part lacks; returns (response, or None when part is
  complete; the MD5 object of part's bytes so far)."""
  offset = state.done = os.fstat(part.fileno()).st_size
  response, status = request(url, offset, timeout, state)
  first, total = content_range(response)
  if offset and status == 206 and first == offset:
    state.start, state.total = offset, total
    print('Resuming %s: %s' % (url, kept(state)), file=out, flush=True)
    return response, hash_file(part)
  if offset and status == 416 and total == offset:
    response.close()
    state.start = state.total = offset
    print('%s is complete: checking it' % state.path, file=out, flush=True)
    return None, hash_file(part)
  if offset:
    print('  %s: downloading from the start' % why_not_resumed(
        state, url, status, total), file=out, flush=True)
    part.seek(0)
    part.truncate()
    state.done = 0
    if status != 200:  # A 200 response is the whole file: go on with it.
      response.close()
      response, status = request(url, 0, timeout, state)
  length = response.headers.get('Content-Length') or ''
  state.total = int(length) if length.isdigit() else None
  print('Downloading %s%s into %s' % (
      url, ' (%s)' % size(state.total) if state.total else '', state.path),
        file=out, flush=True)
  return response, hashlib.md5()


def why_not_resumed(state, url, status, total):
  """Why the .part file cannot be resumed, in a few words."""
  if status == 200:
    return '%s does not resume downloads (HTTP 200)' % url
  if status == 416 and total is not None and total < state.done:
    return '%s (%s) is bigger than %s (%s)' % (state.path, size(state.done),
                                             url, size(total))
  return 'cannot resume %s from %s (HTTP %d)' % (state.path, url, status)


def hash_file(part):
  """MD5 of part's bytes; leaves part positioned at its end."""
  md5 = hashlib.md5()
  part.seek(0)
  for block in iter(lambda: part.read(1 << 20), b''):
    md5.update(block)
  return md5


def fetch(url, part, state, timeout, out):
  """Downloads url into part (an open unbuffered file), resuming it, with
  a progress bar on out; returns its MD5.

  Raises:
    DownloadError: naming what failed; what arrived stays in part.
  """
  response, md5 = open_download(url, part, state, timeout, out)
  if response is None:
    return md5.hexdigest()
  with response, tqdm(total=state.total, initial=state.done, unit='B',
                      unit_scale=True, file=out,
                      mininterval=0.1 if out.isatty() else 10) as bar:
    while True:
      try:
        chunk = response.read1(CHUNK)
      except NETWORK_ERRORS as e:
        raise DownloadError('the download from %s failed: %s; %s: %s' % (
            url, e, kept(state), RESUME))
      if not chunk:
        break
      write(part, chunk, state)
      md5.update(chunk)
      state.done += len(chunk)
      bar.update(len(chunk))
  if state.total is not None and state.done < state.total:
    raise DownloadError('the connection to %s closed early; %s: %s' % (
        url, kept(state), RESUME))
  return md5.hexdigest()


def write(part, chunk, state):
  """Writes all of chunk: part is unbuffered, so that no bytes are left in
  a buffer for close() to write, or fail to."""
  view = memoryview(chunk)
  try:
    while view:
      view = view[part.write(view):]
  except OSError as e:
    raise DownloadError('cannot write %s: %s; %s: free some space, or choose '
                        'another --data_dir, and run again' % (
                            state.path, e.strerror or e, kept(state)))


def extract(tar, work):
  """Extracts tar into work, refusing members that would land outside it
  (tarfile's 'data' filter where this Python has it, the same checks by
  hand before)."""
  if hasattr(tarfile, 'data_filter'):
    tar.extractall(work, filter='data')
    return
  for member in tar.getmembers():
    parts = member.name.split('/')
    if (member.name.startswith('/') or '..' in parts or
        not (member.isfile() or member.isdir())):
      raise tarfile.TarError('unsafe member %s' % member.name)
  tar.extractall(work)


def unpack(archive, data_dir, url):
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
      unpacked = os.path.join(work, ARCHIVE_DIR)
      if not os.path.isdir(unpacked):
        raise data_layout.DataError('it has no %s folder' % ARCHIVE_DIR)
      check(unpacked)
    except OSError as e:
      if e.errno is None:  # tarfile's own errors about the bytes.
        raise bad_archive(archive, url, 'a valid tar.gz (%s)' % e)
      raise DownloadError(
          'cannot unpack %s into %s: %s: free some space and run again (the '
          'checked download stays in %s)' % (archive, parent,
                                             e.strerror or e, archive))
    except (tarfile.TarError, EOFError, zlib.error) as e:
      raise bad_archive(archive, url, 'a valid tar.gz (%s)' % e)
    except data_layout.DataError as e:
      raise bad_archive(archive, url, 'valid CIFAR-10: %s' % e)
    return move_into_place(unpacked, data_dir)
  finally:
    shutil.rmtree(work, ignore_errors=True)


def bad_archive(archive, url, what):
  """Deletes archive; the DownloadError that says it is not what."""
  os.remove(archive)
  return DownloadError('the archive from %s is not %s; %s is deleted: check '
                       '--url and --md5' % (url, what, archive))


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
    # The pods of a TFJob may fetch into one shared volume at once: when
    # another one got there first, all is well.
    if is_valid(data_dir):
      return False
    raise DownloadError('cannot move the data to %s: %s' % (data_dir, e))
  return True


def is_at(path, f):
  """Whether the open file f is the file at path (not one deleted since)."""
  return os.path.exists(path) and os.path.samefile(path, f.fileno())


def lock(path, out):
  """Opens and locks the .part file at path, waiting for another process
  downloading into it; returns the open unbuffered file."""
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
      if is_at(path, part):
        return part
    except BaseException:
      part.close()
      raise
    part.close()  # The other process deleted it, done: look again.


def release(part, path, delete=False):
  """Deletes the .part file if asked or if empty, then unlocks it."""
  try:
    if (delete or os.fstat(part.fileno()).st_size == 0) and is_at(path, part):
      os.remove(path)
  finally:
    part.close()


def remove_stale(path):
  """Deletes a .part file left next to valid data, unless in use."""
  try:
    with open(path, 'rb') as part:
      fcntl.flock(part, fcntl.LOCK_EX | fcntl.LOCK_NB)
      if is_at(path, part):
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
    moved = unpack(state.path, data_dir, url)
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
  return 'Interrupted: %s; %s' % (kept(state), RESUME)


def on_sigterm(signum, frame):
  """SIGTERM's handler: stops the download as Ctrl-C does."""
  del signum, frame
  raise Interrupted()


def main(argv=None):
  """Downloads as the command line asks; returns the exit status."""
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
  # Only the main thread may handle signals (not a test's other thread).
  main_thread = threading.current_thread() is threading.main_thread()
  previous = signal.signal(signal.SIGTERM, on_sigterm) if main_thread else None
  try:
    if download(args.data_dir, args.url, args.md5, args.timeout, state):
      print('CIFAR-10 is in %s' % args.data_dir)
    else:
      print('%s already holds CIFAR-10; nothing to do' % args.data_dir)
  except (DownloadError, OSError) as e:  # OSError: one not foreseen.
    print('Error: %s' % re.sub(r'\s*\n\s*', '; ', str(e).strip()),
          file=sys.stderr)
    return EXIT_ERROR
  except KeyboardInterrupt as e:
    print(interrupted_line(state), file=sys.stderr)
    return 128 + (signal.SIGTERM if isinstance(e, Interrupted) else
                  signal.SIGINT)
  finally:
    if previous is not None:
      signal.signal(signal.SIGTERM, previous)
  return 0


if __name__ == '__main__':
  sys.exit(main())
