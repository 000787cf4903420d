"""Images across engines: the bases a Dockerfile builds from, what a failed build last said, an
image copied from the runner's engine to another one (`docker save` streamed into `docker load`),
and a lock per engine and image on the runner, so runners preparing the same image at once do the
work once.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pytest_hemra.core.errors import InfraError
from pytest_hemra.core.filelock import file_lock

LOCK_POLL_SECS = 0.1
TAIL_LINES = 3
TAIL_LINE_CHARS = 200
COLOURS = re.compile(r"\x1b\[[0-9;]*m")
# the classic builder's own bookkeeping between a build's steps, which says nothing of a failure
BOOKKEEPING = re.compile(r"^(---> |Removing intermediate container )")


def base_images(dockerfile: str) -> list[str]:
    """The images a Dockerfile builds FROM, in order and once each; earlier stages, `scratch`
    and references with an unexpanded ARG are left out."""
    stages: set[str] = set()
    found: list[str] = []
    for line in re.sub(r"\\\r?\n", " ", dockerfile).splitlines():
        words = line.split()
        if not words or words[0].upper() != "FROM":
            continue
        args = [word for word in words[1:] if not word.startswith("--")]
        if not args:
            continue
        image = args[0]
        if image.lower() not in stages and image != "scratch" and "$" not in image:
            found.append(image)
        if len(args) >= 3 and args[1].upper() == "AS":
            stages.add(args[2].lower())
    return list(dict.fromkeys(found))


def build_tail(log: Iterable[Mapping[str, Any]]) -> str:
    """The last lines a failed build printed (its steps and their output, Docker's bookkeeping
    and colours left out), joined by ` | `: what says why it failed, for a one-line error."""
    text = COLOURS.sub("", "".join(str(entry.get("stream") or "") for entry in log))
    lines = [line.strip() for line in text.splitlines()]
    kept = [line[:TAIL_LINE_CHARS] for line in lines if line and not BOOKKEEPING.match(line)]
    return " | ".join(kept[-TAIL_LINES:])


def copy_image(source: Any, target: Any, reference: str) -> None:
    """Copy `reference` (with its tag) from the `source` engine to the `target` engine, streamed:
    what `docker save REF | docker -H TARGET load` does, without holding the image in memory."""
    try:
        stream = source.api.get_image(reference)
        for message in target.api.load_image(stream):
            if isinstance(message, dict) and message.get("error"):
                raise InfraError(f"docker load of {reference} failed: {message['error']}")
    except InfraError:
        raise
    except Exception as error:  # the docker SDK and requests raise many kinds
        raise InfraError(f"copying image {reference} to the engine failed ({error})") from error


@contextmanager
def engine_lock(engine: str, what: str, timeout: float, *, shared: bool = False) -> Iterator[None]:
    """Hold the runner host's lock on (`engine`, `what`) for up to `timeout` seconds of waiting;
    `shared`: with every other shared holder (its users), only never with an exclusive one (the
    one that removes what they use). Each call opens the lock's file anew, so the threads of one
    process exclude each other as other processes do."""
    folder = Path(tempfile.gettempdir()) / "hemra-locks"
    folder.mkdir(mode=0o700, exist_ok=True)
    name = hashlib.sha256(f"{engine}\0{what}".encode()).hexdigest()[:32]
    waited = f"engine {engine}: waited {timeout:g}s for another runner preparing {what}"
    with file_lock(folder / f"{name}.lock", timeout, waited, shared=shared, poll=LOCK_POLL_SECS):
        yield
