"""What a command prints besides its own lines: library log records cut to one line each, and no TPU runtime
start-up errors on a machine that has no TPU.

`setup_logging` (every CLI, unless --verbose): library records (orbax, tfds, jax, asyncio, ...) below WARNING are
dropped, the rest lose their tracebacks and extra lines and are shown once, so an async write error that orbax logs
from each of its threads is one line; a library thread's exception is one line too.

`default_platform` (grpo_jax/__init__.py, before JAX starts a backend): with libtpu installed (the `test` and `tpu`
extras bring it for the TPU compile checks), JAX asks libtpu for a TPU on every start, and on a machine without one
libtpu prints five lines of errors ("Failed to find host bounds for accelerator type", "INVALID_ARGUMENT: ...
unexpected worker hostname", a source-location trace) before falling back to the CPU: output that reads like a
failure where nothing is wrong (and a second such process trips libtpu's lock file). When no platform is requested
(JAX_PLATFORMS, JAX_FORCE_TPU_INIT and TPU_ACCELERATOR_TYPE unset) and no accelerator is attached (no Google TPU on
the PCI bus, no /dev/accel* or /dev/vfio devices, no NVIDIA or AMD GPU device node), JAX_PLATFORMS defaults to `cpu`:
the platform JAX would have ended on, without the TPU probe. Any attached accelerator, or an explicit request,
leaves JAX's own choice untouched. (The TPU compiler on a CPU machine, perf/aot.py, loads libtpu through a topology,
not a backend: unaffected.)
"""
from __future__ import annotations

import errno
import glob
import logging as std_logging
import os
import sys
import threading

GOOGLE_PCI_VENDOR = "0x1ae0"  # TPU chips on the PCI bus (what jax's own hardware_utils looks for)
GPU_DEVICE_NODES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg", "/dev/kfd")


def accelerator_present(root: str = "/") -> bool:
  """A TPU, GPU or other accelerator device is attached (read from sysfs and /dev under `root`)."""
  for vendor in glob.glob(os.path.join(root, "sys/bus/pci/devices/*/vendor")):
    try:
      with open(vendor, encoding="ascii") as f:
        if f.read().strip() == GOOGLE_PCI_VENDOR:
          return True
    except OSError:
      continue
  if glob.glob(os.path.join(root, "dev/accel*")) or glob.glob(os.path.join(root, "dev/vfio/[0-9]*")):
    return True
  return any(os.path.exists(os.path.join(root, d.lstrip("/"))) for d in GPU_DEVICE_NODES)


def default_platform(environ=os.environ, root: str = "/") -> str | None:
  """Sets JAX_PLATFORMS=cpu when nothing is requested and no accelerator is attached; returns what it set (None:
  left alone). Effective only before JAX is imported (JAX reads the variable then)."""
  if any(k in environ for k in ("JAX_PLATFORMS", "JAX_FORCE_TPU_INIT", "TPU_ACCELERATOR_TYPE")):
    return None
  if accelerator_present(root):
    return None
  environ["JAX_PLATFORMS"] = "cpu"
  return "cpu"


_silenced = threading.Event()
_other_process = threading.Event()  # quiet_info


def silence_libraries() -> None:
  """From now on library records and library thread exceptions print nothing: the command is about to print its last
  line and exit (orbax's writer threads, failing after a full disk, logged around and after the one error line)."""
  _silenced.set()


def quiet_info() -> None:
  """This process is not process 0 of a multi-process job: its INFO records (grpo_jax's own too) repeat process 0's
  on every host, so from now on only warnings and errors print (all of them with --verbose)."""
  _other_process.set()


class QuietLibraries(std_logging.Filter):
  """Library records below WARNING are dropped; the rest lose their tracebacks and extra lines and are shown once.
  grpo_jax's own records pass untouched."""

  def __init__(self):
    super().__init__()
    self.seen: set[tuple[str, str]] = set()

  def filter(self, record) -> bool:
    verdict = getattr(record, "_grpo_jax_shown", None)  # the same record through the logger and its handlers
    if verdict is None:
      verdict = record._grpo_jax_shown = self._judge(record)  # pylint: disable=protected-access
    return verdict

  def _judge(self, record) -> bool:
    if record.levelno < std_logging.WARNING and _other_process.is_set():
      return False
    if f"{os.sep}grpo_jax{os.sep}" in record.pathname:
      return True
    if record.levelno < std_logging.WARNING or _silenced.is_set():
      return False
    if "Using custom data configuration" in str(record.msg):  # tfds says this on every load of a generated task
      return False
    if record.exc_info or record.exc_text:
      record.exc_info, record.exc_text = None, None
    msg = record.getMessage()
    if "\n" in msg:
      record.msg, record.args = msg.splitlines()[0][:500] + " [...; --verbose for the rest]", None
    key = (record.name, record.getMessage()[:200])
    if key in self.seen:
      return False
    self.seen.add(key)
    return True


