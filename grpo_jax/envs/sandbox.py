"""The Python sandbox environment (`tools.env='python'`): runs a tool call's code in a child process with limits.

Each call is a fresh interpreter (`python -s -S -P`: no user site, no site-packages, no script directory on
sys.path), started with an environment of `PYTHONHASHSEED=0` alone, in a fresh temporary directory (its cwd) that is
deleted afterwards. Its output is what the code prints (stdout), or the value of its last expression (as an
interactive interpreter shows it); a run that fails (exit status not 0) adds the last line of its error, kept whole
when the output is cut; at most `output_chars` characters. A run that exits 0 has no error, whatever it wrote to
stderr (a warning, a log line).

The same code prints the same in a rerun: str hashes (set order) have a fixed seed, and `random`'s module functions
start from `random.seed(0)`. Not fixed: the clock, `os.urandom` / `secrets`, object addresses (`id`, default reprs).

What is enforced, and how (tests/test_envs.py checks each with ~1 s limits):
- Time: the parent kills the child's process group (SIGKILL) `time_s` seconds after starting it. Inside the child,
  RLIMIT_CPU and an alarm (both int(time_s) + 2 s; the alarm's handler and the signal functions removed before the
  code runs) end it too if the parent itself has died.
- Memory: RLIMIT_AS = `memory_mb` (an allocation beyond it raises MemoryError). File size: RLIMIT_FSIZE = `file_mb`
  per file (output included); the number of files is not limited, so a call can fill the disk with what it writes
  in `time_s` until its directory is deleted. No core dumps.
- No file writes outside its temporary directory: an audit hook (PEP 578; it cannot be removed once added) refuses
  every `open` for writing, create, remove, rename, mkdir, chmod, chown, truncate, utime and link whose path does not
  resolve inside the directory (given a descriptor, where /proc/self/fd says it points: chmod and utime work on one
  opened for reading), and any such call given a `dir_fd`; `os.open` / `posix.open` (whose audit event does not
  carry `dir_fd`) are replaced by a function that raises PermissionError (shutil, tempfile, zipfile and tarfile read
  os.open when imported), `mkfifo` and `mknod` (no audit event) are deleted before the code runs, and so is
  `_imp.create_builtin` (a fresh copy of posix had them back), after every other importable built-in module is
  imported.
- Reads only the standard library (the interpreter's sys.path), its own directory, the time-zone data
  (/usr/share/zoneinfo) and /dev/null, zero, random, urandom: the hook refuses `open` for reading and
  `os.listdir` / `os.scandir` anywhere else (the trainer's environment in /proc/<ppid>/environ, its workdir and
  datasets, the user's home were readable). Lexical, as for writes: an existing symlink inside a readable directory
  is followed. `os.stat` / `os.path.exists` / `os.readlink` raise no audit event: a path's existence is not hidden.
- The hook cannot be disarmed from inside: its functions hold no closure and nothing mutable (the code reaches the
  hook's frame through a refused call's traceback: a closure cell `work` set to '' allowed writes anywhere), their
  `__code__` / `__defaults__` cannot be replaced, tracers (`sys.settrace` / `setprofile`) are refused, and a path or
  module name is read as an exact str (a str subclass's own methods cannot answer for it).
- `import gc` (timeit's) gets a stand-in whose enable / disable / isenabled / collect do nothing: the real module's
  get_objects / get_referrers reach the hook's closure.
- No network, no processes: the hook refuses every `socket.*` event (socket creation, connect, bind, getaddrinfo,
  ... raised from C, so `_socket` directly is covered), process creation and signalling (`os.system`, `os.exec*`,
  `os.posix_spawn`, `os.spawn*`, `os.fork`, `subprocess.Popen`, `os.kill`; `signal.pidfd_send_signal`, which raises
  no event, is deleted), `os.chdir`, `ctypes` (its import and every `ctypes.*` event), and the import of `socket`,
  `ssl`, `subprocess`, `multiprocessing`, `_posixsubprocess`, `ctypes`, `signal`, `sqlite3`, `_posixshmem` (a
  file in /dev/shm), `syslog`, `termios` (another terminal's settings) and a few others (urllib and http stay
  importable: without `socket` they cannot connect); `os.setpriority` and `os.sched_set*` (another process's
  priority or CPUs) are deleted; the child also gets no outside environment (no proxy variables).

What is NOT guaranteed: audit hooks are not a security boundary (PEP 578 says so): code that corrupts the
interpreter's memory, or reaches a function the hook does not see, gets past them, and there is no OS-level network
or file-system isolation (no namespace, seccomp or Landlock). It is a guard against a policy model's accidents
(loops, huge allocations, reading or writing the run's files, calling out), not a jail for adversarial code: for
that, run the tool in a container, gVisor or nsjail (a `module:attr` environment can). The child runs as the same
user as the trainer.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import NamedTuple

from grpo_jax.envs import base
from grpo_jax.envs import formats
from grpo_jax.infra import leftovers


@dataclasses.dataclass(frozen=True)
class Limits:
  time_s: float = 2.0
  memory_mb: int = 512
  file_mb: int = 1
  output_chars: int = 512


class Result(NamedTuple):
  output: str          # what the code printed (or its last expression's value), at most output_chars
  error: str           # the last line of its error ('' if none); 'timed out after Xs' when killed
  timed_out: bool


# The child's start: limits, then the audit hook, then the code. Runs under `python -I -S -c`, argv = [work dir,
# code file, time_s, memory bytes, file bytes]. Nothing here may be reached by the code after it starts (the hook
# and the deleted functions close what this text opened).
_BOOT = r'''
import sys, posix, resource, _signal
work, code_path = sys.argv[1], sys.argv[2]
time_s, mem, fsize = float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
with open(code_path, encoding="utf-8") as f:
    source = f.read()

def limit(res, value):
    hard = resource.getrlimit(res)[1]
    value = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(res, (value, value))

limit(resource.RLIMIT_CPU, int(time_s) + 2)
limit(resource.RLIMIT_AS, mem)
limit(resource.RLIMIT_FSIZE, fsize)
limit(resource.RLIMIT_CORE, 0)
_signal.alarm(int(time_s) + 2)
posix.chdir(work)
import ast
# A fixed seed for what Python would draw at random per process: the same call prints the same in a rerun (set
# order comes from str hashes: PYTHONHASHSEED=0 in the child's environment; `random`'s module functions here).
import random
random.seed(0)
# The code reads only the standard library (the interpreter's sys.path), its own directory, the time-zone data and a
# few devices: not the trainer's environment (/proc/<ppid>/environ), its workdir, datasets or the user's files.
normpath = __import__("os.path").path.normpath
READ_ROOTS = tuple(sorted({normpath(x) for p in sys.path if p for x in (p, __import__("os.path").path.realpath(p))}
                          | {"/usr/share/zoneinfo"}))
READ_FILES = frozenset({"/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"})
# `import gc` (timeit's, to pause the collector while it times) gets a stand-in whose switches do nothing: the real
# module's get_objects / get_referrers reach the hook's closure.
gc_stub = type(sys)("gc", "The sandbox's stand-in for gc: enable, disable, isenabled and collect do nothing.")
exec("def enable():\n    pass\ndef disable():\n    pass\ndef isenabled():\n    return True\n"
     "def collect(generation=2):\n    return 0\n", gc_stub.__dict__)
sys.modules["gc"] = gc_stub
MODULES = frozenset({"socket", "_socket", "ssl", "_ssl", "subprocess", "_posixsubprocess", "multiprocessing",
                     "_multiprocessing", "ctypes", "_ctypes", "signal", "pty", "asyncio", "selectors", "select",
                     "fcntl", "mmap", "resource", "_tkinter", "faulthandler", "tracemalloc", "_xxsubinterpreters",
                     "_interpreters", "sqlite3", "_sqlite3", "dbm", "_dbm", "_gdbm", "shelve", "ftplib",
                     "smtplib", "poplib", "imaplib", "telnetlib", "nntplib", "webbrowser",
                     # no audit events: a file in /dev/shm, the system log, NIS over the network, a sound device,
                     # another terminal's settings (a tty device opened for reading)
                     "_posixshmem", "syslog", "nis", "ossaudiodev", "termios", "tty"})
# The hook and its helpers hold no closure and no mutable object: the code reaches the hook's frame (a refused
# call's traceback, a path object's __fspath__ run inside it), and a closure cell's contents can be set without an
# audit event (setting `work` to '' allowed writes anywhere; a `paths` dict could be emptied). Everything they use
# is a default argument: builtins, strings, tuples, frozensets and these functions, whose __code__ / __defaults__
# the hook refuses to replace (theirs only: the standard library sets other functions' __defaults__). A path is
# read as an exact str (`str.__str__`, `bytes.decode` unbound): a str subclass's own startswith or split cannot
# answer for it.
def normal(p, work, fd_ok, isinstance=isinstance, str=str, bytes=bytes, int=int, bool=bool, OSError=OSError,
           readlink=posix.readlink, fspath=posix.fspath, as_str=str.__str__, decode=bytes.decode,
           digits=int.__repr__):
    """The absolute, lexically normalised path an event names ('' = allowed: a descriptor when fd_ok, the cwd;
    None = unknown)."""
    if p is None:
        return ""
    if isinstance(p, int) and not isinstance(p, bool):
        if fd_ok:  # open(fd, ...): writes through it need the access it was opened with, checked then
            return ""
        # chmod / chown / utime / xattrs work on a descriptor opened for reading (any file outside): where it
        # points (unknown: refused)
        try:
            p = readlink("/proc/self/fd/" + digits(p))
        except OSError:
            return None
        if not p.startswith("/"):  # a pipe or socket
            return None
    if not isinstance(p, (str, bytes)):
        p = fspath(p)
    p = decode(p, "utf-8", "replace") if isinstance(p, bytes) else as_str(p)
    if not p.startswith("/"):
        p = work + "/" + p
    parts = []
    for part in p.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
        else:
            parts.append(part)
    return "/" + "/".join(parts)


def inside(p, fd_ok=True, work=work, normal=normal):
    # Lexical: no symlink or hard link can be made (both refused), and the directory starts empty, so the resolved
    # path is the normalised one.
    p = normal(p, work, fd_ok)
    return p is not None and (p == "" or p == work or p.startswith(work + "/"))


def readable(p, work=work, normal=normal, inside=inside, roots=READ_ROOTS, files=READ_FILES):
    if inside(p):
        return True
    p = normal(p, work, True)
    if p is None:
        return False
    if p in files:
        return True
    for r in roots:  # lexical too: ".." cannot climb out of a root
        if p == r or p.startswith(r + "/"):
            return True
    return False


def hook(event, args, MODULES=MODULES, inside=inside, readable=readable, isinstance=isinstance, int=int, bool=bool,
         str=str, PermissionError=PermissionError, ImportError=ImportError, as_str=str.__str__,
         blocked=("socket.", "ctypes.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
                  "os.fork", "os.forkpty", "os.kill", "os.killpg", "os.chdir", "os.chroot", "os.startfile",
                  "os.putenv", "os.unsetenv", "os.symlink", "pty.", "resource.setrlimit", "resource.prlimit",
                  "sys.remote_exec", "webbrowser.", "urllib.Request", "http.client.", "ftplib.", "smtplib.",
                  "poplib.", "imaplib.", "telnetlib.", "nntplib.", "signal.", "sqlite3.", "dbm.",
                  # a tracer gets every frame, the hook's too, and can write its locals back
                  "sys.settrace", "sys.setprofile"),
         sealed=frozenset({"__code__", "__defaults__", "__kwdefaults__"}),
         path_events=frozenset({"os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate",
                                "os.utime", "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr", "os.rename",
                                "os.link", "shutil.copyfile", "shutil.copymode", "shutil.copystat", "shutil.copytree",
                                "shutil.move", "shutil.make_archive", "shutil.unpack_archive", "shutil.rmtree"}),
         path_args=(("os.rename", (0, 1)), ("os.link", (0, 1)), ("shutil.copyfile", (1,)), ("shutil.copymode", (1,)),
                    ("shutil.copystat", (1,)), ("shutil.copytree", (1,)), ("shutil.move", (1,)),
                    ("shutil.unpack_archive", (1,))),
         write_flags=0o1 | 0o2 | 0o100 | 0o1000 | 0o2000,  # O_WRONLY O_RDWR O_CREAT O_TRUNC O_APPEND
         id=id, own=frozenset()):  # own: the ids of these four functions, set below
    if event == "import" and as_str(args[0]).partition(".")[0] in MODULES:  # __import__(a str subclass)
        raise ImportError(f"import of {args[0]} is not allowed in the sandbox")
    if event.startswith(blocked):
        raise PermissionError(f"{event} is not allowed in the sandbox")
    if event in ("object.__setattr__", "object.__delattr__") and args[1] in sealed and id(args[0]) in own:
        raise PermissionError(f"changing the sandbox's {args[1]} is not allowed")
    if event == "open":
        path, mode, flags = args
        # (mode and flags come from C: an exact str and int; no any(): builtins can be replaced by the code)
        writes = (isinstance(mode, str) and ("w" in mode or "a" in mode or "x" in mode or "+" in mode)) or (
            isinstance(flags, int) and flags & write_flags)
        if writes and not inside(path):
            raise PermissionError(f"writing {path!r} is not allowed: only files in the working directory")
        if not writes and not readable(path):
            raise PermissionError(f"reading {path!r} is not allowed: only the working directory and the "
                                  "standard library")
    elif event in ("os.listdir", "os.scandir"):
        if not readable(args[0]):
            raise PermissionError(f"listing {args[0]!r} is not allowed: only the working directory and the "
                                  "standard library")
    elif event in path_events:
        for a in args[2:]:
            if isinstance(a, int) and not isinstance(a, bool) and a >= 0:
                raise PermissionError(f"{event} with dir_fd is not allowed in the sandbox")
        where = (0,)
        for name, i in path_args:
            if name == event:
                where = i
        for i in where:
            if not inside(args[i], False):
                raise PermissionError(f"{event} of {args[i]!r} is not allowed: only files in the working "
                                      "directory")

os = __import__("os")
for mod in (os, posix):
    for name in ("open", "mkfifo", "mknod", "fork", "forkpty", "system", "execv", "execve", "kill", "killpg",
                 "posix_spawn", "posix_spawnp", "chdir", "fchdir", "chroot", "symlink", "link", "setuid", "setgid",
                 # another process's priority or CPUs (the trainer's: it is the parent)
                 "setpriority", "sched_setaffinity", "sched_setscheduler", "sched_setparam"):
        if hasattr(mod, name):
            delattr(mod, name)


def open_refused(*args, **kwargs):
    raise PermissionError("os.open is not allowed in the sandbox; use open()")


# a stand-in, not a hole: shutil (and tempfile, zipfile, tarfile, which import it) reads os.open when imported
os.open = posix.open = open_refused
for name in ("alarm", "setitimer", "signal", "pthread_kill", "pthread_sigmask", "sigwait", "siginterrupt",
             "set_wakeup_fd", "raise_signal", "pidfd_send_signal"):  # the last: any process (no audit event)
    if hasattr(_signal, name):
        delattr(_signal, name)
for name in ("setrlimit", "prlimit"):
    if hasattr(resource, name):
        delattr(resource, name)
sys.modules.pop("resource", None)
# A fresh copy of a built-in module (_imp.create_builtin: posix with open, mknod and mkfifo back; gc) raises no
# audit event: every built-in the code may import is imported now, and the function is deleted.
import _imp
for name in sys.builtin_module_names:
    if name not in sys.modules and name not in MODULES and name.lstrip("_") not in MODULES:
        try:
            __import__(name)
        except ImportError:  # one this build cannot import: the code cannot either
            pass
del _imp.create_builtin
preloaded = sorted(MODULES & set(sys.modules))
if preloaded:  # already imported: `import` of them raises no event any more, so the hook could not refuse them
    sys.stderr.write(f"SandboxError: {preloaded} were imported before the hook\n")
    posix._exit(3)
exit_now, flush_out, flush_err, stderr = posix._exit, sys.stdout.flush, sys.stderr.flush, sys.stderr
hook.__defaults__ = hook.__defaults__[:-1] + (frozenset(map(id, (hook, normal, inside, readable))),)
sys.addaudithook(hook)
del hook, normal, inside, readable, limit, resource, _signal, posix, f, code_path, preloaded, mod, name, _imp
del gc_stub, normpath


def run(source):
    tree = ast.parse(source, "<tool>", "exec")
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    exec(compile(tree, "<tool>", "exec"), scope)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), "<tool>", "eval"), scope)
        if value is not None:
            print(repr(value))


code = 0
try:
    run(source)
except SystemExit as e:  # the status python would exit with (sys.exit(3): 3, not 1)
    code = 0 if e.code in (None, 0) else e.code if type(e.code) is int and 0 < e.code < 256 else 1
    if e.code is not None and not isinstance(e.code, int):  # sys.exit('why'): python prints the why
        print(str(e.code).splitlines()[0] if str(e.code) else "", file=stderr)
except BaseException as e:
    text = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    print(text.splitlines()[0], file=stderr)
    code = 1
flush_out()
flush_err()
exit_now(code)
'''


CHILD_ENV = {"PYTHONHASHSEED": "0"}  # the child's whole environment


def _read(path: str, limit: int, tail: bool = False) -> str:
  """At most `limit` bytes of the file: its first, or (tail) its last."""
  with open(path, "rb") as f:
    if tail:
      f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
    return f.read(limit).decode("utf-8", errors="replace")


PREFIX = "grpo_sandbox_"  # + <host>-<pid>-<random>: a process killed with -9 mid-call leaves it behind
_swept: set[str] = set()  # the temp dirs this process has swept


def _remove_leftovers() -> None:
  """Once per process and temp dir: the call directories of processes of this host that ended (killed mid-call);
  a live process's, another host's and old unnamed ones are left alone."""
  tmp = tempfile.gettempdir()
  if tmp not in _swept:
    _swept.add(tmp)
    leftovers.remove(os.path.join(tmp, PREFIX), lambda rest: rest.rpartition("-")[0], "sandbox call directories")


def run(code: str, limits: Limits = Limits()) -> Result:
  """`code` in a fresh limited child process (module docstring); never raises for what the code does."""
  _remove_leftovers()
  root = tempfile.mkdtemp(prefix=f"{PREFIX}{leftovers.owner()}-")
  try:
    work = os.path.join(root, "work")
    os.mkdir(work)
    code_path, out_path, err_path = (os.path.join(root, n) for n in ("code.py", "stdout", "stderr"))
    with open(code_path, "w", encoding="utf-8") as f:
      f.write(code)
    # -s -S -P with an environment of ours alone: -I's isolation (no user site, no site-packages, no script
    # directory on sys.path, no outside PYTHON* variable), but with PYTHONHASHSEED=0 (-I / -E would ignore it)
    args = [sys.executable, "-s", "-S", "-P", "-c", _BOOT, os.path.realpath(work), code_path, str(limits.time_s),
            str(limits.memory_mb << 20), str(limits.file_mb << 20)]
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
      # start_new_session: the child leads its own process group, so the kill below takes anything it started.
      proc = subprocess.Popen(args, cwd=work, env=dict(CHILD_ENV), stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                              start_new_session=True, close_fds=True)
      try:
        proc.wait(timeout=limits.time_s)
        timed_out = False
      except subprocess.TimeoutExpired:
        timed_out = True
        try:
          os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
          pass
        proc.wait()
    # A child the kernel killed for its limits (SIGXCPU, SIGALRM, SIGKILL) ran out of time too.
    timed_out = timed_out or proc.returncode in (-signal.SIGXCPU, -signal.SIGALRM, -signal.SIGKILL)
    output = _read(out_path, 4 * limits.output_chars).strip()[:limits.output_chars]
    error = ""
    if timed_out:
      error = f"timed out after {limits.time_s:g}s"
    elif proc.returncode:  # failed: its error is the last line written (a run that exits 0 has none, whatever
      # it wrote to stderr: a warning or a log line is not an error)
      lines = _read(err_path, 1 << 16, tail=True).strip().splitlines()
      error = lines[-1][:limits.output_chars] if lines else f"exited with status {proc.returncode}"
    return Result(output, error, timed_out)
  finally:
    shutil.rmtree(root, ignore_errors=True)


class PythonSandbox(base.ToolEnv):
  """`python` tool: the code of the call, run by `run` with the limits of `tools.sandbox`."""
  tool = formats.Tool("python", "Run Python code (standard library only; no network; files only in a scratch "
                      "directory) and return what it prints, or the value of its last expression.", "code",
                      "the Python code to run")

  def __init__(self, ctx: base.EnvContext):
    super().__init__(ctx)
    opts = dict(ctx.options.get("sandbox", {}) or {})
    self.limits = Limits(**{k: opts[k] for k in ("time_s", "memory_mb", "file_mb", "output_chars") if k in opts})

  def run(self, state: base.EnvState, value: str) -> tuple[str, dict]:
    del state
    res = run(value, self.limits)
    if res.timed_out:
      return f"error: {res.error}", {"error": res.error, "timeout": True}
    if res.error:  # the error line is kept whole: a long output is cut before it (the model reads that it failed)
      keep = self.limits.output_chars - len(res.error) - 1
      text = f"{res.output[:keep]}\n{res.error}" if res.output and keep > 0 else res.error
      return text[:self.limits.output_chars], {"error": res.error}
    return res.output, {}
