"""CIFAR-10 binary reader feeding a multi-threaded shuffle_batch queue.

The reference design's input pipeline, rebuilt for TensorFlow 2.x in TF1 graph
mode: string_input_producer -> FixedLengthRecordReader -> decode_raw ->
CHW to HWC -> (augmentation) -> per-image standardization ->
tf.train.shuffle_batch with 16 preprocessing threads.

Unlike the reference it validates the data before building any graph, sizes
its queues from the records actually present, seeds file order and shuffling
per task so that workers do not read the same sequence, and keeps the
augmentation and standardization the reference had commented out (switchable,
to reproduce its raw-pixel run).
"""

import tensorflow as tf

# The data files' layout and validation live in data_layout, which does not
# import TensorFlow (the downloader uses them); they are re-exported here.
from training.storage.data_layout import (  # pylint: disable=unused-import
    DataError, IMAGE_BYTES, META_FILE, NUM_CLASSES, RECORD_BYTES, TEST_FILE,
    TRAIN_PATTERN, check_data, cifar_depth, cifar_height, cifar_label_bytes,
    cifar_width, count_records, data_files, num_classes, num_records)

tf1 = tf.compat.v1

IMAGE_SIZE = 32
NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN = 50000
NUM_EXAMPLES_PER_EPOCH_FOR_EVAL = 10000

# The reference keeps 40% of an epoch in the shuffle queue (20,000 records for
# CIFAR-10); we keep that fraction of the records present, capped at the
# reference's 20,000 so that a bigger dataset does not grow memory without end.
MIN_FRACTION_OF_EXAMPLES_IN_QUEUE = 0.4
MAX_MIN_QUEUE_EXAMPLES = 20000

# Augmentation of the TensorFlow CIFAR-10 tutorial, which the reference
# commented out: pad 4 pixels and crop back, flip, jitter brightness/contrast.
# The padding is a flag (--crop_padding): Fashion-MNIST's 28x28 photos,
# centred on a black 32x32 and never shifted in its test set, learn better
# in 20 epochs without crops (docs/accuracy.md).
PAD_PIXELS = 4
# Records a preprocessing thread reads and transforms per session call.
RECORDS_PER_READ = 32
MAX_BRIGHTNESS_DELTA = 63
CONTRAST_RANGE = (0.2, 1.8)
# Random erasing (Zhong et al., AAAI 2020), the paper's ranges: the
# rectangle covers 2-40% of the photo, its height over its width 0.3-3.33.
# A draw that does not fit in the photo is drawn again, up to ERASE_TRIES
# times (torchvision's 10); a photo whose draws all miss is left whole.
ERASE_AREA = (0.02, 0.4)
ERASE_ASPECT = (0.3, 1 / 0.3)
ERASE_TRIES = 10
ERASE_FILLS = ('noise', 'mean')


def queue_sizes(num_records, batch_size):
  """Returns (min_after_dequeue, capacity) for the batching queue.

  The reference's 40% of an epoch, counted on the records present (so a
  100-record dataset neither stalls nor needs 20,000 records), at most
  MAX_MIN_QUEUE_EXAMPLES, with room for three more batches.
  """
  min_queue_examples = min(
      int(num_records * MIN_FRACTION_OF_EXAMPLES_IN_QUEUE),
      MAX_MIN_QUEUE_EXAMPLES)
  return min_queue_examples, min_queue_examples + 3 * batch_size


def read_cifar10(filename_queue, max_records=1):
  """Reads up to max_records records from one file of the queue.

  Returns:
    uint8 images [n, 32, 32, 3] and int32 labels [n], n <= max_records.
  """
  reader = tf1.FixedLengthRecordReader(record_bytes=RECORD_BYTES)
  _, values = reader.read_up_to(filename_queue, max_records)
  records = tf1.decode_raw(values, tf.uint8)
  labels = tf.cast(records[:, 0], tf.int32)
  depth_major = tf.reshape(records[:, cifar_label_bytes:],
                           [-1, cifar_depth, cifar_height, cifar_width])
  # The file stores colour planes (CHW); the network wants HWC. This uint8
  # transpose runs on TensorFlow's own kernel, not oneDNN's, which then logs
  # "oneDNN supports DT_UINT8 only on platforms with AVX-512" (log_filter
  # drops that note). Casting first does not change it: grappler moves the
  # cast back after the transpose. Measured: 130 us per read of 32 records
  # against 68 us for oneDNN's float32 kernel, in the reader threads, off the
  # training step.
  return tf.transpose(depth_major, [0, 2, 3, 1]), labels


