#!/usr/bin/env python3
"""Writes your own images in the CIFAR-10 binary layout, for the trainer.

SOURCE is one of:
  * a folder with one subfolder per class of PNG or JPEG images, of any
    size (each is scaled and centre-cropped to 32x32; a grey image is
    repeated in the three planes). Classes are the subfolders' names, in
    sorted order. --test_fraction of each class goes to the test set,
    chosen with --seed, unless SOURCE holds `train` and `test` folders,
    each with the class subfolders: then those are the split.
  * a folder holding IDX files, the MNIST format (MNIST, Fashion-MNIST,
    KMNIST): train-images-idx3-ubyte and train-labels-idx1-ubyte, their
    t10k- (or test-) pair, gzipped or not. Their own train and test files
    are the split and every record is written, in order; images up to
    32x32 are centred on black (28x28 gets 2 pixels each side), larger ones
    scaled as above.

OUT_DIR gets data_batch_1.bin .. data_batch_N.bin (--num_train_files),
test_batch.bin and batches.meta.txt (the class names, one a line), as in
cifar-10-batches-bin: each record 1 label byte and 3072 image bytes (1024
red, 1024 green, 1024 blue, row-major 32x32). A bad input is one line,
`Error: ...`, exit status 1, and nothing written.

  python3 scripts/make_cifar_binary.py /usr/share/datasets/fashion-mnist \\
      ./fashion-mnist-batches-bin
"""

import argparse
import gzip
import os
import re
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from training.storage import data_layout  # pylint: disable=g-import-not-at-top,wrong-import-position
from tqdm import tqdm  # pylint: disable=g-import-not-at-top,wrong-import-position

SIZE = data_layout.cifar_height
IMAGE_EXTENSIONS = ('.png', '.jpg', '.jpeg')
MAX_CLASSES = 256  # What the label byte holds.
IDX_FILE = re.compile(r'idx[13]-ubyte(\.gz)?$')
IDX_UBYTE = 0x08


class InputError(Exception):
  """SOURCE cannot be converted; the message says why and what to do."""


def read_idx(path):
  """Returns the array an IDX file holds (only unsigned bytes: MNIST's)."""
  opener = gzip.open if path.endswith('.gz') else open
  try:
    with opener(path, 'rb') as f:
      data = f.read()
  except (OSError, EOFError) as e:
    raise InputError('%s cannot be read: %s' % (path, e))
  if len(data) < 4 or data[0] or data[1] or data[2] != IDX_UBYTE:
    raise InputError('%s is not an IDX file of unsigned bytes (its first '
                     'bytes are %s)' % (path, data[:4].hex()))
  ndim = data[3]
  shape = tuple(np.frombuffer(data, '>u4', ndim, 4))
  body = np.frombuffer(data, np.uint8, offset=4 + 4 * ndim)
  if body.size != int(np.prod(shape)):
    raise InputError('%s holds %d bytes of data where its header says %s: '
                     'the file is truncated' % (path, body.size, shape))
  return body.reshape(shape)


def idx_pairs(source, names):
  """Returns {'train': (images path, labels path), 'test': (...)}."""
  pairs = {}
  for name in names:
    if 'idx3' not in name:
      continue
    split = ('test' if name.startswith(('t10k', 'test')) or '-test' in name
             else 'train' if 'train' in name else None)
    labels = name.replace('images', 'labels').replace('imgs', 'labels'
                                                      ).replace('idx3', 'idx1')
    if split is None:
      raise InputError('%s: cannot tell whether it is the training or the '
                       'test set: its name has neither train- nor t10k- '
                       '(or test-) in front' % os.path.join(source, name))
    if labels not in names:
      raise InputError('%s has no labels: %s is missing beside it' % (
          os.path.join(source, name), labels))
    if split in pairs:
      raise InputError('%s holds two %s sets of IDX files (%s, %s): keep one '
                       'pair of each' % (source, split, pairs[split][0],
                                         name))
    pairs[split] = (name, labels)
  for split in ('train', 'test'):
    if split not in pairs:
      raise InputError('%s has no %s images in IDX format (%s-images-idx3-'
                       'ubyte): the IDX train and test files are both needed'
                       % (source, split, 'train' if split == 'train'
                          else 't10k'))
  return {split: tuple(os.path.join(source, n) for n in pair)
          for split, pair in pairs.items()}


def fit(image):
  """A PIL image, scaled and centre-cropped to SIZE x SIZE RGB, as uint8
  [3, SIZE, SIZE]."""
  from PIL import ImageOps  # pylint: disable=g-import-not-at-top
  image = ImageOps.fit(image.convert('RGB'), (SIZE, SIZE))
  return np.asarray(image, np.uint8).transpose(2, 0, 1)


