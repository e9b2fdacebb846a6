"""Doors: the names discovery's helper sockets listen on, and the checks before trusting a peer.

An abstract Unix socket carries no permissions, and the names discovery used were computable
by anyone from /proc (a task's or a daemon's pid and start time): another local user could
bind one first and answer in the task's place -- a forged rendezvous address, or the task's
PMI connection handed over to it (docs/guarantees.md, "Who may speak for a task"). So:

* **Names nobody else can compute.** Every name holds this user's *secret*, 128 random bits
  kept in a file of a directory only this user can enter (`private_dir`: created 0700, owner
  and mode checked, no symbolic link followed; a candidate another user made first is
  skipped, with a debug line). Another user can neither guess a name nor take it first.
* **A name is never proof.** Every connection checks its peer in the kernel (SO_PEERCRED)
  before it sends or believes a byte: this user's uid, and where the peer must be one
  process (the holder), that process. The holder checks its clients the same way.
* **One deadline, one cap.** Every read from a peer ends by one deadline, the caller's
  (`recv_line`), and reads at most a cap of bytes.

Standard library only; nothing here runs before discovery asks a service.
"""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    import socket
    from collections.abc import Mapping


class DoorError(OSError):
    """A peer that is not who it must be, or one too slow or too talkative."""


#: Bytes of randomness in the secret (hex-encoded in the file and the names).
SECRET_BYTES = 16
_secret: "tuple[int, str] | None" = None  # (pid, secret): read once per process


def debug(text: str) -> None:
    """A debug line on the ``distenv`` logger -- without importing `logging` (milliseconds a
    rank) unless the program already did or DISTENV_LOG_LEVEL=debug asks for it: otherwise
    no handler could show it."""
    import sys

    from ..knobs import debug_asked

    if "logging" in sys.modules or debug_asked():
        from ..log import get_logger

        get_logger("distenv.discovery").debug(text)





def _safe_parent(path: str) -> bool:
    """Can no other user replace `path` in its parent? The parent is this user's or root's,
    and others cannot write to it, or only with the sticky bit (/tmp: no renaming others')."""
    import stat

    try:
        st = os.stat(os.path.dirname(path))
    except OSError:
        return False
    return st.st_uid in (os.geteuid(), 0) and (not st.st_mode & 0o022 or bool(st.st_mode & stat.S_ISVTX))


def _own_dir(path: str) -> bool:
    """Is `path` a directory only this user can enter? Made (0700) when missing; a directory
    of this user's with wider permissions is narrowed; a link, or another owner's, is not."""
    if not _safe_parent(path):
        debug(f"door: {os.path.dirname(path)} may be changed by another user: skipped")
        return False
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:  # a symbolic link (ELOOP), or not a directory
        debug(f"door: {path} is not a directory of this user's (a link?): skipped")
        return False
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            debug(f"door: {path} belongs to uid {st.st_uid}, not this user: skipped")
            return False
        if st.st_mode & 0o077:
            os.fchmod(fd, 0o700)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def candidates(environ: "Mapping[str, str] | None" = None) -> "list[str]":
    """Where this user's private directory may be, in order: the session's runtime directory
    (``XDG_RUNTIME_DIR``, when it is this user's), then ``distenv-<uid>`` in ``TMPDIR``,
    ``/tmp`` and ``/dev/shm``, then ``~/.cache/distenv``. A temporary directory comes first:
    the ranks of one node share it even inside a container (pyxis gives the container one
    ``/tmp`` per node); the home directory is the one another user cannot take first."""
    environ = os.environ if environ is None else environ
    uid = os.geteuid()
    out: "list[str]" = []
    runtime = environ.get("XDG_RUNTIME_DIR", "")
    if runtime.startswith("/"):
        out.append(os.path.join(runtime, "distenv"))
    for tmp in (environ.get("TMPDIR", ""), "/tmp", "/dev/shm"):
        if tmp.startswith("/"):
            path = os.path.join(tmp, f"distenv-{uid}")
            if path not in out:
                out.append(path)
    home = environ.get("HOME", "")
    if home.startswith("/"):
        out.append(os.path.join(home, ".cache", "distenv"))
    return out


def private_dir(environ: "Mapping[str, str] | None" = None) -> "str | None":
    """The first candidate directory only this user can enter (None when none can be had)."""
    for path in candidates(environ):
        if path.endswith(os.path.join(".cache", "distenv")):
            try:  # ~/.cache itself may not exist yet
                os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            except OSError:
                continue
        if _own_dir(path):
            return path
    return None