def _one_line_hook(what: str, shown: set):
  """A thread's (or an unraisable) exception as one line, once per kind: library threads (orbax's async writers)
  that fail after a handled failure would otherwise print a traceback each."""
  def hook(args) -> None:
    if _silenced.is_set():
      return
    exc = getattr(args, "exc_value", None)
    line = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
    if line not in shown:
      shown.add(line)
      print(f"warning: {what}: {line} [--verbose for the traceback]", file=sys.stderr)
  return hook


def setup_logging(verbose: bool) -> None:
  _silenced.clear()
  if verbose:
    return
  import absl.logging  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import  (its handler: below)
  quiet = QuietLibraries()
  std_logging.getLogger("absl").addFilter(quiet)
  for handler in std_logging.getLogger().handlers:  # records of other loggers (asyncio, orbax's own) reach these
    handler.addFilter(quiet)
  shown: set[str] = set()
  threading.excepthook = _one_line_hook("a library thread failed", shown)
  sys.unraisablehook = _one_line_hook("an exception was ignored during cleanup", shown)


# A closed console: EPIPE (the reader of a pipe exited: `| head`, or `| tee` whose terminal closed) or EIO (a closed
# terminal). Python ignores SIGPIPE, so a write there raises instead of killing the process.
_GONE_ERRNOS = (errno.EPIPE, errno.EIO)
_console_gone = threading.Event()


_on_closed: list = []  # callables(reason): signals.py registers the active stop's request


def on_closed(fn) -> None:
  """Calls fn(reason) when the console closes (signals.py: the command's GracefulStop asks for a stop)."""
  _on_closed.append(fn)


def _console_closed(err: OSError) -> None:
  """Asks the command to stop as a closed terminal's SIGHUP does (finish the step, save, exit 0), once a process."""
  if _console_gone.is_set():
    return
  _console_gone.set()
  reason = f"the console closed ({errno.errorcode.get(err.errno, err.errno)})"
  for fn in _on_closed:
    fn(reason)


class _Guarded:
  """sys.stdout / sys.stderr of a long command: a write or flush to a closed console detaches the stream and asks
  for a stop (_console_closed) instead of raising. Without it the run died at its next line (the progress line, a
  sample) with BrokenPipeError or OSError(EIO), nothing saved since the last periodic checkpoint: after `| head`,
  after `| tee` lost its terminal, and after a closed terminal's SIGHUP, whose graceful stop never got to save.
  Everything else is the stream's."""

  def __init__(self, stream):
    self._stream = stream

  def _guard(self, method: str, *args):
    try:
      return getattr(self._stream, method)(*args)
    except OSError as e:
      if e.errno not in _GONE_ERRNOS:
        raise
      self._detach()
      _console_closed(e)
      try:  # the text that failed (and what the stream still buffers) now goes to /dev/null
        return getattr(self._stream, method)(*args)
      except OSError:
        return None

  def _detach(self) -> None:
    """This stream's fd now writes to /dev/null, so every later write to it succeeds and shows nothing — Python's
    and a library's alike; the other stream is left as it is (`2> log | head`: the log keeps its lines)."""
    try:
      fd = self._stream.fileno()
    except (AttributeError, OSError, ValueError):
      self._stream = open(os.devnull, "w", encoding="utf-8")  # pylint: disable=consider-using-with
      return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)

  def write(self, text):
    return self._guard("write", text)

  def flush(self):
    return self._guard("flush")

  def __getattr__(self, name):
    return getattr(self._stream, name)


def gone() -> bool:
  """The console closed earlier in this process (a stop installed after that asks for itself: signals.py)."""
  return _console_gone.is_set()


def guard_streams() -> None:
  """Installs _Guarded around sys.stdout and sys.stderr (once); a command that runs for long (main.py) calls it."""
  for name in ("stdout", "stderr"):
    stream = getattr(sys, name)
    if stream is not None and not isinstance(stream, _Guarded):
      setattr(sys, name, _Guarded(stream))
