"""Scratch paths a process names after itself (`<prefix><host>-<pid><rest>`), removed once that process has ended.

A process killed with -9 runs no clean-up, so what it was writing stays for ever (an export's staging directory
beside OUT_DIR, a sandbox call's directory under the temp dir). The next user of the same place removes the paths
of processes of this host that are gone; a live process's paths and another host's (whose pids say nothing here)
are left alone. A reused pid keeps its dead owner's paths until that pid ends too: the safe way to be wrong.
"""
from __future__ import annotations

import glob
import os
import shutil
import socket
from typing import Callable

from absl import logging


def owner() -> str:
  """`<host>-<pid>` of this process: what a scratch path's name carries."""
  return f"{socket.gethostname()}-{os.getpid()}"


def alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except OSError:
    return True  # another user's process
  return True


def ended(tag: str, *, this_process: bool = False) -> bool:
  """Whether `tag` (`<host>-<pid>`) names a process of this host that has ended (or, with this_process, is us)."""
  host, _, pid = tag.rpartition("-")
  if host != socket.gethostname() or not pid.isdigit():
    return False
  return (this_process and int(pid) == os.getpid()) or not alive(int(pid))


def remove(prefix: str, tag_of: Callable[[str], str], what: str, *, this_process: bool = False) -> list[str]:
  """Removes each path `prefix*` whose `tag_of(rest of its name)` names an ended process (`ended`); says so in
  one warning. Returns the paths removed."""
  gone = [p for p in glob.glob(glob.escape(prefix) + "*") if ended(tag_of(p[len(prefix):]), this_process=this_process)]
  for p in gone:
    if os.path.isdir(p) and not os.path.islink(p):
      shutil.rmtree(p, ignore_errors=True)
    else:
      try:
        os.remove(p)
      except OSError:
        pass
  if gone:
    logging.warning("removed %d %s left by processes that ended (killed?): %s", len(gone), what,
                    ", ".join(gone[:3]) + (", ..." if len(gone) > 3 else ""))
  return gone