def _read_secret(path: str) -> "str | None":
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077 or st.st_size != 2 * SECRET_BYTES:
            return None
        text = os.read(fd, 2 * SECRET_BYTES).decode("ascii", "replace")
    finally:
        os.close(fd)
    return text if len(text) == 2 * SECRET_BYTES and all(c in "0123456789abcdef" for c in text) else None


def secret(environ: "Mapping[str, str] | None" = None) -> str:
    """This user's secret on this machine ("" when no private directory can be had: names
    are then public, and only the peer checks stand). Made once, atomically: written to a
    file of this process's, then linked to its name (the first link wins; the others read)."""
    global _secret
    if _secret is not None and _secret[0] == os.getpid():
        return _secret[1]
    where = private_dir(environ)
    value = ""
    if where is None:
        debug("door: no directory only this user can enter (XDG_RUNTIME_DIR, TMPDIR, /tmp, "
               "/dev/shm, ~/.cache): helper sockets use public names, checked by their peer")
    else:
        path = os.path.join(where, "secret")
        value = _read_secret(path) or ""
        if not value:
            mine = f"{path}.{os.getpid()}"
            try:
                fd = os.open(mine, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                try:
                    os.write(fd, os.urandom(SECRET_BYTES).hex().encode())
                finally:
                    os.close(fd)
                try:
                    os.link(mine, path)
                except FileExistsError:
                    pass  # another process of this user made it first: theirs is the secret
                finally:
                    os.unlink(mine)
            except OSError as exc:
                debug(f"door: cannot write {path} ({exc.strerror})")
            value = _read_secret(path) or ""
    _secret = (os.getpid(), value)
    return value


def name(*parts: object) -> str:
    """An abstract socket name for this user: ``\\0distenv-<uid>-<secret>/<parts...>``."""
    return f"\0distenv-{os.geteuid()}-{secret()}/" + "/".join(str(p) for p in parts)


def pid_namespace() -> str:
    """This process's pid namespace (``/proc/self/ns/pid``'s inode), "" when unreadable:
    a helper serves the processes it can see, so names carry it."""
    try:
        return os.readlink("/proc/self/ns/pid").partition("[")[2].rstrip("]")
    except OSError:
        return ""


def peer(sock: "socket.socket") -> "tuple[int, int]":
    """(pid, uid) of a Unix socket's peer from the kernel: the pid as this process's pid
    namespace sees it (0 when the peer is outside it)."""
    import socket as _socket
    import struct

    raw = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", raw)
    return int(pid), int(uid)


def check_peer(sock: "socket.socket", what: str, program: "str | None" = None) -> int:
    """The peer's pid, when it is this user's (and, with `program`, a process running that
    file); else `DoorError` naming it. `what` names the door in the message."""
    pid, uid = peer(sock)
    if uid != os.geteuid():
        raise DoorError(f"{what} is held by another user (uid {uid}, process {pid})")
    if program is not None and pid > 0 and not runs(pid, program):
        raise DoorError(f"{what} is held by process {pid}, which does not run {program}")
    return pid


def runs(pid: int, program: str) -> bool:
    """Does process `pid` run the Python file `program` (its command line names it)?"""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read(1 << 16).split(b"\0")
    except OSError:
        return False
    return os.fsencode(program) in argv[:6]


def recv_line(sock: "socket.socket", deadline: float, cap: int, what: str) -> bytes:
    """One line (without its end) read by `deadline` (time.monotonic()), at most `cap` bytes;
    `DoorError` naming `what` when the peer is too slow or sends too much. b"" when the peer
    closed without a line."""
    import socket as _socket

    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            raise DoorError(f"{what} did not answer in time")
        sock.settimeout(left)
        try:
            part = sock.recv(min(1 << 16, cap + 1 - len(data)))
        except (_socket.timeout, TimeoutError):
            raise DoorError(f"{what} did not answer in time") from None
        if not part:
            return b""
        data += part
        if len(data) > cap and b"\n" not in data[:cap + 1]:
            raise DoorError(f"{what} sent more than {cap} bytes without a line end")
    return data.partition(b"\n")[0]


__all__ = ["DoorError", "secret", "name", "private_dir", "candidates", "peer", "check_peer",
           "runs", "recv_line", "pid_namespace"]
