"""One run per workdir: `DIR/run.lock`, taken before the run writes anything, released when it exits.

Local and network file systems: an exclusive `flock` on `DIR/run.lock`, whose content names the holder (pid, host,
start time, command). The kernel drops the flock when the holder dies however it dies (kill -9 included), so a lock
file that can be locked again is stale: its old content is reported and replaced.

Object stores (`gs://`, `s3://`: no flock, no pid to probe): the lock is an object holding the same fields plus a
token and a heartbeat time that the holder rewrites every `heartbeat_s`. A lock whose heartbeat is older than
`stale_after_s` is stale. Taking it writes our token, waits `settle_s` and reads it back: of two runs racing for a
free lock, the one whose token was overwritten backs off. This is best-effort (object stores have no
compare-and-swap through this API); the flock mode is exact.

Multi-process jobs: only process 0 takes the lock; `acquire` broadcasts its verdict so that every process either
continues or raises the same InputError (the CLI exits 2) instead of waiting in a collective.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import threading
import time
import uuid

from absl import logging

from grpo_jax.infra import errors

LOCK_NAME = "run.lock"


def _holder_info(token: str) -> dict:
  return {"pid": os.getpid(), "host": socket.gethostname(), "start": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
          "start_unix": time.time(), "heartbeat_unix": time.time(), "token": token,
          "command": " ".join(sys.argv)[:500]}


def _describe(info: dict) -> str:
  return (f"pid {info.get('pid', '?')} on host {info.get('host', '?')}, started {info.get('start', '?')}"
          + (f" ({info['command']})" if info.get("command") else ""))


def _parse(text: str) -> dict:
  try:
    info = json.loads(text)
    return info if isinstance(info, dict) else {}
  except ValueError:
    return {}


def is_object_store(path: str) -> bool:
  return "://" in path and not path.startswith("file://")


class WorkdirLock:
  """`with WorkdirLock(workdir):` — raises errors.InputError when another live run holds the workdir."""

  def __init__(self, workdir: str, *, object_store: bool | None = None, stale_after_s: float = 600.0,
               heartbeat_s: float = 60.0, settle_s: float = 2.0):
    self.workdir = workdir
    self.object_store = is_object_store(workdir) if object_store is None else object_store
    self.stale_after_s, self.heartbeat_s, self.settle_s = stale_after_s, heartbeat_s, settle_s
    self.path = os.path.join(workdir, LOCK_NAME)
    self.stale_previous: dict | None = None  # the stale holder we replaced, if any
    self._fd: int | None = None
    self._token = uuid.uuid4().hex
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None

  # ----------------------------------------------------------------------------------------------- flock mode
  def _acquire_flock(self) -> None:
    os.makedirs(self.workdir, exist_ok=True)
    for _ in range(5):  # retried only if the file was replaced between our open and our flock (see below)
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        info = _parse(os.pread(fd, 1 << 16, 0).decode("utf-8", "replace"))
        os.close(fd)
        raise errors.InputError(
            f"workdir {self.workdir} is in use by another run ({_describe(info)}; lock {self.path}); wait for it "
            "to finish or stop it, or use another --workdir.") from None
      # A releasing holder unlinks the file after we opened it: then we hold a lock on a deleted inode.
      try:
        same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
      except FileNotFoundError:
        same = False
      if not same:
        os.close(fd)
        continue
      old = os.pread(fd, 1 << 16, 0).decode("utf-8", "replace")
      if old.strip():
        self.stale_previous = _parse(old)
        logging.warning("workdir %s: the previous run (%s) ended without releasing %s (killed or crashed); taking "
                        "the lock over.", self.workdir, _describe(self.stale_previous), LOCK_NAME)
      os.ftruncate(fd, 0)
      os.pwrite(fd, json.dumps(_holder_info(self._token)).encode(), 0)
      os.fsync(fd)
      self._fd = fd
      return
    raise errors.InputError(f"workdir {self.workdir}: {self.path} keeps being replaced by other processes; use "
                            "another --workdir.")

  def _release_flock(self) -> None:
    if self._fd is None:
      return
    try:
      os.unlink(self.path)  # while still holding the flock: a waiting opener re-checks the inode (above)
    except FileNotFoundError:
      pass
    os.close(self._fd)
    self._fd = None

  # ---------------------------------------------------------------------------------------- object-store mode
  def _epath(self):
    from etils import epath  # pylint: disable=g-import-not-at-top
    return epath.Path(self.path)

  def _read_object(self) -> dict | None:
    p = self._epath()
    try:
      return _parse(p.read_text()) if p.exists() else None
    except FileNotFoundError:
      return None

  def _write_object(self, info: dict) -> None:
    p = self._epath()
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(info))

  def _acquire_object(self) -> None:
    info = self._read_object()
    if info is not None:
      age = time.time() - float(info.get("heartbeat_unix", 0))
      if age < self.stale_after_s:
        raise errors.InputError(
            f"workdir {self.workdir} is in use by another run ({_describe(info)}; its lock object {self.path} was "
            f"refreshed {age:.0f}s ago); wait for it to finish or stop it, or use another --workdir (a lock not "
            f"refreshed for {self.stale_after_s:.0f}s counts as stale).")
      self.stale_previous = info
      logging.warning("workdir %s: lock object of %s not refreshed for %.0fs; taking it over.", self.workdir,
                      _describe(info), age)
    mine = _holder_info(self._token)
    self._write_object(mine)
    time.sleep(self.settle_s)
    now = self._read_object() or {}
    if now.get("token") != self._token:
      raise errors.InputError(f"workdir {self.workdir}: another run ({_describe(now)}) took the lock object "
                              f"{self.path} at the same moment; use another --workdir.")
    self._thread = threading.Thread(target=self._heartbeat, args=(mine,), name="workdir-lock-heartbeat",
                                    daemon=True)
    self._thread.start()

  def _heartbeat(self, info: dict) -> None:
    while not self._stop.wait(self.heartbeat_s):
      try:
        current = self._read_object() or {}
        if current.get("token") not in (None, self._token):
          logging.error("workdir %s: lock object %s was taken by %s; this run no longer holds the workdir.",
                        self.workdir, self.path, _describe(current))
          return
        self._write_object(dict(info, heartbeat_unix=time.time()))
      except Exception as e:  # pylint: disable=broad-except  # a transient storage error must not kill the run
        logging.warning("workdir lock heartbeat failed (%s); retrying in %.0fs", e, self.heartbeat_s)

  def _release_object(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=5)
      self._thread = None
      if (self._read_object() or {}).get("token") == self._token:
        self._epath().unlink(missing_ok=True)

  # ------------------------------------------------------------------------------------------------- public
  def acquire_local(self) -> None:
    """Takes the lock in this process (no multi-process agreement)."""
    try:
      self._acquire_object() if self.object_store else self._acquire_flock()
    except OSError as e:
      raise errors.storage_error(e) or errors.InputError(
          f"workdir {self.workdir}: cannot create the lock {self.path} ({e.strerror or e}); use a writable "
          "--workdir.") from e

  def acquire(self) -> None:
    """Process 0 takes the lock; every process raises the same InputError if that failed."""
    import jax  # pylint: disable=g-import-not-at-top
    if jax.process_count() == 1:
      self.acquire_local()
      return
    message = ""
    if jax.process_index() == 0:
      try:
        self.acquire_local()
      except errors.InputError as e:
        message = str(e)
    message = broadcast_text(message)
    if message:
      raise errors.InputError(message)

  def release(self) -> None:
    self._release_object() if self.object_store else self._release_flock()

  def __enter__(self) -> WorkdirLock:
    self.acquire()
    return self

  def __exit__(self, *exc) -> None:
    self.release()


def broadcast_text(text: str, size: int | None = 4096) -> str:
  """Process 0's `text` on every process (jax.distributed must be initialised): its first `size` bytes, or all of
  it with size None (its length is broadcast first)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  if size is None:
    size = int(multihost_utils.broadcast_one_to_all(np.int32(len(text.encode("utf-8")))))
  raw = text.encode("utf-8")[:size]
  buf = np.zeros((size + 4,), np.uint8)
  buf[:4] = np.frombuffer(np.uint32(len(raw)).tobytes(), np.uint8)
  buf[4:4 + len(raw)] = np.frombuffer(raw, np.uint8)
  out = np.asarray(multihost_utils.broadcast_one_to_all(buf))
  n = int(np.frombuffer(out[:4].tobytes(), np.uint32)[0])
  return out[4:4 + n].tobytes().decode("utf-8", "replace")