def from_grey(images):
  """uint8 [n, h, w] grey images as [n, 3, SIZE, SIZE]: centred on black
  when they fit, else scaled and cropped."""
  n, height, width = images.shape
  if height <= SIZE and width <= SIZE:
    out = np.zeros((n, SIZE, SIZE), np.uint8)
    top, left = (SIZE - height) // 2, (SIZE - width) // 2
    out[:, top:top + height, left:left + width] = images
  else:
    from PIL import Image  # pylint: disable=g-import-not-at-top
    out = np.stack([fit(Image.fromarray(i))[0] for i in images])
  return np.repeat(out[:, None], 3, axis=1)


def load_idx(source, names):
  """Returns {'train': (labels, images), 'test': ...}, and the classes."""
  sets = {}
  for split, (images_path, labels_path) in idx_pairs(source, names).items():
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.ndim != 3 or labels.ndim != 1:
      raise InputError('%s and %s hold arrays of shapes %s and %s; expected '
                       'images [n, height, width] and labels [n]' % (
                           images_path, labels_path, images.shape,
                           labels.shape))
    if len(images) != len(labels):
      raise InputError('%s has %d images but %s has %d labels' % (
          images_path, len(images), labels_path, len(labels)))
    sets[split] = (labels, from_grey(images))
  count = 1 + max(int(labels.max()) for labels, _ in sets.values())
  return sets, [str(i) for i in range(count)]


def class_folders(folder):
  """Returns [(class name, [image paths])], classes in sorted order."""
  classes = []
  for name in sorted(os.listdir(folder)):
    path = os.path.join(folder, name)
    if not os.path.isdir(path):
      continue
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(path)
                   for f in fs if f.lower().endswith(IMAGE_EXTENSIONS))
    if not files:
      raise InputError('%s holds no PNG or JPEG images: every class folder '
                       'needs some (or remove it)' % path)
    classes.append((name, files))
  if not classes:
    raise InputError('%s holds neither IDX files nor class folders of PNG or '
                     'JPEG images (SOURCE/CLASS/IMAGE.png)' % folder)
  if len(classes) > MAX_CLASSES:
    raise InputError('%s has %d class folders: the CIFAR-10 layout\'s label '
                     'byte holds at most %d classes' % (folder, len(classes),
                                                        MAX_CLASSES))
  return classes


def split_files(classes, test_fraction, rng):
  """Returns {'train': [(path, label)], 'test': [...]}: test_fraction of
  each class (at least one image when it has two) to the test set."""
  sets = {'train': [], 'test': []}
  for label, (_, files) in enumerate(classes):
    order = rng.permutation(len(files))
    n_test = int(round(test_fraction * len(files)))
    if test_fraction > 0 and len(files) > 1:
      n_test = min(max(n_test, 1), len(files) - 1)
    for rank, i in enumerate(order):
      sets['test' if rank < n_test else 'train'].append((files[i], label))
  return sets


def load_images(items, progress):
  """Returns (labels, images [n, 3, SIZE, SIZE]) of [(path, label)]."""
  from PIL import Image, UnidentifiedImageError  # pylint: disable=g-import-not-at-top
  images = np.empty((len(items), 3, SIZE, SIZE), np.uint8)
  for i, (path, _) in enumerate(items):
    try:
      with Image.open(path) as image:
        images[i] = fit(image)
    except (OSError, UnidentifiedImageError, ValueError) as e:
      raise InputError('%s cannot be read as an image (%s): fix or remove '
                       'it' % (path, e))
    progress.update()
  return np.array([label for _, label in items], np.uint8), images


def load_tree(source, test_fraction, seed, out):
  """Returns {'train': (labels, images), 'test': ...}, and the classes, of
  a folder tree of images."""
  rng = np.random.default_rng(seed)
  subfolders = {d for d in os.listdir(source)
                if os.path.isdir(os.path.join(source, d))}
  if subfolders == {'train', 'test'}:
    trees = {s: class_folders(os.path.join(source, s)) for s in subfolders}
    names = [name for name, _ in trees['train']]
    if [name for name, _ in trees['test']] != names:
      raise InputError('%s/train and %s/test have different class folders: '
                       'they need the same' % (source, source))
    items = {s: [(f, label) for label, (_, fs) in enumerate(trees[s])
                 for f in fs] for s in trees}
  else:
    classes = class_folders(source)
    names = [name for name, _ in classes]
    items = split_files(classes, test_fraction, rng)
  for split in ('train', 'test'):
    if not items[split]:
      raise InputError('the %s set would be empty: give each class at least '
                       'two images, or a --test_fraction between 0 and 1'
                       % split)
    # Mixed classes in every file, as CIFAR-10's are: the queue reads the
    # files in turn.
    items[split] = [items[split][i] for i in rng.permutation(
        len(items[split]))]
  with tqdm(total=len(items['train']) + len(items['test']), unit=' images',
            file=out, mininterval=0.1 if out.isatty() else 10) as progress:
    sets = {split: load_images(items[split], progress)
            for split in ('train', 'test')}
  return sets, names


