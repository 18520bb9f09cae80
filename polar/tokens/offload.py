"""Long texts tokenized in a process of its own, so that their ids never hold the gateway's interpreter lock.

The tokenizer's own work (Rust) runs without the interpreter lock, but making its ids Python objects does not: a
400k-token opening's id list took ~8 ms in one call and its int32 array ~7 ms more, every other session's calls
waiting for the lock meanwhile (``benchmarks/bench_agent_traffic.py --only isolation``). ``TokenizerChild`` sends
such texts to one child process (``python -m polar.tokens.offload``, started in the background on the first long
text, and kept) that holds the same tokenizer (its JSON, sent at start) and answers with int32 bytes, read here into
arrays by one copy. The child runs ``ChatTokenizer.encode_batch`` on the very texts: the ids are those this process
would compute.

``encode_batch`` returns None (the caller tokenizes in its own thread, as without a child: slower for the others,
never different) while the child is starting, while it works on another caller's texts (one request at a time), and
when it fails (dies, answers out of protocol or not within ``TIMEOUT_S``); a failed child is replaced on a later
long text.

Wire (pipes; the child trusts its parent): at start ``>I`` + the tokenizer's JSON, answered by one ready byte; a
request is ``>I`` text count, then each text as ``>I`` + UTF-8 (surrogates passed through); a reply is ``>I`` text
count (``ERROR``: the texts did not tokenize; the caller's own attempt raises what it raises), then each text's ids
as ``>I`` count + native-order int32.
"""

from __future__ import annotations

import logging
import os
import select
import struct
import subprocess
import sys
import threading
import time
from array import array
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer

log = logging.getLogger(__name__)

TIMEOUT_S = 30.0  # far above any real tokenization (400k tokens: ~0.5 s); past it the child is taken to be stuck
ERROR = 0xFFFFFFFF
_U32 = struct.Struct(">I")


class TokenizerChild:
    """A child process that tokenizes long texts for ``tokenizer_json``'s tokenizer (thread-safe)."""

    def __init__(self, tokenizer_json: str, *, min_chars: int):
        self.min_chars = min_chars  # texts shorter than this in all are tokenized by the caller (IPC costs more)
        self._json = tokenizer_json
        self._proc: subprocess.Popen[bytes] | None = None
        self._starting = False
        self._busy = threading.Lock()
        self._state = threading.Lock()
        self.served = 0  # batches the child tokenized (tests, benchmarks)

    def encode_batch(self, texts: Sequence[str]) -> list[array[int]] | None:
        """Each text's ids as an int32 array, tokenized by the child; None: tokenize them yourself."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            self.start_soon()
            return None
        if not self._busy.acquire(blocking=False):
            return None
        try:
            out = self._ask(proc, texts)
        except (OSError, ValueError, TimeoutError) as exc:
            log.warning("the tokenizing child failed (%s); tokenizing in the gateway, a new child comes next", exc)
            self._stop(proc)
            return None
        finally:
            self._busy.release()
        if out is not None:
            self.served += 1
        return out

    def _ask(self, proc: subprocess.Popen[bytes], texts: Sequence[str]) -> list[array[int]] | None:
        assert proc.stdin is not None and proc.stdout is not None
        parts = [_U32.pack(len(texts))]
        for text in texts:
            data = text.encode("utf-8", "surrogatepass")
            parts += [_U32.pack(len(data)), data]
        proc.stdin.write(b"".join(parts))
        proc.stdin.flush()
        deadline = time.monotonic() + TIMEOUT_S
        fd = proc.stdout.fileno()
        (count,) = _U32.unpack(_read_exact(fd, 4, deadline))
        if count == ERROR:
            return None
        if count != len(texts):
            raise ValueError(f"answered {count} texts for {len(texts)}")
        out = []
        for _ in texts:
            (n,) = _U32.unpack(_read_exact(fd, 4, deadline))
            ids = array("i")
            ids.frombytes(_read_exact(fd, 4 * n, deadline))
            out.append(ids)
        return out

    def start_soon(self) -> None:
        """Start the child in the background (a no-op while one is starting)."""
        with self._state:
            if self._starting:
                return
            self._starting = True
        threading.Thread(target=self._start, name="polar-tokenizer-child-start", daemon=True).start()

    def _start(self) -> None:
        proc: subprocess.Popen[bytes] | None = None
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "polar.tokens.offload"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                cwd=Path(__file__).resolve().parents[2],
            )
            assert proc.stdin is not None and proc.stdout is not None
            data = self._json.encode()
            proc.stdin.write(_U32.pack(len(data)) + data)
            proc.stdin.flush()
            if _read_exact(proc.stdout.fileno(), 1, time.monotonic() + TIMEOUT_S) != b"R":
                raise ValueError("no ready byte")
        except (OSError, ValueError, TimeoutError) as exc:
            log.warning("could not start the tokenizing child: %s", exc)
            if proc is not None:
                _end(proc)
            with self._state:
                self._starting = False
            return
        with self._state:
            old, self._proc, self._starting = self._proc, proc, False
        if old is not None:
            self._stop(old)

    def _stop(self, proc: subprocess.Popen[bytes]) -> None:
        with self._state:
            if self._proc is proc:
                self._proc = None
        _end(proc)

    def close(self) -> None:
        proc = self._proc
        if proc is not None:
            self._stop(proc)


def _end(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()


def _read_exact(fd: int, n: int, deadline: float) -> bytes:
    """``n`` bytes from pipe ``fd`` by ``deadline`` (the interpreter lock is released while waiting)."""
    chunks: list[bytes] = []
    got = 0
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError(f"no answer within {TIMEOUT_S:g} s")
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise ValueError("the child closed its pipe")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _serve() -> None:
    """The child: build the tokenizer from the JSON its parent sends, then answer requests until stdin closes."""
    from polar.tokens.tokenizer import ChatTokenizer

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer

    def read(n: int) -> bytes:
        data = stdin.read(n)
        if len(data) < n:
            raise SystemExit(0)  # the parent is gone
        return data

    (size,) = _U32.unpack(read(4))
    tokenizer = ChatTokenizer(Tokenizer.from_str(read(size).decode()), "child", Path("."))
    stdout.write(b"R")
    stdout.flush()
    while True:
        (count,) = _U32.unpack(read(4))
        texts = [read(_U32.unpack(read(4))[0]).decode("utf-8", "surrogatepass") for _ in range(count)]
        try:
            batches = tokenizer.encode_batch(texts)
        except Exception:  # noqa: BLE001 -- the parent's own attempt raises it, where it is handled
            stdout.write(_U32.pack(ERROR))
            stdout.flush()
            continue
        parts = [_U32.pack(count)]
        for ids in batches:
            packed = array("i", ids).tobytes()
            parts += [_U32.pack(len(packed) // 4), packed]
        stdout.write(b"".join(parts))
        stdout.flush()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _serve()
