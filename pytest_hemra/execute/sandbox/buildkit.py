"""Dockerfiles that need BuildKit: the lines that use syntax the classic builder lacks, what the
engine's own BuildKit builds, and a build through it.

The Docker SDK builds with the engine's classic builder, which refuses `RUN --mount`,
`COPY --chmod` and heredocs. The Engine API builds with the engine's BuildKit when asked
(`version=2`) from the same tar context, with nothing to install: no buildx, no buildkitd,
nothing pulled. What it parses is the engine's built-in Dockerfile frontend: `RUN --mount`,
`--network`, `--security` and `COPY --chmod` from Docker 20.10 (Dockerfile 1.2: before it they
needed a pulled frontend); heredocs and `COPY --link` (Dockerfile 1.4) from Docker Engine 23.
A `# syntax=` directive asks BuildKit to pull a frontend image, and HEMRA pulls nothing: it is
refused on every engine. A task image needing none of this is built by the classic builder.
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker.utils

from pytest_hemra.core.errors import InfraError

BUILDKIT_API = (1, 41)  # Docker 20.10's: its BuildKit's own frontend parses --mount, --chmod
DOCKERFILE_1_4_ENGINE = 23  # the first Docker Engine whose built-in frontend parses heredocs
TAIL_LINES = 3
TAIL_LINE_CHARS = 200
DIRECTIVE = re.compile(r"#\s*([A-Za-z_]+)\s*=\s*(.*?)\s*")
HEREDOC = re.compile(r"(?<!<)<<(?!<)(-?)\s*([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")
COLOURS = re.compile(r"\x1b\[[0-9;]*m")


class Builder(enum.IntEnum):
    """What builds a Dockerfile, each level building all the ones below it."""

    CLASSIC = 0  # the engine's classic builder (the Docker SDK's build)
    BUILDKIT = 1  # the engine's BuildKit with a Dockerfile 1.2 frontend (Docker 20.10-22.x)
    DOCKERFILE_1_4 = 2  # the engine's BuildKit with a Dockerfile 1.4 frontend (Docker 23+)
    PULLED_FRONTEND = 3  # a frontend image BuildKit would pull: nothing HEMRA builds


# flags of an instruction that only BuildKit parses, and the builder each needs
FLAGS: Mapping[str, Mapping[str, tuple[str, Builder]]] = {
    "RUN": {
        "mount": ("a build mount", Builder.BUILDKIT),
        "network": ("a build network", Builder.BUILDKIT),
        "security": ("a build security mode", Builder.BUILDKIT),
    },
    "COPY": {
        "chmod": ("a file mode", Builder.BUILDKIT),
        "link": ("a linked copy", Builder.DOCKERFILE_1_4),
    },
    "ADD": {
        "chmod": ("a file mode", Builder.BUILDKIT),
        "link": ("a linked copy", Builder.DOCKERFILE_1_4),
    },
}


@dataclass(frozen=True)
class BuildKitLine:
    """A Dockerfile line the classic builder cannot build: where, what and what builds it."""

    line: int  # 1-based, where its instruction starts
    text: str  # the instruction and the syntax in question: `RUN <<EOF`, `RUN --mount=...`
    what: str  # `a heredoc`, `a build mount`...
    needs: Builder


def buildkit_lines(dockerfile: str) -> list[BuildKitLine]:
    """Every line of a Dockerfile using syntax the classic builder lacks, in order: a
    `# syntax=` parser directive, heredocs in RUN, COPY and ADD, and BuildKit's flags."""
    lines = dockerfile.splitlines()
    found: list[BuildKitLine] = []
    escape = "\\"
    index = 0
    for index, raw in enumerate(lines):  # parser directives: `# key=value` lines at the top
        directive = DIRECTIVE.fullmatch(raw.strip())
        if directive is None:
            break
        key, value = directive.group(1).lower(), directive.group(2)
        if key == "syntax":
            text = f"# syntax={value}"
            found.append(BuildKitLine(index + 1, text, "a frontend image", Builder.PULLED_FRONTEND))
        elif key == "escape" and value in ("`", "\\"):
            escape = value
    else:
        index = len(lines)
    while index < len(lines):
        start = index
        stripped = lines[index].strip()
        index += 1
        if not stripped or stripped.startswith("#"):
            continue
        parts = [stripped]
        while parts[-1].endswith(escape) and index < len(lines):
            parts[-1] = parts[-1][: -len(escape)]
            following = lines[index].strip()
            index += 1
            if following.startswith("#"):  # a comment inside an instruction is left out
                parts.append(escape)
                continue
            parts.append(following)
        instruction = " ".join(part for part in parts if part != escape)
        words = instruction.split()
        keyword = words[0].upper()
        if keyword not in FLAGS:
            continue
        for word in words[1:]:
            if not word.startswith("--"):
                break
            name = word[2:].split("=", 1)[0].lower()
            if name in FLAGS[keyword]:
                what, needs = FLAGS[keyword][name]
                found.append(BuildKitLine(start + 1, f"{keyword} {word}", what, needs))
        heredocs = list(HEREDOC.finditer(instruction))
        if heredocs:
            text = f"{keyword} {heredocs[0].group(0)}"
            found.append(BuildKitLine(start + 1, text, "a heredoc", Builder.DOCKERFILE_1_4))
        for heredoc in heredocs:  # its body is not Dockerfile: skip to its closing word
            strip_tabs, word = heredoc.group(1) == "-", heredoc.group(3)
            while index < len(lines):
                body = lines[index].lstrip("\t") if strip_tabs else lines[index]
                index += 1
                if body == word:
                    break
    return found


