"""kpool as a whole program's malloc: libkpool-malloc.so under LD_PRELOAD.

The library exports malloc, free, calloc, realloc and the rest of the C
allocation calls, and C++'s operator new and delete; it carries its own copy
of kpool's heap (not the one kpool.malloc() uses in this process).
"""

import errno
import os
import signal
import subprocess

_HERE = os.path.dirname(os.path.abspath(__file__))


def get_preload():
    """Return the path of libkpool-malloc.so, kpool as a drop-in malloc.

    ``LD_PRELOAD=$(python -c 'import kpool; print(kpool.get_preload())') CMD``
    runs CMD with every malloc, free, realloc, new and delete served by
    kpool; ``kpool.run()`` and ``python -m kpool run -- CMD`` do that for you.
    """
    return os.path.join(_HERE, "libkpool-malloc.so")


def preload_env(env=None, stats=False):
    """A copy of env (default: os.environ) that preloads kpool's malloc
    first, keeping any LD_PRELOAD already there. stats=True sets
    KPOOL_STATS=1: kpool prints its statistics to stderr at exit.
    FileNotFoundError if the library is missing, or lies under a path that
    LD_PRELOAD cannot hold (a space or a colon in it)."""
    env = dict(os.environ if env is None else env)
    lib = get_preload()
    if not os.path.exists(lib):
        raise FileNotFoundError("libkpool-malloc.so is not in this installation: " + lib)
    if any(c in lib for c in " :\t\n"):
        # ld.so splits LD_PRELOAD at spaces and colons: it would warn, and run CMD on glibc
        raise FileNotFoundError("kpool is installed under a path LD_PRELOAD cannot name (it holds a space "
                                "or a colon): " + lib)
    others = [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split() if p != lib]
    env["LD_PRELOAD"] = " ".join([lib] + others)
    if stats:
        env["KPOOL_STATS"] = "1"
    return env


def run(args, *, stats=False, env=None, **kwargs):
    """Run a command with kpool as its malloc; return subprocess.CompletedProcess.

    args is what subprocess.run takes (a list, or a string with shell=True);
    stats=True makes kpool print its statistics to the command's stderr at
    exit; env is the environment to start from (default: this process's).
    Other keyword arguments (check, capture_output, text, timeout, cwd, ...)
    go to subprocess.run unchanged.
    """
    if isinstance(args, (bytes, str)) and not kwargs.get("shell"):
        raise TypeError("kpool.run: give the command as a list of arguments (or a string with shell=True)")
    return subprocess.run(args, env=preload_env(env, stats), **kwargs)


def main(argv):
    """python -m kpool run [--stats] [--] CMD [ARGS...]: exec CMD under the preload."""
    import sys

    stats = False
    while argv and argv[0].startswith("-"):
        flag = argv.pop(0)
        if flag == "--":
            break
        if flag == "--stats":
            stats = True
        elif flag in ("-h", "--help"):
            print("usage: python -m kpool run [--stats] [--] CMD [ARGS...]\n"
                  "  runs CMD with kpool as its malloc (LD_PRELOAD=libkpool-malloc.so);\n"
                  "  --stats (or KPOOL_STATS=1) prints kpool's statistics to stderr at exit")
            return 0
        else:
            print(f"python -m kpool run: unknown option {flag!r}", file=sys.stderr)
            return 2
    if not argv:
        print("python -m kpool run: no command given (usage: python -m kpool run [--stats] -- CMD ARGS)",
              file=sys.stderr)
        return 2
    try:
        env = preload_env(stats=stats)
    except FileNotFoundError as exc:
        print(f"python -m kpool run: {exc}", file=sys.stderr)
        return 1
    sys.stdout.flush()
    sys.stderr.flush()
    # Python ignores SIGPIPE and SIGXFSZ, and exec keeps ignored signals:
    # give CMD the defaults a shell would (`yes | head -1` then ends by
    # SIGPIPE, not with a "Broken pipe" error).
    for name in ("SIGPIPE", "SIGXFSZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        print(f"python -m kpool run: cannot run {argv[0]!r}: {exc.strerror}", file=sys.stderr)
        # as a shell: 126 for a file that is there but cannot be run, 127 for none
        return 126 if isinstance(exc, PermissionError) or exc.errno == errno.ENOEXEC else 127
