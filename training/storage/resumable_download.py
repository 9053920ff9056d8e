"""The download into DATA_DIR.tar.gz.part: resumed, locked, MD5-summed.

scripts/download_cifar10.py fetches the archive with these functions, then
checks its MD5 and unpacks it. A rerun resumes the .part file with an HTTP
Range request (or starts again where the server does not resume); processes
sharing it (pods on a shared volume) take turns on its lock. What fails
raises DownloadError with one line saying what is kept and how to go on.
No TensorFlow: a failed download is one line, with no log lines before it.
"""

import fcntl
import hashlib
import http.client
import os
import re
import urllib.error
import urllib.parse
import urllib.request

from tqdm import tqdm

PART_SUFFIX = '.tar.gz.part'
CHUNK = 1 << 16
# The network's errors: URLError, timeouts and resets are OSErrors; a
# malformed or cut response is an HTTPException; a bad URL a ValueError.
NETWORK_ERRORS = (OSError, http.client.HTTPException, ValueError)
RESUME = 'run the same command again to resume'


class DownloadError(Exception):
  """The data could not be fetched or is not what was expected."""


class State:
  """What the download got so far, for the lines that say so."""

  def __init__(self, path):
    self.path = path  # The .part file.
    self.done = 0  # Bytes in it.
    self.total = None  # The file's bytes, when the server says.
    self.start = 0  # Bytes kept from an earlier run.
    self.checked = False  # It is complete and its MD5 right.


def local_path(url):
  """The file that --url names on this machine (a path, or a file:// URL),
  or None for a URL to download."""
  parsed = urllib.parse.urlparse(url)
  if parsed.scheme == 'file':
    return urllib.request.url2pathname(parsed.path)
  return None if '://' in url else url


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
    why = ('%s: check the network, or fetch the file where you can and pass '
           'its path, --url=PATH/cifar-10-binary.tar.gz (or a mirror\'s URL)'
           % (getattr(e, 'reason', None) or e))
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
