"""Transports run argv lists on one host: SSH (paramiko), local (subprocess), fake (tests).

Commands stay argv lists until the transport, which quotes them exactly once
(:func:`fstrain.io.transport.base.quote_argv`).
"""

from fstrain.io.transport.base import CommandResult, Transport, quote_argv
from fstrain.io.transport.fake import FakeTransport
from fstrain.io.transport.local import LocalTransport

__all__ = ["CommandResult", "FakeTransport", "LocalTransport", "Transport", "quote_argv"]
