"""Listing and deleting the objects of a local store, never through a symbolic link.

Invariants:

* a listing reports the regular files below a prefix, each with the metadata a HEAD of
  it reports; it neither reports a link nor descends into one, and skips staging files
  and names that are not UTF-8 (no object path names them);
* a delete unlinks each path's final name in its parent (a link is unlinked as a link,
  a path through one deletes nothing); removing a prefix removes links as links, never
  descending; every walk is :func:`cairn.stores._localfs.open_dirs`'s, relative to
  directory descriptors, so nothing outside the root is touched;
* the directories a delete empties are removed too, up to (never including) the root,
  as an object store keeps no empty folders;
* :func:`remove_staging` removes the staging files below a prefix (what a write killed
  mid-way leaves, which no listing shows) and nothing else, never through a link.
"""

from __future__ import annotations

import itertools
import os
import shutil
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

from cairn.stores._localfs import open_dir, open_dirs
from cairn.stores._localnames import is_staging, is_utf8, object_info, object_parts, path_parts
from cairn.stores._translate import translate_error
from cairn.stores._types import ListDirResult, ObjectInfo

__all__ = ["delete_objects", "list_level", "list_tree", "remove_staging", "remove_tree"]

# -- listings --------------------------------------------------------------------------------


def _entries(dir_fd: int, key: str) -> Iterator[tuple[str, str, os.DirEntry[str]]]:
    """(name, object path, entry) of each real file or directory in ``dir_fd``: links,
    staging files and names that are not UTF-8 are skipped."""
    with os.scandir(dir_fd) as entries:
        for entry in entries:
            name = entry.name
            if entry.is_symlink() or not is_utf8(name) or is_staging(name):
                continue
            yield name, f"{key}/{name}" if key else name, entry


def _file_info(child: str, entry: os.DirEntry[str]) -> ObjectInfo | None:
    try:
        return object_info(child, entry.stat(follow_symlinks=False))
    except FileNotFoundError:
        return None  # deleted since the scan


def _scan_tree(dir_fd: int, key: str, found: list[ObjectInfo]) -> None:
    """Append every regular file under ``dir_fd`` (whose object path is ``key``)."""
    subdirs: list[tuple[str, str]] = []
    for name, child, entry in _entries(dir_fd, key):
        if entry.is_dir(follow_symlinks=False):
            subdirs.append((name, child))
        elif entry.is_file(follow_symlinks=False) and (info := _file_info(child, entry)):
            found.append(info)
    for name, child in subdirs:
        fd = open_dir(dir_fd, name)
        if fd is None:
            continue  # deleted, or replaced by a link, since the scan
        try:
            _scan_tree(fd, child, found)
        finally:
            os.close(fd)


def list_tree(root: Path, prefix: str) -> list[ObjectInfo]:
    parts = path_parts("list", prefix)
    found: list[ObjectInfo] = []
    with open_dirs(root, parts) as dirs:
        if dirs.complete:
            _scan_tree(dirs.fds[-1], "/".join(parts), found)
    return found


def list_level(root: Path, prefix: str) -> ListDirResult:
    parts = path_parts("list", prefix)
    prefixes: list[str] = []
    objects: list[ObjectInfo] = []
    with open_dirs(root, parts) as dirs:
        if dirs.complete:
            for _, child, entry in _entries(dirs.fds[-1], "/".join(parts)):
                if entry.is_dir(follow_symlinks=False):
                    prefixes.append(child + "/")
                elif entry.is_file(follow_symlinks=False) and (info := _file_info(child, entry)):
                    objects.append(info)
    objects.sort(key=lambda info: info.path)
    return ListDirResult(prefixes=sorted(prefixes), objects=objects)


# -- deletes ---------------------------------------------------------------------------------


def _remove_emptied_dirs(dirs: Sequence[str], fds: Sequence[int]) -> None:
    """Remove directory ``dirs[-1]``, then each one above it, for as long as they are empty.

    ``dirs`` are the directories from just below the root down to the one a delete
    emptied; ``fds[i]`` is the descriptor of the directory that holds ``dirs[i]`` (so
    ``fds[0]`` is the root's, which is never removed). ``rmdir`` of a name in its
    parent's descriptor removes only an empty directory, never follows a link (a link
    swapped in is ENOTDIR), and never reaches above the root. One that is not empty
    (another object, or a put that just made it: its staging file is in it before its
    name is) stops the walk; one already gone (another cleanup) does not: its parent may
    be empty now.

    The parent is not fsynced after an ``rmdir``, as it is not after the unlinks that
    emptied the directory: no guarantee of cairn rests on a delete surviving a power cut.
    One that did not survive leaves what was there before: the files (which the next GC
    deletes again) or an empty directory, which holds no object.
    """
    for depth in range(len(dirs), 0, -1):
        try:
            os.rmdir(dirs[depth - 1], dir_fd=fds[depth - 1])
        except FileNotFoundError:
            continue
        except OSError:
            return  # ENOTEMPTY (or EEXIST), or not ours to remove: what is above stays too