def records(labels, images):
  """The CIFAR-10 binary layout's bytes of these records."""
  out = np.empty((len(labels), data_layout.RECORD_BYTES), np.uint8)
  out[:, 0] = labels
  out[:, 1:] = images.reshape(len(labels), -1)
  return out.tobytes()


def write(out_dir, sets, class_names, num_train_files):
  """Writes the training files, the test file and batches.meta.txt, each
  under its name only once all are whole: an interrupted run leaves none.
  Returns the number of training files."""
  labels, images = sets['train']
  chunks = np.array_split(np.arange(len(labels)),
                          min(num_train_files, len(labels)))
  contents = {'data_batch_%d.bin' % (i + 1): records(labels[c], images[c])
              for i, c in enumerate(chunks)}
  contents[data_layout.TEST_FILE] = records(*sets['test'])
  contents['batches.meta.txt'] = ('\n'.join(class_names) + '\n\n').encode()
  os.makedirs(out_dir, exist_ok=True)
  try:
    for name, data in contents.items():
      with open(os.path.join(out_dir, name + '.tmp'), 'wb') as f:
        f.write(data)
    for name in contents:
      os.replace(os.path.join(out_dir, name + '.tmp'),
                 os.path.join(out_dir, name))
  finally:  # Our temporaries only: not what was there by that name.
    for name in contents:
      if os.path.isfile(os.path.join(out_dir, name + '.tmp')):
        os.remove(os.path.join(out_dir, name + '.tmp'))
  return len(chunks)


def check_out_dir(out_dir):
  """Refuses an OUT_DIR that already holds data: it is never overwritten."""
  if os.path.isdir(out_dir) and any(
      name.startswith('data_batch_') or name == data_layout.TEST_FILE
      for name in os.listdir(out_dir)):
    raise InputError('%s already holds CIFAR-10 binary files: give another '
                     'OUT_DIR, or delete them first' % out_dir)


def convert(source, out_dir, test_fraction=0.2, seed=0, num_train_files=5,
            class_names=None, out=sys.stdout):
  """Converts SOURCE into OUT_DIR; returns the line that says what it
  wrote. Raises InputError."""
  if not os.path.isdir(source):
    raise InputError('%s is not a folder: SOURCE is a folder of class '
                     'folders of images, or of IDX files' % source)
  check_out_dir(out_dir)
  names = sorted(os.listdir(source))
  if any(IDX_FILE.search(n) for n in names):
    kind = 'IDX files'
    sets, classes = load_idx(source, names)
  else:
    kind = 'images'
    sets, classes = load_tree(source, test_fraction, seed, out)
  if class_names:
    if len(class_names) < len(classes):
      raise InputError('--class_names names %d classes, but the labels go up '
                       'to %d' % (len(class_names), len(classes) - 1))
    classes = class_names
  files = write(out_dir, sets, classes, num_train_files)
  return ('Wrote %d training records (%d files) and %d test records of %d '
          'classes, from the %s in %s, to %s' % (
              len(sets['train'][0]), files, len(sets['test'][0]),
              len(classes), kind, source, out_dir))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('source', metavar='SOURCE',
                      help='class folders of images, or IDX files')
  parser.add_argument('out_dir', metavar='OUT_DIR',
                      help='where to write the CIFAR-10 binary files')
  parser.add_argument('--test_fraction', type=float, default=0.2,
                      help='of each class, for a folder of images without '
                      'train/ and test/ (default: %(default)s)')
  parser.add_argument('--seed', type=int, default=0,
                      help='for the split and the order (default: '
                      '%(default)s)')
  parser.add_argument('--num_train_files', type=int, default=5,
                      help='data_batch_N.bin files (default: %(default)s)')
  parser.add_argument('--class_names', default='',
                      help='comma-separated, for batches.meta.txt (default: '
                      'the folder names; for IDX files 0, 1, ...)')
  args = parser.parse_args(argv)
  if not 0 < args.test_fraction < 1:
    parser.error('--test_fraction must be between 0 and 1')
  if args.num_train_files < 1:
    parser.error('--num_train_files must be at least 1')
  try:
    print(convert(args.source, args.out_dir, args.test_fraction, args.seed,
                  args.num_train_files,
                  [n for n in args.class_names.split(',') if n]))
  except InputError as e:
    print('Error: %s' % e, file=sys.stderr)
    return 1
  except OSError as e:  # A full disk, a folder we may not write.
    print('Error: could not write %s: %s' % (args.out_dir, e),
          file=sys.stderr)
    return 1
  except KeyboardInterrupt:
    print('Interrupted: nothing was written to %s' % args.out_dir,
          file=sys.stderr)
    return 130
  return 0


if __name__ == '__main__':
  sys.exit(main())
