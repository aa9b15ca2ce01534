"""How fast a replay table may be sampled against how fast it is filled.

R2D2's and SAC's tables share one rule: with `samples_per_insert` set, Reverb's
`SampleToInsertRatio` holds acting to the learner's pace (each inserted item is sampled
about that many times; inference waits when the actors run ahead); without it, only
`min_size` items must be in before sampling starts. The error buffer lets the two sides
drift by ten batches (or the warm-up's worth) before one waits.
"""


def rate_limiter(samples_per_insert: float | None, min_size: int, batch_size: int):
  import reverb  # pylint: disable=g-import-not-at-top
  if samples_per_insert is None:
    return reverb.rate_limiters.MinSize(min_size)
  return reverb.rate_limiters.SampleToInsertRatio(
      samples_per_insert=samples_per_insert, min_size_to_sample=min_size,
      error_buffer=max(10 * batch_size, min_size * samples_per_insert))
