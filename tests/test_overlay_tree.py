"""A sandbox's files read from the engine's storage (`overlay_tree`) are the engine's own answer:
on this machine's local overlay2 engine a tree the agent changed (files written, removed,
folders removed and made again, replaced by links, big files, odd names) reads the same from
the upper folder over the image's tree as through the engine's archive; a tree the image has
nothing under reads from the upper folder alone; where the upper folder cannot say (a start
tree read after the container changed it), the engine is asked."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import pytest

from conftest import BASE_IMAGE
from pytest_hemra.execute.sandbox import (
    MAX_TREE_FILE_BYTES,
    ROOT_USER,
    Limits,
    SandboxRequest,
    Tree,
)
from pytest_hemra.execute.sandbox.docker import DockerProvider
from pytest_hemra.execute.sandbox.files import files_archive
from pytest_hemra.execute.sandbox.overlay import (
    overlay_put_mounted,
    overlay_tree,
    overlay_untouched,
)

docker = pytest.mark.usefixtures("docker_test")

CHANGES = f"""set -e
echo changed > /etc/hostname.new && mv /etc/hostname.new /etc/debian_version
echo more >> /etc/skel/.bashrc && rm /etc/skel/.profile
rm /etc/issue.net
rm -rf /etc/apt && mkdir -p /etc/apt/sources.list.d && echo new > /etc/apt/only.txt
rm -rf /etc/security && ln -s /tmp /etc/security
mkdir -p /etc/new/deep && printf 'a\\nb' > "/etc/new/deep/odd\nname"
head -c {MAX_TREE_FILE_BYTES + 10} /dev/zero > /etc/big.bin
rm -rf /etc/cron.daily && echo file > /etc/cron.daily
mkdir -p /made/here && echo one > /made/here/one.txt && echo two > /made/two.txt
mkdir -p /gone/x && rm -rf /gone
"""


def _run(sandbox: Any, script: str, log: Path) -> None:
    result = sandbox.exec(
        ["sh", "-c", script],
        user=ROOT_USER,
        env={},
        timeout=30,
        stdout=log,
        stderr=log,
        workdir="/",
    )
    assert result.exit_code == 0, log.read_text()


def _engine(sandbox: Any, path: str, monkeypatch: pytest.MonkeyPatch) -> Tree:
    """The same read through the engine's archive alone."""
    with monkeypatch.context() as patch:
        patch.setattr("pytest_hemra.execute.sandbox.storage.has_native_diff", lambda _: False)
        return sandbox.read_tree(path)


