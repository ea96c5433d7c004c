"""dltrace's instrumentation side: the launcher, the built-in tracer and framework hooks.

The public API for training scripts is :func:`region`, a user region marker.
"""

from instrument.markers import region

__all__ = ["region"]
