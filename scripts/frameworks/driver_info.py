"""What the framework drivers record about the code they run, in one place.

`bench adapt` starts each driver from this folder, so Python finds this module beside it.
"""

import importlib.metadata
import os
import subprocess


def version(package: str) -> str:
    """The installed distribution's version, or "" when it is not installed."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return ""


def source_commit(source: str) -> str:
    """The commit of a checkout given as a framework's source folder, or "" when the folder
    is not the top of a git work tree of its own. A folder of copied files inside another
    repository (bench's own checkout, say) would otherwise report that repository's commit
    as the framework's: seen on 2026-11-26, when a Megatron-LM source folder of three copied
    files recorded bench's commit as `megatron-lm`."""
    try:
        out = subprocess.run(
            ["git", "-C", source, "rev-parse", "--show-toplevel", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return ""
    lines = out.stdout.split()
    if len(lines) != 2:
        return ""
    top, commit = lines
    if os.path.realpath(top) != os.path.realpath(source):
        return ""
    return commit