@dataclass(frozen=True)
class Engine:
    """What builds on one engine: its best builder, and its version for messages."""

    builder: Builder
    version: str  # `Docker 20.10.24+dfsg1, API 1.41`


def engine_builder(version: Mapping[str, Any]) -> Engine:
    """What the engine whose `/version` answer this is builds: the classic builder alone
    before API 1.41 (Docker 20.10) or off Linux, else BuildKit; with a Dockerfile 1.4 frontend
    from Docker Engine 23."""
    api = str(version.get("ApiVersion") or "0.0")
    number = str(version.get("Version") or "unknown")
    described = f"Docker {number}, API {api}"
    if _numbers(api) < BUILDKIT_API or str(version.get("Os") or "linux") != "linux":
        return Engine(Builder.CLASSIC, described)
    major = _numbers(number)[0] if _numbers(number) else 0
    if major >= DOCKERFILE_1_4_ENGINE:
        return Engine(Builder.DOCKERFILE_1_4, described)
    return Engine(Builder.BUILDKIT, described)


def refusal(dockerfile: Path, found: Iterable[BuildKitLine], engine: Engine) -> str | None:
    """None when the engine builds every line found, else the one-line reason for the first
    it cannot: the file, the line, the syntax and what would build it."""
    for line in found:
        if line.needs <= engine.builder:
            continue
        where = f"{dockerfile} line {line.line}: `{line.text}`"
        if line.needs is Builder.PULLED_FRONTEND:
            return (
                f"{where} names a Dockerfile frontend image for BuildKit to pull, and HEMRA"
                " builds without pulling: delete the line (the engine's own frontend then"
                " builds the file)"
            )
        if line.needs is Builder.DOCKERFILE_1_4:
            return (
                f"{where} ({line.what}) needs BuildKit with a Dockerfile 1.4 frontend, which"
                f" this engine ({engine.version}) lacks: Docker Engine {DOCKERFILE_1_4_ENGINE}"
                " or later builds it"
            )
        return (
            f"{where} ({line.what}) needs BuildKit, which this engine ({engine.version}) lacks:"
            " Docker Engine 20.10 or later builds it"
        )
    return None