def random_crops(images, padding=PAD_PIXELS):
  """Pads a batch by padding pixels of black on every side and crops each
  image back at a random place: a random shift of up to padding pixels."""
  if padding == 0:
    return images
  size = IMAGE_SIZE + 2 * padding
  padded = tf.image.pad_to_bounding_box(images, padding, padding, size, size)
  n = tf.shape(images)[0]
  offsets = tf1.random_uniform([n, 2], 0, 2 * padding + 1, dtype=tf.int32)
  span = tf.range(IMAGE_SIZE)
  rows = offsets[:, :1] + span  # [n, 32]: the rows each image keeps.
  cols = offsets[:, 1:] + span
  cropped = tf.gather(padded, rows, axis=1, batch_dims=1)
  return tf.gather(cropped, cols, axis=2, batch_dims=1)


def random_erasing(images, probability, fill='noise'):
  """Replaces a random rectangle of each photo, with the given probability,
  by noise or by the photo's mean.

  The fill follows the photo's own statistics, so that it is the paper's
  in the standardized photo (noise of mean 0 and deviation 1, or 0) and
  still fits a raw one (--nostandardize).

  Args:
    images: float32 [n, 32, 32, 3].
    probability: Python float, the share of photos erased; 0 returns images.
    fill: 'noise' (each value drawn from a normal of the photo's mean and
      deviation) or 'mean' (the photo's mean).
  """
  if not probability:
    return images
  with tf.name_scope('random_erasing'):
    n = tf.shape(images)[0]
    area = IMAGE_SIZE * IMAGE_SIZE * tf1.random_uniform(
        [n, ERASE_TRIES], *ERASE_AREA)
    aspect = tf1.random_uniform([n, ERASE_TRIES], *ERASE_ASPECT)
    heights = tf.cast(tf.round(tf.sqrt(area * aspect)), tf.int32)
    widths = tf.cast(tf.round(tf.sqrt(area / aspect)), tf.int32)
    fits = (heights < IMAGE_SIZE) & (widths < IMAGE_SIZE)
    # The first draw that fits, as the paper's code and torchvision take it.
    first = tf.argmax(tf.cast(fits, tf.int32), axis=1, output_type=tf.int32)
    height = tf.gather(heights, first, batch_dims=1)
    width = tf.gather(widths, first, batch_dims=1)
    erase = tf.reduce_any(fits, axis=1) & (
        tf1.random_uniform([n]) < probability)
    top = tf.cast(tf1.random_uniform([n]) * tf.cast(
        IMAGE_SIZE - height + 1, tf.float32), tf.int32)
    left = tf.cast(tf1.random_uniform([n]) * tf.cast(
        IMAGE_SIZE - width + 1, tf.float32), tf.int32)
    span = tf.range(IMAGE_SIZE)
    rows = (span >= top[:, None]) & (span < (top + height)[:, None])
    cols = (span >= left[:, None]) & (span < (left + width)[:, None])
    inside = (rows[:, :, None] & cols[:, None, :] &
              erase[:, None, None])[..., None]  # [n, 32, 32, 1]
    mean, variance = tf.nn.moments(images, axes=[1, 2, 3], keepdims=True)
    values = mean if fill == 'mean' else mean + tf.sqrt(
        variance) * tf1.random_normal(tf.shape(images))
    return tf.where(tf.broadcast_to(inside, tf.shape(images)),
                    tf.broadcast_to(values, tf.shape(images)), images)