def delete_objects(root: Path, paths: Sequence[str]) -> None:
    """Unlink each path's final name in its parent (a link is unlinked, not followed),
    then remove the directories that emptied, up to (never including) the root: without
    this each deleted checkpoint would leave its folders, for every later listing to walk.
    """
    split = sorted((object_parts("delete", path), path) for path in paths)
    for parent, group in itertools.groupby(split, key=lambda item: item[0][:-1]):
        with open_dirs(root, parent) as dirs:
            if not dirs.complete:
                continue  # a parent is missing or a link: no such object here
            removed = False
            for parts, path in group:
                try:
                    os.unlink(parts[-1], dir_fd=dirs.fds[-1])
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    raise translate_error("delete", path, exc) from exc
                removed = True
            if removed:
                _remove_emptied_dirs(parent, dirs.fds)


def remove_tree(root: Path, prefix: str) -> None:
    """Remove directory ``prefix`` and all in it; a link there is removed as a link. Then
    remove the directories above it that this emptied, up to (never including) the root."""
    parts = path_parts("delete", prefix)
    with open_dirs(root, parts[:-1]) as dirs:
        if not dirs.complete:
            return  # a parent is missing or a link: nothing of ours under the prefix
        name, parent_fd = parts[-1], dirs.fds[-1]
        try:
            mode = os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mode
            if stat.S_ISLNK(mode):
                os.unlink(name, dir_fd=parent_fd)
            elif stat.S_ISDIR(mode):
                # With dir_fd, rmtree opens each level relative to its parent and refuses
                # (rather than follows) a link, also one swapped in while it runs.
                shutil.rmtree(name, dir_fd=parent_fd)
            else:
                return
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise translate_error("delete", prefix, exc) from exc
        _remove_emptied_dirs(parts[:-1], dirs.fds)


def _remove_staging_below(dir_fd: int, key: str, removed: list[str]) -> bool:
    """Unlink the staging files in ``dir_fd`` and below (whose object path is ``key``),
    appending each one's path to ``removed``, and remove the subdirectories that this
    empties; whether ``dir_fd`` itself is empty now."""
    with os.scandir(dir_fd) as scanned:
        entries = list(scanned)
    left = len(entries)
    for entry in entries:
        name = entry.name
        child = f"{key}/{name}" if key else name
        if entry.is_symlink():
            continue
        if entry.is_dir(follow_symlinks=False):
            fd = open_dir(dir_fd, name)
            if fd is None:
                continue  # gone, or replaced by a link, since the scan
            try:
                emptied = _remove_staging_below(fd, child, removed)
            finally:
                os.close(fd)
            if emptied and _rmdir(name, dir_fd):
                left -= 1
        elif is_staging(name) and entry.is_file(follow_symlinks=False):
            try:
                os.unlink(name, dir_fd=dir_fd)
            except FileNotFoundError:
                pass  # renamed onto its object, or removed by another sweep, meanwhile
            else:
                removed.append(child)
            left -= 1
    return left == 0


def _rmdir(name: str, dir_fd: int) -> bool:
    """Remove empty directory ``name``; False if it is not empty (a put made something
    there meanwhile) or not ours to remove."""
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def remove_staging(root: Path, prefix: str) -> list[str]:
    """Remove every staging file (``{name}#{n}``) below directory ``prefix``, and the
    directories that this empties, up to (never including) the root.

    A staging file is what a write killed mid-way leaves; it is also the file of a write
    in progress, which then fails: the caller removes them only where no write can still
    matter (a directory garbage collection has claimed). Links are neither followed nor
    removed.

    Returns:
        The path of each staging file removed, as an object path would name it.
    """
    parts = path_parts("delete", prefix)
    removed: list[str] = []
    with open_dirs(root, parts) as dirs:
        if not dirs.complete or not parts:
            return removed  # missing, or a link: nothing of ours below it
        try:
            emptied = _remove_staging_below(dirs.fds[-1], "/".join(parts), removed)
        except OSError as exc:
            raise translate_error("delete", prefix, exc) from exc
        if emptied:
            _remove_emptied_dirs(parts, dirs.fds[:-1])
    return removed
