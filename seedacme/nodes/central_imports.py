"""What a central node process imports before it can serve, in the order it must.

A supervised central node keeps a standby child (`seedacme.runtime.supervisor`) that has
imported this module: the CUDA libraries preloaded (`seedacme.runtime.cuda_libs`, before
anything imports TensorFlow), then TensorFlow, Reverb, Sonnet and the node's code. A
restarted central node then skips these seconds of imports (README, "Fault table").
"""

from seedacme.runtime import cuda_libs

cuda_libs.preload()  # before anything imports TensorFlow (Reverb does)

# pylint: disable=g-import-not-at-top,unused-import,wrong-import-position
from launchpad.nodes.courier import courier_utils  # noqa: E402,F401
import reverb  # noqa: E402,F401
import sonnet  # noqa: E402,F401
import tensorflow  # noqa: E402,F401

from seedacme.nodes import central  # noqa: E402,F401