def preprocess(images, distort, standardize, crop_padding=PAD_PIXELS,
               erasing=0.0, erasing_fill='noise'):
  """Turns a uint8 NHWC batch into the float32 network input.

  Every random choice is made per image, as tf.image's single-image ops
  would, but on the whole batch at once.

  Args:
    images: uint8 tensor [n, 32, 32, 3].
    distort: Python bool, apply training augmentation.
    standardize: Python bool, apply per-image standardization.
    crop_padding: With distort, the random crop's padding in pixels: each
      image shifts by up to that many; 0 crops nothing.
    erasing, erasing_fill: With distort, the share of photos with a
      rectangle erased after the standardization, and what fills it
      (random_erasing()).

  Returns:
    float32 tensor [n, 32, 32, 3]; raw 0..255 values when both are False.
  """
  images = tf.cast(images, tf.float32)
  if distort:
    n = tf.shape(images)[0]
    images = random_crops(images, crop_padding)
    images = tf.image.random_flip_left_right(images)
    images += tf1.random_uniform([n, 1, 1, 1], -MAX_BRIGHTNESS_DELTA,
                                 MAX_BRIGHTNESS_DELTA)
    # tf.image.adjust_contrast: scale each channel about its mean.
    mean = tf.reduce_mean(images, axis=[1, 2], keepdims=True)
    images = (images - mean) * tf1.random_uniform(
        [n, 1, 1, 1], *CONTRAST_RANGE) + mean
  if standardize:
    images = tf.image.per_image_standardization(images)
  if distort:
    images = random_erasing(images, erasing, erasing_fill)
  return images


def generate_batch_inputs(eval_data, shuffle, data_dir, batch_size,
                          num_preprocess_threads=16, distort=None,
                          standardize=True, seed=None, num_epochs=None,
                          crop_padding=PAD_PIXELS, erasing=0.0,
                          erasing_fill='noise'):
  """Builds the input pipeline; returns (images, labels) batches.

  Args:
    eval_data: Python bool; True reads `test_batch.bin`, False reads
      `data_batch_*.bin`.
    shuffle: Python bool; shuffle_batch when True, an in-order batch when
      False.
    data_dir: Directory of the CIFAR-10 binary files.
    batch_size: Number of examples per batch.
    num_preprocess_threads: Threads that read and preprocess records.
    distort: Python bool, training augmentation; defaults to `not eval_data`.
    standardize: Python bool, per-image standardization.
    seed: Optional int seeding file order and shuffling; give each task its
      own so that workers read different sequences.
    num_epochs: None repeats forever; an int reads every record that many
      times and then raises OutOfRangeError, with a smaller final batch (the
      evaluator uses 1, with one thread, to see each record exactly once).
    crop_padding, erasing, erasing_fill: With distort, the random crop's
      padding and random erasing (preprocess()).

  Returns:
    images: float32 [batch_size, 32, 32, 3] (the last batch may be smaller
      when num_epochs is set).
    labels: int32 [batch_size].

  Raises:
    DataError: before any op is built, if the data is missing or malformed.
  """
  if distort is None:
    distort = not eval_data
  files, num_records = check_data(data_dir, eval_data)
  min_queue_examples, capacity = queue_sizes(num_records, batch_size)
  with tf.name_scope('input'):
    filename_queue = tf1.train.string_input_producer(
        files, shuffle=shuffle, seed=seed, num_epochs=num_epochs)
    # Each thread reads and preprocesses a run of records per session call:
    # one call per record costs more than the work itself, above all in a
    # cluster, where every call goes through the gRPC master.
    images, labels = read_cifar10(filename_queue,
                                  min(RECORDS_PER_READ, batch_size))
    images = preprocess(images, distort, standardize, crop_padding,
                        erasing, erasing_fill)
    images.set_shape([None, IMAGE_SIZE, IMAGE_SIZE, cifar_depth])
    batch_args = dict(batch_size=batch_size, enqueue_many=True,
                      num_threads=num_preprocess_threads, capacity=capacity,
                      allow_smaller_final_batch=num_epochs is not None)
    if shuffle:
      images, label_batch = tf1.train.shuffle_batch(
          [images, labels], min_after_dequeue=min_queue_examples, seed=seed,
          **batch_args)
    else:
      images, label_batch = tf1.train.batch([images, labels], **batch_args)
  return images, tf.reshape(label_batch, [-1])