def build(
    client: Any,
    context: Path,
    *,
    tag: str,
    dockerfile: str = "Dockerfile",
    labels: Mapping[str, str],
    buildargs: Mapping[str, str] | None = None,
    timeout: float,
) -> None:
    """Build `context` with the engine's BuildKit and tag the image `tag`, as the SDK's build
    does with the classic builder (the same tar context, `.dockerignore` honoured, nothing
    pulled). The SDK has no switch for BuildKit, so the request is its own `/build` call with
    `version=2`. A failure is an InfraError with BuildKit's error and the build's last lines."""
    api = client.api
    ignore = context / ".dockerignore"
    exclude = None
    if ignore.is_file():
        entries = [line.strip() for line in ignore.read_text(errors="replace").splitlines()]
        exclude = [entry for entry in entries if entry and not entry.startswith("#")]
    # gzipped: BuildKit's frontend tells an archive from a bare Dockerfile by its first bytes,
    # and an archive opening with a PAX header (Python's tarfile writes one) reads as neither
    archive = docker.utils.tar(
        str(context), exclude=exclude, dockerfile=(dockerfile, None), gzip=True
    )
    params = {
        "version": "2",
        "t": tag,
        "dockerfile": dockerfile,
        "pull": "0",
        "rm": "1",
        "forcerm": "1",
        "labels": json.dumps(dict(labels)),
        "buildargs": json.dumps(dict(buildargs or {})),
    }
    try:
        response = api._post(
            api._url("/build"),
            data=archive,
            params=params,
            headers={"Content-Type": "application/tar", "Content-Encoding": "gzip"},
            stream=True,
            timeout=timeout,
        )
        api._raise_for_status(response)
        messages = list(api._stream_helper(response, decode=True))
    finally:
        archive.close()
    errors = [str(m.get("error")) for m in messages if isinstance(m, dict) and m.get("error")]
    if errors:
        tail = build_log_tail(messages)
        raise InfraError(
            f"image build failed (BuildKit): {errors[-1]}" + (f" ({tail})" if tail else "")
        )


def build_log_tail(messages: Iterable[Any]) -> str:
    """The last lines the build's steps printed, joined by ` | `: read from BuildKit's trace
    messages (`moby.buildkit.trace`, each a base64 protobuf `StatusResponse` whose field 3
    holds the steps' logs, field 4 of each their bytes)."""
    text = ""
    for message in messages:
        if not isinstance(message, dict) or message.get("id") != "moby.buildkit.trace":
            continue
        try:
            status = base64.b64decode(str(message.get("aux") or ""), validate=True)
        except (binascii.Error, ValueError):
            continue
        for number, log in _fields(status):
            if number == 3 and isinstance(log, bytes):
                for field, chunk in _fields(log):
                    if field == 4 and isinstance(chunk, bytes):
                        text += chunk.decode(errors="replace")
    lines = [line.strip() for line in COLOURS.sub("", text).splitlines()]
    return " | ".join([line[:TAIL_LINE_CHARS] for line in lines if line][-TAIL_LINES:])


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """The (field number, value) pairs of one protobuf message, at its top level; a value is
    an int (varint) or bytes (length-delimited, fixed). Stops at anything malformed."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, kind = key >> 3, key & 7
        value: int | bytes
        if kind == 0:
            value, at = _varint(data, at)
        elif kind == 2:
            length, at = _varint(data, at)
            value, at = data[at : at + length], at + length
        elif kind in (1, 5):
            size = 8 if kind == 1 else 4
            value, at = data[at : at + size], at + size
        else:
            return
        if at > len(data):
            return
        yield number, value


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while at < len(data):
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
    return value, len(data) + 1  # cut short: past the end, which stops `_fields`


def _numbers(version: str) -> tuple[int, ...]:
    """`20.10.24+dfsg1` -> (20, 10, 24); `1.41` -> (1, 41); leading `v` allowed."""
    found = re.match(r"v?(\d+(?:\.\d+)*)", version.strip())
    return tuple(int(part) for part in found.group(1).split(".")) if found else ()