@docker
def test_a_changed_tree_read_from_storage_is_the_engines_answer(
    tmp_path: Path, docker_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = DockerProvider(docker_client)
    request = SandboxRequest(BASE_IMAGE, Limits(pids=256), network=False, labels={"hemra": "1"})
    with provider.open(request) as sandbox:
        attrs = sandbox.container.attrs
        assert overlay_untouched(attrs, True, "/etc"), "a fresh container changed /etc"
        since = sandbox.read_start_tree("/etc")
        assert since.as_image and "debian_version" in since
        _run(sandbox, CHANGES, tmp_path / "log.txt")
        assert not overlay_untouched(attrs, True, "/etc")

        read = overlay_tree(attrs, True, "/etc", since)
        assert read is not None, "this machine's engine is local overlay2: read from its storage"
        engine = _engine(sandbox, "/etc", monkeypatch)
        assert dict(read) == dict(engine)
        assert read.skipped == engine.skipped == {"big.bin": MAX_TREE_FILE_BYTES + 10}
        assert read.size == engine.size and read.stopped is None
        assert read["debian_version"] == b"changed\n" and "new/deep/odd\nname" in read
        assert "issue.net" not in read and "apt/only.txt" in read and "apt/sources.list" not in read
        assert not any(name.startswith("security/") for name in read)
        assert read["cron.daily"] == b"file\n"
        assert read["skel/.bashrc"].endswith(b"more\n") and "skel/.bash_logout" in read
        assert "skel/.profile" not in read
        assert dict(sandbox.read_tree("/etc", since=since)) == dict(engine)

        made = overlay_tree(attrs, True, "/made", None)  # nothing of the image's there
        assert made is not None and dict(made) == {"here/one.txt": b"one\n", "two.txt": b"two\n"}
        assert dict(made) == dict(_engine(sandbox, "/made", monkeypatch))
        assert overlay_tree(attrs, True, "/gone", None) == {}
        assert overlay_tree(attrs, True, "/etc/security", since) is None  # a link: the engine's

        _run(sandbox, "rm -rf /etc/new /usr/share/doc", tmp_path / "log.txt")
        assert overlay_tree(attrs, True, "/usr/share", None) is None  # the image's files under it
        stale = Tree()  # a start tree read after the container changed its path
        assert overlay_tree(attrs, True, "/etc", stale) is None
        again = overlay_tree(attrs, True, "/etc", since)
        assert again is not None and dict(again) == dict(_engine(sandbox, "/etc", monkeypatch))
        assert not any(name.startswith("new/") for name in again)

        sandbox.halt()  # stopped: read from storage as well, the same answer
        halted = sandbox.read_tree("/made")
        assert dict(halted) == dict(made)


@docker
def test_storage_is_not_read_where_the_engine_is_not_local_overlay2(
    docker_client: Any,
) -> None:
    provider = DockerProvider(docker_client)
    request = SandboxRequest(BASE_IMAGE, Limits(pids=256), network=False, labels={"hemra": "1"})
    with provider.open(request) as sandbox:
        attrs = sandbox.container.attrs
        assert overlay_tree(attrs, False, "/tmp", None) is None  # no native diff
        elsewhere = {**attrs, "GraphDriver": {**attrs["GraphDriver"], "Name": "vfs"}}
        assert overlay_tree(elsewhere, True, "/tmp", None) is None
        data = {**attrs["GraphDriver"]["Data"], "UpperDir": "/nonexistent/upper"}
        remote = {**attrs, "GraphDriver": {**attrs["GraphDriver"], "Data": data}}
        assert overlay_tree(remote, True, "/tmp", None) is None  # another machine's folders
        assert not overlay_untouched(remote, True, "/tmp")


def _owned_archive(name: str, content: bytes, uid: int, mode: int) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.uid, info.gid = len(content), mode, uid, uid
        archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


@docker
def test_files_put_through_storage_are_the_engines_put_running_or_halted(
    tmp_path: Path, docker_client: Any
) -> None:
    """`put_local` writes HEMRA's archive into a running sandbox through its root as the engine
    mounted it on this host (seen at once inside, owners and modes kept, as the engine's own
    put would) and into a halted one's upper folder (seen once it starts again); a name that
    already exists there, or a root that is not mounted in this runner's view, is left to the
    engine (False), and nothing is written."""
    provider = DockerProvider(docker_client)
    request = SandboxRequest(BASE_IMAGE, Limits(pids=256), network=False, labels={"hemra": "1"})
    owned = _owned_archive(".staged/one.txt", b"one\n", 1234, 0o600)
    with provider.open(request) as sandbox:
        assert sandbox.put_local(owned)
        log = tmp_path / "log.txt"
        _run(
            sandbox,
            "stat -c '%u:%g %a' /.staged/one.txt > /seen && cat /.staged/one.txt >> /seen",
            log,
        )
        assert sandbox.read_tree("/seen")["seen"] == b"1234:1234 600\none\n"
        assert not sandbox.put_local(files_archive({"/.staged/two.txt": b"two\n"}))  # exists
        assert "two.txt" not in sandbox.read_tree("/.staged")

        attrs = sandbox.container.attrs
        unmounted = tmp_path / "merged"  # a folder, as another mount namespace shows it
        unmounted.mkdir()
        data = {**attrs["GraphDriver"]["Data"], "MergedDir": str(unmounted)}
        remote = {**attrs, "GraphDriver": {**attrs["GraphDriver"], "Data": data}}
        assert not overlay_put_mounted(remote, files_archive({"/.other/x": b"x"}))
        assert not any(unmounted.iterdir())

        sandbox.halt()
        assert sandbox.put_local(files_archive({"/.later/two.txt": b"two\n"}))
        sandbox.empty()
        _run(sandbox, "cat /.later/two.txt > /seen", log)
        assert sandbox.read_tree("/seen")["seen"] == b"two\n"
